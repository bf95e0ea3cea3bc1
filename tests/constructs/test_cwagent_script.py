"""dl_cwagent.sh run for real (bash, with a stand-in amazon-cloudwatch-agent-ctl that records its
arguments): it writes the node's configuration from node.env through the bundled runtime, starts
the agent with it, twice gives the same result, and
a missing agent that cannot be installed (the download refused on 127.0.0.1) leaves health
`degraded` and exit 0: monitoring never keeps the monitor or the job from starting."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from constructs_lib.bundle import build_bundle
from constructs_lib.runtime import contract

ROOT = Path(__file__).resolve().parents[2]


def _node(tmp_path):
    lib = tmp_path / "lib"
    build_bundle(str(lib))
    etc, run = tmp_path / "etc", tmp_path / "run"
    etc.mkdir()
    env = {"PATH": os.environ["PATH"], "DL_ETC_DIR": str(etc), "DL_RUN_DIR": str(run), "DL_LIB_DIR": str(lib),
           "DL_PYTHON": sys.executable, "DL_CLUSTER": "dl-llm", "DL_SDK": "cuda"}
    return lib, etc, run, env


def _ctl(tmp_path, rc=0):
    calls = tmp_path / "calls"
    ctl = tmp_path / "amazon-cloudwatch-agent-ctl"
    ctl.write_text(f'#!/bin/bash\necho "$*" >> {calls}\nexit {rc}\n')
    ctl.chmod(0o755)
    return ctl, calls


def test_starts_the_agent_with_the_nodes_config_and_again_the_same(tmp_path):
    lib, etc, run, env = _node(tmp_path)
    ctl, calls = _ctl(tmp_path)
    for _ in range(2):
        r = subprocess.run(["bash", str(lib / "dl_cwagent.sh")], env={**env, "DL_CWAGENT_CTL": str(ctl)},
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
    config = run / "cloudwatch-agent.json"
    assert calls.read_text().splitlines() == [f"-a fetch-config -m ec2 -s -c file:{config}"] * 2
    written = json.loads(config.read_text())
    assert written["metrics"]["namespace"] == contract.NS_NODE
    assert written["metrics"]["metrics_collected"]["nvidia_gpu"]["append_dimensions"] == {contract.DIM_JOB: "dl-llm"}
    assert (run / "health.d" / "cwagent").read_text().startswith("ok CloudWatch agent running")


def test_an_agent_that_will_not_start_is_degraded_not_fatal(tmp_path):
    lib, etc, run, env = _node(tmp_path)
    ctl, _ = _ctl(tmp_path, rc=1)
    r = subprocess.run(["bash", str(lib / "dl_cwagent.sh")], env={**env, "DL_CWAGENT_CTL": str(ctl)},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    assert (run / "health.d" / "cwagent").read_text().startswith("degraded the CloudWatch agent did not start")


def test_a_missing_agent_that_cannot_be_installed_is_degraded_not_fatal(tmp_path):
    lib, etc, run, env = _node(tmp_path)
    r = subprocess.run(["bash", str(lib / "dl_cwagent.sh")], capture_output=True, text=True, timeout=60,
                       env={**env, "DL_CWAGENT_CTL": str(tmp_path / "absent"), "DL_CWAGENT_URL_BASE": "http://127.0.0.1:9"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert (run / "health.d" / "cwagent").read_text().startswith("degraded the CloudWatch agent could not be installed")


def test_a_node_env_without_the_cluster_is_degraded_not_fatal(tmp_path):
    lib, etc, run, env = _node(tmp_path)
    ctl, calls = _ctl(tmp_path)
    env.pop("DL_CLUSTER")
    r = subprocess.run(["bash", str(lib / "dl_cwagent.sh")], env={**env, "DL_CWAGENT_CTL": str(ctl)},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and not calls.exists()
    assert "DL_CLUSTER is not set" in r.stderr + r.stdout
    assert (run / "health.d" / "cwagent").read_text().startswith("degraded could not write the agent's configuration")


def test_the_stacks_parameter_is_what_the_agent_fetches(tmp_path):
    lib, etc, run, env = _node(tmp_path)
    ctl, calls = _ctl(tmp_path)
    r = subprocess.run(["bash", str(lib / "dl_cwagent.sh")], capture_output=True, text=True, timeout=60,
                       env={**env, "DL_CWAGENT_CTL": str(ctl), "DL_CWAGENT_PARAMETER": "/dl-launcher/dl-llm/cloudwatch-agent"})
    assert r.returncode == 0
    assert calls.read_text().splitlines() == ["-a fetch-config -m ec2 -s -c ssm:/dl-launcher/dl-llm/cloudwatch-agent"]
    assert not (run / "cloudwatch-agent.json").exists()
