"""`dl-launcher destroy` against moto's CloudFormation: the stack goes, the retained checkpoint
buckets stay (with their size and monthly cost said), and --delete-checkpoints empties them of
every version and delete marker and removes them, only once confirmed; an unconfirmed run
deletes nothing; and a stack named dl-NAME that dl-launcher did not make (issue 35 item 2:
`destroy data-lake` deleted another team's `dl-data-lake` and emptied its bucket) is refused with
one line, exit 2, and nothing of it deleted."""
from __future__ import annotations

import json

from typing import Optional

import boto3
import pytest

from constructs_lib.runtime.contract import OUTPUT_JOB, TAG_JOB
from dl_launcher.cli import main
from dl_launcher.destroy import destroy
from dl_launcher.errors import CliError

TEMPLATE = {"Resources": {
    "CheckpointsBucket": {"Type": "AWS::S3::Bucket", "DeletionPolicy": "Retain", "UpdateReplacePolicy": "Retain",
                          "Properties": {"VersioningConfiguration": {"Status": "Enabled"}}},
    "CheckpointsAccessLogs": {"Type": "AWS::S3::Bucket", "DeletionPolicy": "Retain"},
    "Alerts": {"Type": "AWS::SNS::Topic"},
}, "Outputs": {"CheckpointBucket": {"Value": {"Ref": "CheckpointsBucket"}}}}


def _deploy(name: str, mark: Optional[str] = None, outputs: Optional[dict] = None, **kw):
    """TEMPLATE as stack `name`, with the training stack's job output when `mark` is given (and
    `outputs` beside); its buckets' physical ids, the checkpoint bucket holding three versions and
    a delete marker."""
    cfn, s3 = boto3.client("cloudformation", region_name="us-east-1"), boto3.client("s3", region_name="us-east-1")
    template = json.loads(json.dumps(TEMPLATE))
    if mark is not None:
        template["Outputs"][OUTPUT_JOB] = {"Value": mark}
    template["Outputs"].update({k: {"Value": v} for k, v in (outputs or {}).items()})
    cfn.create_stack(StackName=name, TemplateBody=json.dumps(template), **kw)
    res = {r["LogicalResourceId"]: r["PhysicalResourceId"]
           for r in cfn.list_stack_resources(StackName=name)["StackResourceSummaries"]}
    # the template asks for versioning; moto's CloudFormation does not apply it, so ask S3 directly
    s3.put_bucket_versioning(Bucket=res["CheckpointsBucket"], VersioningConfiguration={"Status": "Enabled"})
    for step in range(3):  # three saves of one key: versions, then a delete marker
        s3.put_object(Bucket=res["CheckpointsBucket"], Key="jobs/llm/step-1/model.pt", Body=b"w" * 1000 * (step + 1))
    s3.delete_object(Bucket=res["CheckpointsBucket"], Key="jobs/llm/step-1/model.pt")
    return cfn, s3, res


@pytest.fixture
def deployed(aws):
    return _deploy("dl-llm", mark="llm")


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


def _versions(s3, bucket: str) -> int:
    page = s3.list_object_versions(Bucket=bucket)
    return len(page.get("Versions", [])) + len(page.get("DeleteMarkers", []))


@pytest.mark.parametrize("how", [
    {},  # the review's case: a stack of that name with no dl-launcher mark at all
    {"Tags": [{"Key": TAG_JOB, "Value": "other"}]},  # our tag, naming another job
    {"mark": "llm"},  # our output copied from dl-llm's template: it names another job
])
def test_destroy_of_a_stack_dl_launcher_did_not_make_refuses_and_deletes_nothing(aws, capsys, how):
    how = dict(how)
    cfn, s3, res = _deploy("dl-data-lake", mark=how.pop("mark", None), **how)
    before = {b: _versions(s3, b) for b in res.values() if b in _buckets(s3)}
    assert main(["destroy", "data-lake", "--delete-checkpoints", "--yes", "--region", "us-east-1"]) == 2
    err = capsys.readouterr().err
    assert err == ("error: stack dl-data-lake in us-east-1 was not made by dl-launcher (it has no output "
                   f"{OUTPUT_JOB} or stack tag {TAG_JOB} naming job data-lake): nothing was done to it; dl-launcher "
                   "acts only on the stacks it deploys\n"), err
    assert cfn.describe_stacks(StackName="dl-data-lake")["Stacks"][0]["StackStatus"] == "CREATE_COMPLETE"
    assert {b: _versions(s3, b) for b in before} == before and before[res["CheckpointsBucket"]] == 4
    assert boto3.client("sns", region_name="us-east-1").list_topics()["Topics"], "its topic is still there"


def test_a_stack_deployed_before_the_job_output_is_found_by_its_stack_tag(aws):
    """cdk deploy sets the training stack's TAG_JOB on the stack itself (its manifest's tags):
    a job deployed before OUTPUT_JOB existed is still destroyed."""
    cfn, s3, res = _deploy("dl-old", Tags=[{"Key": TAG_JOB, "Value": "old"}])
    said: list[str] = []
    assert destroy(cfn, s3, "old", "us-east-1", delete_checkpoints=False, confirm=lambda _: False, poll=0.01,
                   say=said.append) == 0
    assert any(line.startswith("deleted stack dl-old in ") for line in said), said
    assert [s["StackName"] for s in cfn.list_stacks(StackStatusFilter=["DELETE_COMPLETE"])["StackSummaries"]] == ["dl-old"]


