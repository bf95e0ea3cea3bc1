"""The CDK app: every profile synthesizes (one process, cdk-nag and cfn-lint clean), the real CLI
synthesizes with no credentials and no network, and bad context is one line with no stack."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Template

from selector.profiles import builtin_profiles
from stacks.settings import from_context
from stacks.training_stack import TrainingStack
from tests.cdk_checks import cfn_lint, synth_with_nag

ROOT = Path(__file__).resolve().parents[1]
PROFILES = sorted(builtin_profiles())


@pytest.fixture(scope="session")
def all_profiles(tmp_path_factory):
    """One app with a stack per profile, synthesized once with cdk-nag, linted once."""
    out = tmp_path_factory.mktemp("cdk.out")
    app = cdk.App(outdir=str(out))
    stacks = {p: TrainingStack.for_settings(app, from_context({"profile": p, "job": p}), quiet=True) for p in PROFILES}
    assembly = synth_with_nag(app)
    cfn_lint([out / f"{s.stack_name}.template.json" for s in stacks.values()])
    return {p: (s, Template.from_json(assembly.get_stack_by_name(s.stack_name).template)) for p, s in stacks.items()}


@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_synthesizes_with_its_pick(all_profiles, profile):
    stack, t = all_profiles[profile]
    outputs = t.to_json()["Outputs"]
    assert outputs["InstanceType"]["Value"] == stack.selection.pick.instance_type
    for key in ("Alternates", "ClusterCostPerHour", "CheckpointBucket", "SsmSessionCommand"):
        assert key in outputs
    t.resource_count_is("AWS::AutoScaling::AutoScalingGroup", 1)
    (bucket,) = t.find_resources("AWS::S3::Bucket", {"Properties": {"VersioningConfiguration": {"Status": "Enabled"}}}).values()
    assert bucket["DeletionPolicy"] == "Retain"


def test_multi_node_training_is_two_efa_nodes_in_one_placement_group_on_spot(all_profiles):
    stack, t = all_profiles["multi-node-training"]
    (asg,) = t.find_resources("AWS::AutoScaling::AutoScalingGroup").values()
    p = asg["Properties"]
    assert p["DesiredCapacity"] == "2" and "PlacementGroup" in p and len(p["VPCZoneIdentifier"]) == 1
    assert p["MixedInstancesPolicy"]["InstancesDistribution"]["OnDemandPercentageAboveBaseCapacity"] == 0
    pick = stack.selection.facts
    lts = t.find_resources("AWS::EC2::LaunchTemplate")
    first = next(lt for lt in lts.values() if lt["Properties"]["LaunchTemplateData"]["InstanceType"] == pick.instance_type)
    nics = first["Properties"]["LaunchTemplateData"]["NetworkInterfaces"]
    assert sum(n["InterfaceType"] == "efa-only" for n in nics) == pick.max_efa_interfaces
    from tests.constructs.userdata_text import user_data_text
    ud = user_data_text(first["Properties"]["LaunchTemplateData"])
    assert "dl-job.service" in ud and 'DL_CLUSTER="dl-multi-node-training-multi-node-training"' in ud
    tags = {tg["Key"]: tg["Value"] for spec in first["Properties"]["LaunchTemplateData"]["TagSpecifications"]
            for tg in spec["Tags"]}
    assert tags["dl-launcher:cluster"] == "dl-multi-node-training-multi-node-training"


def test_vpc_is_one_az_private_with_s3_endpoint_and_flow_logs(all_profiles):
    _, t = all_profiles["multi-node-training"]
    t.resource_count_is("AWS::EC2::NatGateway", 1)
    t.has_resource_properties("AWS::EC2::VPCEndpoint", {"VpcEndpointType": "Gateway"})
    t.resource_count_is("AWS::EC2::FlowLog", 1)
    subnets = t.find_resources("AWS::EC2::Subnet")
    assert len({json.dumps(s["Properties"]["AvailabilityZone"]) for s in subnets.values()}) == 1


def cli(*args, env_extra=None, timeout=300):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update({"PATH": f"{ROOT / 'node_modules' / '.bin'}:{ROOT / '.venv' / 'bin'}:{env['PATH']}",
                "AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
                "AWS_EC2_METADATA_DISABLED": "true", **(env_extra or {})})
    return subprocess.run(["cdk", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_real_cli_synth_without_credentials_or_network(tmp_path):
    r = cli("synth", "-c", "profile=inference", "--quiet", "-o", str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "dl-launcher: profile inference" in r.stderr and "why:" in r.stderr
    assert (tmp_path / "dl-inference.template.json").exists()


@pytest.mark.parametrize("args,expected", [
    (["-c", "profile=multinode"], "error: unknown profile 'multinode'"),
    (["-c", "profile=training", "-c", "nodes=zero"], "error: context nodes='zero'"),
    (["-c", "profil=inference"], "error: unknown context key 'profil'; closest: profile"),
])
def test_bad_context_is_one_line_and_no_stack(tmp_path, args, expected):
    r = cli("synth", *args, "-o", str(tmp_path))
    assert r.returncode != 0
    assert expected in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert not list(tmp_path.glob("*.template.json"))
