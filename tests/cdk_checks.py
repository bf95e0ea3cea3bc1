"""Real cdk-nag (AwsSolutions, through CDK's Validations) and real cfn-lint on synthesized templates."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import aws_cdk as cdk


def synth_with_nag(app: cdk.App) -> cdk.cx_api.CloudAssembly:
    """Synthesize with AwsSolutions checks; any unacknowledged finding fails the synth."""
    from cdk_nag import AwsSolutionsChecks

    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    try:
        return app.synth()
    except RuntimeError as e:  # cdk-nag 3 reports through CDK's policy validation
        report = Path(app.outdir) / "validation-report.json"
        detail = report.read_text() if report.exists() else str(e)
        raise AssertionError(f"cdk-nag findings:\n{_summarise(detail)}") from None


def _summarise(report: str) -> str:
    try:
        doc = json.loads(report)
    except json.JSONDecodeError:
        return report
    lines = []
    for plugin in doc.get("pluginReports", []):
        for v in plugin.get("violations", []):
            where = [c.get("constructPath") for c in v.get("violatingConstructs", [])]
            lines.append(f"{v.get('ruleName')}: {v.get('description', '')[:120]} at {where}")
    return "\n".join(lines) or report


def cfn_lint(templates: list[Path]) -> None:
    r = subprocess.run([str(Path(sys.executable).parent / "cfn-lint"), "--format", "parseable", *map(str, templates)],
                       capture_output=True, text=True)
    assert r.returncode == 0, f"cfn-lint:\n{r.stdout}{r.stderr}"
