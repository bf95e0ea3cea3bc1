"""`dl-launcher destroy` against moto's CloudFormation: the stack goes, the retained checkpoint
buckets stay (with their size and monthly cost said), and --delete-checkpoints empties them of
every version and delete marker and removes them, only once confirmed; an unconfirmed run
deletes nothing."""
from __future__ import annotations

import json

import boto3
import pytest

from dl_launcher.destroy import destroy
from dl_launcher.errors import CliError

TEMPLATE = {"Resources": {
    "CheckpointsBucket": {"Type": "AWS::S3::Bucket", "DeletionPolicy": "Retain", "UpdateReplacePolicy": "Retain",
                          "Properties": {"VersioningConfiguration": {"Status": "Enabled"}}},
    "CheckpointsAccessLogs": {"Type": "AWS::S3::Bucket", "DeletionPolicy": "Retain"},
    "Alerts": {"Type": "AWS::SNS::Topic"},
}, "Outputs": {"CheckpointBucket": {"Value": {"Ref": "CheckpointsBucket"}}}}


@pytest.fixture
def deployed(aws):
    cfn, s3 = boto3.client("cloudformation", region_name="us-east-1"), boto3.client("s3", region_name="us-east-1")
    cfn.create_stack(StackName="dl-llm", TemplateBody=json.dumps(TEMPLATE))
    res = {r["LogicalResourceId"]: r["PhysicalResourceId"]
           for r in cfn.list_stack_resources(StackName="dl-llm")["StackResourceSummaries"]}
    # the template asks for versioning; moto's CloudFormation does not apply it, so ask S3 directly
    s3.put_bucket_versioning(Bucket=res["CheckpointsBucket"], VersioningConfiguration={"Status": "Enabled"})
    for step in range(3):  # three saves of one key: versions, then a delete marker
        s3.put_object(Bucket=res["CheckpointsBucket"], Key="jobs/llm/step-1/model.pt", Body=b"w" * 1000 * (step + 1))
    s3.delete_object(Bucket=res["CheckpointsBucket"], Key="jobs/llm/step-1/model.pt")
    return cfn, s3, res


def _buckets(s3) -> set[str]:
    return {b["Name"] for b in s3.list_buckets()["Buckets"]}


def test_destroy_deletes_the_stack_and_says_what_stays_and_costs(deployed):
    cfn, s3, res = deployed
    said: list[str] = []
    assert destroy(cfn, s3, "llm", "us-east-1", delete_checkpoints=False, confirm=lambda _: False, poll=0.01,
                   say=said.append) == 0
    assert [s["StackName"] for s in cfn.list_stacks(StackStatusFilter=["CREATE_COMPLETE"])["StackSummaries"]] == []
    assert boto3.client("sns", region_name="us-east-1").list_topics()["Topics"] == []
    assert {res["CheckpointsBucket"], res["CheckpointsAccessLogs"]} <= _buckets(s3)
    assert said[0] == "deleting stack dl-llm in us-east-1 (the cluster is terminated first by its teardown resource)"
    assert f"kept bucket {res['CheckpointsBucket']} (CheckpointsBucket): 3 object versions, 0.00 GB" in "\n".join(said)
    assert "--delete-checkpoints" in said[-1]


def test_delete_checkpoints_removes_every_version_once_confirmed(deployed):
    cfn, s3, res = deployed
    said: list[str] = []
    destroy(cfn, s3, "llm", "us-east-1", delete_checkpoints=True, confirm=lambda stack: stack == "dl-llm", poll=0.01,
            say=said.append)
    assert not ({res["CheckpointsBucket"], res["CheckpointsAccessLogs"]} & _buckets(s3))
    assert f"deleted bucket {res['CheckpointsBucket']} (4 object versions)" in said, said  # 3 versions + 1 marker


def test_an_unconfirmed_delete_deletes_nothing(deployed):
    cfn, s3, res = deployed
    with pytest.raises(CliError, match="not confirmed: nothing was deleted"):
        destroy(cfn, s3, "llm", "us-east-1", delete_checkpoints=True, confirm=lambda _: False, poll=0.01,
                say=lambda _: None)
    assert cfn.describe_stacks(StackName="dl-llm")["Stacks"][0]["StackStatus"] == "CREATE_COMPLETE"
    assert res["CheckpointsBucket"] in _buckets(s3)
