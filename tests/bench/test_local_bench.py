"""The whole loop through the real CDK CLI into moto_server: plan, deploy, each instance's own user
data run here, collect, report, destroy (scripts/local_bench.py, as docs/measured-selection.md shows it)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_plan_deploy_run_collect_report_destroy():
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["PATH"] = f"{ROOT / '.venv' / 'bin'}:{ROOT / 'node_modules' / '.bin'}:{env['PATH']}"
    r = subprocess.run([sys.executable, "scripts/local_bench.py"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600, check=False)
    out = r.stdout
    assert r.returncode == 0, out[-4000:] + r.stderr[-2000:]
    assert "3 instance(s) launched by the stack" in out
    assert out.count("user data begins: shutdown -h +20 'dl-launcher: benchmark time limit'") == 3
    # each booted node: the backstop first, the runner fetched from the asset the CDK CLI published, power off last
    assert out.count("node called: shutdown -h +20 dl-launcher: benchmark time limit") == 2
    assert out.count("node called: aws s3 cp --only-show-errors --region us-east-1 s3://cdk-local-staging-") == 2
    assert out.count("user data exit 0") == 2
    collected = out[out.index("collected 3 candidate(s)"):]
    assert collected.count("samples/s (median of 3") == 2
    # the candidate the script leaves unbooted (the plan's last: which one follows the ranking)
    skipped = re.search(r"\((\S+) left unbooted: no spot capacity\)", out).group(1)
    assert re.search(rf"{re.escape(skipped)} +FAILED: never reported in", collected), collected
    assert "winner: " in out and "chart: " in out
    assert f"measurement failed for {skipped}: never reported in" in out
    assert "modelled figures scaled by" in out
    assert "before cdk destroy: ['running', 'terminated', 'terminated']" in out  # the unbooted one still runs
    assert "after cdk destroy: instances not terminated: 0" in out
    assert "results bucket kept: " in out and "resultsbucket" in out