def test_destroy_shows_each_stack_event_and_the_time_while_it_waits(deployed, monkeypatch):
    """A real teardown takes minutes (the instances terminate first): each new stack event is said
    as it happens, with the time since the delete; a quiet minute says what it waits for."""
    cfn, s3, _ = deployed
    clock = [0.0]
    monkeypatch.setattr("dl_launcher.destroy.time.monotonic", lambda: clock[0])
    monkeypatch.setattr("dl_launcher.destroy.time.sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    teardown = {"EventId": "teardown-1", "LogicalResourceId": "ClusterTeardown",
                "ResourceType": "Custom::DlLauncherClusterTeardown", "ResourceStatus": "DELETE_IN_PROGRESS",
                "ResourceStatusReason": "terminating 2 instances"}

    class Slow:
        """moto's CloudFormation deletes at once; this one stays DELETE_IN_PROGRESS for 9 polls and
        logs the teardown's event at the second."""
        polls = -1

        def __getattr__(self, name):
            return getattr(cfn, name)

        def delete_stack(self, **kw):
            Slow.polls = 0
            return cfn.delete_stack(**kw)

        def describe_stacks(self, **kw):
            if Slow.polls < 0 or Slow.polls >= 9:
                return cfn.describe_stacks(**kw)
            Slow.polls += 1
            return {"Stacks": [{"StackStatus": "DELETE_IN_PROGRESS"}]}

        def describe_stack_events(self, **kw):
            events = cfn.describe_stack_events(**kw)["StackEvents"]
            return {"StackEvents": ([teardown] if Slow.polls >= 2 else []) + events}

    said: list[str] = []
    assert destroy(Slow(), s3, "llm", "us-east-1", delete_checkpoints=False, confirm=lambda _: False, poll=10,
                   say=said.append) == 0
    text = "\n".join(said)
    assert "  [0:10] ClusterTeardown (Custom::DlLauncherClusterTeardown): DELETE_IN_PROGRESS - terminating 2 instances" in said, text
    assert "  [1:10] still DELETE_IN_PROGRESS (instances take a few minutes to terminate)" in said, text
    assert text.count("ClusterTeardown (") == 1, "an event is said once: " + text
    assert "deleted stack dl-llm in [1:30]" in said, text


def test_delete_checkpoints_after_the_stack_is_gone_finds_the_buckets_it_kept(deployed, capsys):
    """Issue 40, item 4: `destroy` kept the buckets; a later `destroy --delete-checkpoints` (the stack
    gone) finds them in CloudFormation's record of the deleted stack, confirms, and removes them."""
    cfn, s3, res = deployed
    destroy(cfn, s3, "llm", "us-east-1", delete_checkpoints=False, confirm=lambda _: False, poll=0.01, say=lambda _: None)
    assert {res["CheckpointsBucket"], res["CheckpointsAccessLogs"]} <= _buckets(s3)
    with pytest.raises(CliError, match="not confirmed: nothing was deleted"):
        destroy(cfn, s3, "llm", "us-east-1", delete_checkpoints=True, confirm=lambda _: False, say=lambda _: None)
    assert _versions(s3, res["CheckpointsBucket"]) == 4, "unconfirmed: nothing deleted"
    assert main(["destroy", "llm", "--delete-checkpoints", "--yes", "--region", "us-east-1"]) == 0
    out = capsys.readouterr().out
    assert not ({res["CheckpointsBucket"], res["CheckpointsAccessLogs"]} & _buckets(s3))
    assert f"stack dl-llm is deleted; it kept bucket {res['CheckpointsBucket']} (CheckpointsBucket): 3 object versions" \
        in out and f"deleted bucket {res['CheckpointsBucket']} (4 object versions)" in out, out
    said: list[str] = []
    assert destroy(cfn, s3, "llm", "us-east-1", delete_checkpoints=True, confirm=lambda _: True, say=said.append) == 0
    assert said == ["stack dl-llm in us-east-1 is deleted and none of the buckets it kept is left: nothing to delete"]


def test_after_the_stack_is_gone_only_a_deleted_stack_dl_launcher_made_is_followed(aws, capsys):
    """A deleted dl-data-lake that was another team's (no job output) leaves its buckets alone: the
    answer is the usual "no stack" line, exit 2, and every version is still there."""
    cfn, s3, res = _deploy("dl-data-lake")
    cfn.delete_stack(StackName="dl-data-lake")
    before = _versions(s3, res["CheckpointsBucket"])
    assert main(["destroy", "data-lake", "--delete-checkpoints", "--yes", "--region", "us-east-1"]) == 2
    assert capsys.readouterr().err.startswith("error: no stack dl-data-lake in us-east-1")
    assert _versions(s3, res["CheckpointsBucket"]) == before == 4
