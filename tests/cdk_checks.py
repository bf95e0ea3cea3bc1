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


def cdk_cli(*args: str, env_extra: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """The pinned CDK CLI in the repository, with no AWS credentials or configuration at all."""
    import os

    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update({"PATH": f"{root / 'node_modules' / '.bin'}:{root / '.venv' / 'bin'}:{env['PATH']}",
                "AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
                "AWS_EC2_METADATA_DISABLED": "true", **(env_extra or {})})
    return subprocess.run(["cdk", *args], cwd=root, env=env, capture_output=True, text=True, timeout=timeout)


def listify(v) -> list:
    """A policy's Action, Resource or Statement: one value or a list of them, as IAM allows."""
    return v if isinstance(v, list) else [v]


def role_statements(template: dict, role_logical_id: str) -> list[dict]:
    """Every statement of every AWS::IAM::Policy attached to this role in a synthesized template."""
    return [st for r in template["Resources"].values() if r["Type"] == "AWS::IAM::Policy"
            and {"Ref": role_logical_id} in r["Properties"]["Roles"]
            for st in listify(r["Properties"]["PolicyDocument"]["Statement"])]


def training_template(out: Path, job: str) -> dict:
    """The synthesized template of a multi-node-training stack for `job`, through app.main."""
    import app
    assert app.main({"profile": "multi-node-training", "job": job, "command": "dl-torchrun train.py", "approve_hourly": "1000"},
                    outdir=str(out)) == 0
    return json.loads((out / f"dl-{job}.template.json").read_text())


def cfn_lint(templates: list[Path]) -> None:
    r = subprocess.run([str(Path(sys.executable).parent / "cfn-lint"), "--format", "parseable", *map(str, templates)],
                       capture_output=True, text=True)
    assert r.returncode == 0, f"cfn-lint:\n{r.stdout}{r.stderr}"


CHECKOV_SKIPS = Path(__file__).with_name("checkov_skips.toml")


def checkov_binary() -> Path:
    """checkov lives in .venv-checkov (scripts/test.sh makes it): it pins an older boto3."""
    exe = Path(__file__).resolve().parents[1] / ".venv-checkov" / "bin" / "checkov"
    assert exe.exists(), "checkov is missing: run the tests with `bash scripts/test.sh`, which installs it"
    return exe


def checkov(templates: list[Path]) -> dict[str, set[str]]:
    """Real checkov on the templates; fails on any finding not explained in checkov_skips.toml.
    Returns the findings by check id (the resources that raised each)."""
    import os
    import tomllib

    skips = tomllib.loads(CHECKOV_SKIPS.read_text())
    for check, entry in skips.items():
        assert entry.get("reason"), f"{CHECKOV_SKIPS.name}: {check} needs a reason"
    env = {**os.environ, "BC_SKIP_MAPPING": "TRUE", "CHECKOV_RUN_SCA_PACKAGE_SCAN_V2": "false"}
    args = [str(checkov_binary()), "--framework", "cloudformation", "--quiet", "--compact", "--skip-download",
            "-o", "json"]
    for t in templates:
        args += ["-f", str(t)]
    r = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode in (0, 1), f"checkov failed to run:\n{r.stderr[-3000:]}"
    reports = json.loads(r.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    found: dict[str, set[str]] = {}
    for report in reports:
        for f in report.get("results", {}).get("failed_checks", []):
            found.setdefault(f["check_id"], set()).add(f"{f['resource']} in {Path(f['file_path']).name}")
    unexplained = {c: sorted(rs) for c, rs in found.items() if c not in skips}
    assert not unexplained, "checkov findings without a reason in tests/checkov_skips.toml:\n" + "\n".join(
        f"{c}: {', '.join(rs[:5])}" for c, rs in sorted(unexplained.items()))
    return found
