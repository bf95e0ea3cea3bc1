"""Per-call limits at cluster sizes AWS enforces and moto does not (issue 27): EC2 refuses a filter
of more than 200 values and SSM SendCommand more than 50 instance ids; these wrappers answer as
those services do, around moto's clients."""
from __future__ import annotations

from typing import Any

import boto3
from botocore.exceptions import ClientError

from constructs_lib.fleet.idle_action import push_checkpoints
from constructs_lib.fleet.instances import states, tag_volumes

from .conftest import REGION


class StrictEc2:
    """EC2 as it answers a filter of more than 200 values (the EC2 API reference, Filter)."""

    def __init__(self, client: Any) -> None:
        self.client, self.calls = client, []

    def describe_instances(self, **kw):
        values = sum(len(f["Values"]) for f in kw.get("Filters", []))
        self.calls.append(values)
        if values > 200:
            raise ClientError({"Error": {"Code": "InvalidParameterValue", "Message":
                               "The maximum number of filter values specified on a single call is 200"}},
                              "DescribeInstances")
        return self.client.describe_instances(**kw)

    def create_tags(self, **kw):
        return self.client.create_tags(**kw)


class StrictSsm:
    """SSM as it answers SendCommand with more than 50 InstanceIds (the SSM API reference)."""

    def __init__(self, client: Any) -> None:
        self.client, self.sent = client, []

    def send_command(self, **kw):
        self.sent.append(len(kw["InstanceIds"]))
        if len(kw["InstanceIds"]) > 50:
            raise ClientError({"Error": {"Code": "ValidationException", "Message": "1 validation error detected: "
                               "Value at 'instanceIds' failed to satisfy constraint: Member must have length less "
                               "than or equal to 50"}}, "SendCommand")
        return self.client.send_command(**kw)

    def get_command_invocation(self, **kw):
        return self.client.get_command_invocation(**kw)


def test_a_256_node_launch_tags_every_volume(aws):
    ec2 = boto3.client("ec2", region_name=REGION)
    ids = [i["InstanceId"] for i in ec2.run_instances(ImageId="ami-12c6146b", MinCount=256, MaxCount=256)["Instances"]]
    strict = StrictEc2(ec2)
    tagged = tag_volumes(strict, ids, {"team": "ml"})
    assert len(tagged) == 256 and max(strict.calls) <= 200
    volumes = ec2.describe_volumes(Filters=[{"Name": "tag:team", "Values": ["ml"]}])["Volumes"]
    assert len(volumes) == 256
    assert len(states(strict, ids)) == 256 and max(strict.calls) <= 200


def test_the_idle_guard_pushes_on_120_nodes(aws):
    ec2 = boto3.client("ec2", region_name=REGION)
    ids = [i["InstanceId"] for i in ec2.run_instances(ImageId="ami-12c6146b", MinCount=120, MaxCount=120)["Instances"]]
    ssm = StrictSsm(boto3.client("ssm", region_name=REGION))
    waited: list[float] = []
    outcome = push_checkpoints(ssm, ids, timeout=5, poll=0, sleep=waited.append)
    assert ssm.sent == [50, 50, 20]
    assert set(outcome) == set(ids) and not any(v.startswith("not sent") for v in outcome.values()), outcome
