"""The public API type-checks as a user's checker sees it (issue 26): pyright, pinned in
package.json, over pyproject's [tool.pyright] include list (what constructs_lib exports, the
selector's entry points, the Checkpointer, and the two example apps written against them)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYRIGHT = ROOT / "node_modules" / ".bin" / "pyright"


def test_the_public_api_type_checks_clean():
    out = subprocess.run([str(PYRIGHT), "--outputjson", "--pythonpath", sys.executable], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    report = json.loads(out.stdout)
    errors = [f"{d['file'].replace(str(ROOT) + '/', '')}:{d['range']['start']['line'] + 1}: {d['message']}"
              for d in report["generalDiagnostics"] if d["severity"] == "error"]
    assert not errors, "\n".join(errors)
    # The include list is what was checked: an empty run would pass vacuously.
    assert report["summary"]["filesAnalyzed"] >= 25, report["summary"]


def test_exported_names_are_visible_to_a_type_checker(tmp_path):
    """A user's file that uses the lazily loaded names: pyright resolves each to its class, so
    IDEs complete them and a wrong keyword is an error before any synth."""
    good = tmp_path / "good.py"
    good.write_text("import aws_cdk.aws_ec2 as ec2\nfrom constructs_lib import GpuLaunchTemplate, InstanceOption\n"
                    "reveal_type(GpuLaunchTemplate)\nInstanceOption(ec2.InstanceType('p5.48xlarge'), 40.0)\n")
    bad = tmp_path / "bad.py"
    bad.write_text("from constructs_lib import InstanceOption\nInstanceOption(instance_typ='p5.48xlarge')\n")
    out = subprocess.run([str(PYRIGHT), "--outputjson", "--pythonpath", sys.executable, str(good), str(bad)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    diags = json.loads(out.stdout)["generalDiagnostics"]
    revealed = [d["message"] for d in diags if d["file"] == str(good) and d["severity"] == "information"]
    assert any("type[GpuLaunchTemplate]" in m for m in revealed), diags
    assert not [d for d in diags if d["file"] == str(good) and d["severity"] == "error"], diags
    assert any("instance_typ" in d["message"] for d in diags if d["file"] == str(bad) and d["severity"] == "error"), diags
