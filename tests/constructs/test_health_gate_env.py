"""What the constructs tell a node's boot health gate (runtime/health_gate.py) to expect, from
the selector's catalog and the launch template's own EFA interfaces and RAID; and the context
key that picks DCGM's depth."""
from __future__ import annotations

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2

from constructs_lib import GpuLaunchTemplate
from constructs_lib.runtime import contract
from constructs_lib.runtime.health_checks import Expect
from constructs_lib.runtime.health_gate import checks_for
from constructs_lib.validation import ConfigurationError
from dl_selector.catalog import load_catalog
from dl_selector.errors import UserError
from dl_stacks.settings import from_context


def _node(instance_type: str, **kw) -> GpuLaunchTemplate:
    stack = cdk.Stack(cdk.App(), "S", env=cdk.Environment(account="111111111111", region="us-east-1"))
    vpc = ec2.Vpc(stack, "Vpc", max_azs=1)
    return GpuLaunchTemplate(stack, "Node", vpc=vpc, instance_type=instance_type, **kw)


@pytest.mark.parametrize("instance_type, multi_node, efa", [("p5.48xlarge", True, 32), ("p5en.48xlarge", True, 16),
                                                            ("p5.48xlarge", False, 0)])
def test_a_node_expects_the_catalogs_gpus_its_efa_interfaces_and_nvme(instance_type, multi_node, efa):
    node = _node(instance_type, multi_node=multi_node)
    node.enable_health_gate("standard")
    env = contract.parse_env(node.node_env())
    facts = load_catalog().get(instance_type)
    assert env["DL_EXPECTED_GPUS"] == str(facts.accelerator_count)
    assert env[contract.ENV_EXPECTED_EFA] == str(efa)  # one per EFA interface the template attaches
    assert env[contract.ENV_EXPECTED_SCRATCH_GB] == str(facts.nvme.count * facts.nvme.size_gb)
    assert env[contract.ENV_HEALTH_CHECK] == "standard"
    names = [c.__name__ for c in checks_for(Expect.from_env(env), "cuda")]
    assert "dcgm_diag" in names and "scratch_size" in names and ("efa_loopback" in names) == bool(efa)


def test_a_node_without_raid_expects_no_scratch_size():
    node = _node("g5.xlarge", raid=False)
    node.enable_health_gate()
    env = contract.parse_env(node.node_env())
    assert env[contract.ENV_EXPECTED_SCRATCH_GB] == "0" and env[contract.ENV_HEALTH_CHECK] == contract.HEALTH_CHECK_DEFAULT
    with pytest.raises(ConfigurationError, match="allowed quick, standard, thorough"):
        node.enable_health_gate("deep")


def test_the_context_key_defaults_to_quick_and_refuses_a_bad_level_with_the_closest():
    assert from_context({}).health_check == "quick"
    assert from_context({"health_check": "thorough"}).health_check == "thorough"
    with pytest.raises(UserError, match="standard"):
        from_context({"health_check": "standrd"})


def test_a_multi_node_node_carries_the_collective_check_and_its_types_baseline():
    node = _node("p4d.24xlarge", multi_node=True)
    node.enable_health_gate(collective="64MiB")
    env = contract.parse_env(node.node_env())
    assert env[contract.ENV_COLLECTIVE_CHECK] == "64MiB"
    # The selector's baseline file's rows for this type, nodes:GB/s.
    assert env[contract.ENV_ALLREDUCE_BASELINE] == "2:77.9"
    with pytest.raises(ConfigurationError, match="allowed off, 16MiB"):
        node.enable_health_gate(collective="big")


def test_a_single_node_runs_no_collective_check():
    node = _node("g5.xlarge", raid=False)
    node.enable_health_gate()
    assert contract.ENV_COLLECTIVE_CHECK not in contract.parse_env(node.node_env())


def test_the_collective_check_key_defaults_to_256mib_and_refuses_a_bad_size_with_the_closest():
    assert from_context({}).collective_check == "256MiB"
    assert from_context({"collective_check": "off"}).collective_check == "off"
    with pytest.raises(UserError, match="closest: 64MiB"):
        from_context({"collective_check": "64mib"})
