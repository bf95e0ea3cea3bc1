"""dl-launcher launch: the plan and the question before cdk deploy; a "no" runs nothing; --yes runs
the pinned CDK CLI with the approval the plan showed, which the real app accepts (against a local
moto_server that was never bootstrapped, so the deploy stops at CDK's bootstrap check)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dl_launcher.cli import main
from dl_selector.catalog import load_catalog
from dl_selector.recommend import recommend

ROOT = Path(__file__).resolve().parents[2]
ARGS = ["launch", "-c", "profile=multi-node-training", "-c", "job=big", "-c", "command=dl-torchrun train.py"]


@pytest.fixture
def terminal(monkeypatch):
    """A terminal that answers the question with what the test puts in `answers`; cdk recorded, not run."""
    answers, ran, asked = [], [], []
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    monkeypatch.setattr("builtins.input", lambda prompt: (asked.append(prompt), answers.pop(0))[1])
    monkeypatch.setattr(subprocess, "call", lambda command, cwd=None: (ran.append((command, cwd)), 0)[1])
    return answers, ran, asked


def _figure(out: str) -> str:
    return re.search(r"approval: needed \(worst case above the \$10\.00/h threshold\): -c approve_hourly=([0-9.]+)",
                     out)[1]


def test_a_no_at_the_question_runs_nothing(terminal, capsys, tmp_path, monkeypatch):
    answers, ran, asked = terminal
    answers.append("n")
    monkeypatch.chdir(ROOT)
    assert main(ARGS) == 1
    out = capsys.readouterr().out
    pick = recommend("multi-node-training", spot=True).pick.instance_type  # the profile launches on spot
    assert out.startswith(f"plan for job big: 2 x {pick}")
    on_demand = load_catalog().get(pick).price("us-east-1").on_demand
    assert 2 * on_demand <= float(_figure(out)) < 2 * on_demand + 1, "every node at the spot max price, plus cents"
    assert re.search(r"\n  expected: \$[0-9,.]+/h \(\$[0-9,.]+/day\)\n  worst case: \$[0-9,.]+/h", out), out
    assert asked and asked[0].startswith(f"deploy 2 x {pick}, spot, in us-east-1 at up to $")
    assert "not deployed: nothing was created" in out
    assert ran == [], "cdk never ran"


def test_a_yes_runs_the_pinned_cdk_deploy_with_the_approval_shown(terminal, capsys, monkeypatch):
    answers, ran, _ = terminal
    answers.append("y")
    monkeypatch.chdir(ROOT / "docs")  # the app's directory is found above
    assert main(ARGS) == 0
    out = capsys.readouterr().out
    ((command, cwd),) = ran
    assert command[0] == str(ROOT / "node_modules" / ".bin" / "cdk") and cwd == ROOT
    assert command[1:] == ["deploy", "-c", "profile=multi-node-training", "-c", "job=big", "-c",
                           "command=dl-torchrun train.py", "-c", "region=us-east-1", "-c",
                           f"approve_hourly={_figure(out)}"]


def test_without_a_terminal_it_needs_yes(capsys, monkeypatch):
    monkeypatch.setattr(sys.stdin, "isatty", lambda: False)
    assert main(ARGS) == 2
    assert capsys.readouterr().err == "error: launch asks before it deploys: pass --yes when not at a terminal\n"


@pytest.mark.parametrize("extra,expected", [
    (["-c", "approve_hourly=10"], "context approve_hourly=10 is below this stack's worst case"),
    (["-c", "nodes=0"], "error: context nodes=0: allowed 1 to 64; closest: 1"),
    (["-c", "profile"], "error: -c 'profile': expected KEY=VALUE"),
    (["-c", "portfolio=platform"], "error: launch deploys a training stack"),
])
def test_bad_input_is_one_line_before_any_question(extra, expected, terminal, capsys, monkeypatch):
    _, ran, asked = terminal
    monkeypatch.chdir(ROOT)
    assert main([*ARGS, *extra]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and expected in err, err
    assert not asked and not ran


def test_yes_through_the_real_cdk_cli_gets_past_the_approval(tmp_path):
    """The app the CDK CLI runs accepts the approval launch passed (its summary says so); the deploy
    then stops where a real first deploy into an account without `cdk bootstrap` stops, and
    nothing exists in the (moto) account afterwards."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        endpoint = f"http://localhost:{server.get_host_and_port()[1]}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update({"AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local", "AWS_REGION": "us-east-1",
                    "AWS_ENDPOINT_URL": endpoint, "AWS_CONFIG_FILE": "/dev/null", "AWS_EC2_METADATA_DISABLED": "true",
                    "AWS_SHARED_CREDENTIALS_FILE": "/dev/null", "PATH": f"{ROOT / '.venv' / 'bin'}:{env['PATH']}"})
        r = subprocess.run([sys.executable, "-m", "dl_launcher", *ARGS, "--yes", "-c", "preflight=false"], cwd=ROOT,
                           env=env, capture_output=True, text=True, timeout=600)
        figure = _figure(r.stdout)
        assert "--require-approval never" in r.stdout and f"-c approve_hourly={figure}" in r.stdout
        assert f"approval: worst case ${float(figure):,.2f}/h approved up to ${float(figure):,.2f}/h" in r.stderr, \
            r.stderr[-3000:]
        assert r.returncode != 0 and "Has the environment been bootstrapped?" in r.stderr, r.stderr[-3000:]
        cfn = boto3.client("cloudformation", endpoint_url=endpoint, region_name="us-east-1",
                           aws_access_key_id="local", aws_secret_access_key="local")
        assert cfn.list_stacks()["StackSummaries"] == []
    finally:
        server.stop()
