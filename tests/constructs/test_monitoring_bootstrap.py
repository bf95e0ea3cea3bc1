"""NodeBootstrap.enable_monitoring as the node reads it: node.env names the job the monitor and
the agent's configuration use (the same DL_CLUSTER as the job unit: one cluster per node, a
second one is refused) and the GPUs the monitor expects (the catalog's count: p5.48xlarge has
8 NVIDIA H100 GPUs, https://aws.amazon.com/ec2/instance-types/p5/; trn1.32xlarge has Trainium
chips, no NVIDIA GPU, https://aws.amazon.com/ec2/instance-types/trn1/)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import aws_cdk as cdk
import aws_cdk.aws_iam as iam
import pytest

from constructs_lib.bootstrap import NodeBootstrap
from constructs_lib.bundle import MONITOR_UNIT
from constructs_lib.runtime import contract

ROOT = Path(__file__).resolve().parents[2]


def _bootstrap(instance: str) -> NodeBootstrap:
    stack = cdk.Stack(cdk.App(), "S", env=cdk.Environment(region="us-east-1"))
    role = iam.Role(stack, "Role", assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"))
    return NodeBootstrap(stack, "Boot", instance=instance, role=role)


def _agent_config_on_the_node(node_env: dict, tmp_path: Path) -> dict:
    """What `dl_runtime.sh cwagent-config` writes on a node with this node.env."""
    out = tmp_path / "cwagent.json"
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), **{k: v for k, v in node_env.items() if "Token" not in v}}
    r = subprocess.run([sys.executable, "-m", "constructs_lib.runtime", "cwagent-config", "--out", str(out)],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(out.read_text())


def test_monitoring_alone_names_the_job_and_the_gpus_to_expect(tmp_path):
    boot = _bootstrap("p5.48xlarge")
    boot.enable_monitoring(job="dl-llm")
    env = contract.parse_env(boot.node_env())
    assert (env["DL_CLUSTER"], env["DL_EXPECTED_GPUS"]) == ("dl-llm", "8")
    assert MONITOR_UNIT in env["DL_UNITS"].split()
    collected = _agent_config_on_the_node(env, tmp_path)["metrics"]["metrics_collected"]
    assert "nvidia_gpu" in collected
    assert {b["append_dimensions"][contract.DIM_JOB] for b in collected.values()} == {"dl-llm"}


def test_a_neuron_node_expects_no_gpus_and_collects_none(tmp_path):
    boot = _bootstrap("trn1.32xlarge")
    boot.enable_monitoring(job="dl-trn")
    env = contract.parse_env(boot.node_env())
    assert env["DL_EXPECTED_GPUS"] == "0"
    assert "nvidia_gpu" not in _agent_config_on_the_node(env, tmp_path)["metrics"]["metrics_collected"]


def test_the_job_and_its_metrics_name_one_cluster():
    boot = _bootstrap("p5.48xlarge")
    boot.enable_job(cluster="dl-llm")
    boot.enable_monitoring(job="dl-llm")  # the same: fine
    with pytest.raises(ValueError, match="already 'dl-llm'"):
        boot.enable_monitoring(job="dl-other")
    other = _bootstrap("p5.48xlarge")
    other.enable_monitoring(job="dl-llm")
    with pytest.raises(ValueError, match="already 'dl-llm'"):
        other.enable_job(cluster="dl-other")
