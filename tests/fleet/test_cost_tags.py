"""The stack's own tags (Service Catalog's TagOptions, `cdk deploy --tags`) on every node and its
volumes, through moto's CloudFormation, CreateFleet and EBS; a failure to read them never stops a
launch."""
from __future__ import annotations

import json

import boto3

from constructs_lib.fleet.controller import Controller
from constructs_lib.fleet.instances import stack_tags
from tests.fleet.conftest import REGION, live_instances

TAGS = [{"Key": "team", "Value": "ml-research"}, {"Key": "project", "Value": "llm"},
        {"Key": "cost-centre", "Value": "cc-1001"}]


def _stack() -> tuple[object, str]:
    cfn = boto3.client("cloudformation", region_name=REGION)
    body = json.dumps({"Resources": {"Topic": {"Type": "AWS::SNS::Topic"}}})
    arn = cfn.create_stack(StackName="SC-123456789012-pp-abcdefgh", TemplateBody=body, Tags=TAGS)["StackId"]
    return cfn, arn


def test_the_stacks_tags_reach_every_node_and_volume(cloud):
    cfn, arn = _stack()
    spec = cloud.spec(nodes=2, stack=arn)
    controller = Controller(cloud.ec2, spec, cloud.store(spec), log=cloud.logs.append,
                            cost_tags=lambda: stack_tags(cfn, spec.stack))
    cloud.reconcile(controller)
    nodes = live_instances(cloud.raw)
    assert len(nodes) == 2
    want = {(t["Key"], t["Value"]) for t in TAGS}
    for i in nodes:
        assert want <= {(t["Key"], t["Value"]) for t in i["Tags"]}, i["Tags"]
        assert not any(t["Key"].startswith("aws:") for t in i["Tags"])
    volumes = [b["Ebs"]["VolumeId"] for i in nodes for b in i.get("BlockDeviceMappings", [])]
    assert volumes, "moto attaches a root volume to each instance"
    for v in boto3.client("ec2", region_name=REGION).describe_volumes(VolumeIds=volumes)["Volumes"]:
        assert want <= {(t["Key"], t["Value"]) for t in v.get("Tags", [])}, v.get("Tags")


def test_unreadable_tags_are_logged_and_the_cluster_launches_anyway(cloud):
    _cfn, arn = _stack()
    spec = cloud.spec(nodes=2, stack=arn)

    def denied():
        raise RuntimeError("AccessDenied: cloudformation:DescribeStacks")

    controller = Controller(cloud.ec2, spec, cloud.store(spec), log=cloud.logs.append, cost_tags=denied)
    cloud.reconcile(controller)
    assert len(live_instances(cloud.raw)) == 2
    assert any("could not read the stack's tags" in line for line in cloud.logs)
