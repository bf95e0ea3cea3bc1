"""`dl-launcher destroy JOB --delete-checkpoints` after the stack is gone, whatever the stack was
named (issue 40): the deleted stack is found in CloudFormation's record by the same marks as a live
one (jobstack.job_of): a team's own name with the job output and tag, or a Service Catalog launch
with its product's mark and Service Catalog's AutoTags. A deleted look-alike (the tag alone, the
output alone) is never followed, and its buckets keep every version."""
from __future__ import annotations

import pytest

from constructs_lib.runtime.contract import OUTPUT_PRODUCT, TAG_JOB
from dl_launcher.cli import main
from dl_launcher.destroy import destroy
from dl_launcher.errors import CliError
from dl_launcher.jobstack import SC_PRODUCT, SC_PROVISIONED_PRODUCT
from tests.cli.test_destroy import _buckets, _deploy, _versions

SC_NAME = "SC-123456789012-pp-abc123"
AUTO_TAGS = [{"Key": SC_PROVISIONED_PRODUCT, "Value": "arn:aws:servicecatalog:us-east-1:123456789012:stack/llm/pp-abc123"},
             {"Key": SC_PRODUCT, "Value": "arn:aws:catalog:us-east-1:123456789012:product/prod-abcdefgh"}]


def _gone(name: str, mark=None, *, tags=(), outputs=None):
    """The stack deployed, then deleted outside dl-launcher (the console, cdk destroy, Service Catalog)."""
    cfn, s3, res = _deploy(name, mark=mark, Tags=list(tags), outputs=outputs)
    cfn.delete_stack(StackName=name)
    return cfn, s3, res


@pytest.mark.parametrize("name,tags,outputs", [
    ("ml-team-llm", [{"Key": TAG_JOB, "Value": "llm"}], None),         # a team's own name
    (SC_NAME, AUTO_TAGS, {OUTPUT_PRODUCT: "platform/single-gpu-training"}),  # a Service Catalog launch
], ids=["team-name", "service-catalog"])
def test_the_buckets_of_a_deleted_stack_of_any_name_are_found_and_confirmed(aws, capsys, name, tags, outputs):
    cfn, s3, res = _gone(name, "llm", tags=tags, outputs=outputs)
    asked: list[str] = []
    with pytest.raises(CliError, match="not confirmed: nothing was deleted"):
        destroy(cfn, s3, "llm", "us-east-1", delete_checkpoints=True, confirm=lambda s: asked.append(s) or False,
                say=lambda _: None)
    assert asked == [name] and _versions(s3, res["CheckpointsBucket"]) == 4, "unconfirmed: nothing deleted"
    assert main(["destroy", "llm", "--delete-checkpoints", "--yes", "--region", "us-east-1"]) == 0
    out = capsys.readouterr().out
    assert f"stack {name} is deleted; it kept bucket {res['CheckpointsBucket']} (CheckpointsBucket)" in out, out
    assert not ({res["CheckpointsBucket"], res["CheckpointsAccessLogs"]} & _buckets(s3))


@pytest.mark.parametrize("mark,tags,outputs", [
    (None, [{"Key": TAG_JOB, "Value": "llm"}], None),   # the tag alone: anyone may tag a stack
    ("llm", [], None),                                  # the output alone: any template's
    ("llm", [{"Key": TAG_JOB, "Value": "other"}], None),  # the two disagree
    ("llm", [{"Key": k["Key"].removeprefix("aws:"), "Value": k["Value"]} for k in AUTO_TAGS],
     {OUTPUT_PRODUCT: "platform/single-gpu-training"}),  # user tags dressed as Service Catalog's
    ("llm", AUTO_TAGS, None),                           # another product's launch, without the mark
], ids=["tag-only", "output-only", "disagree", "user-tagged-launch", "unmarked-launch"])
def test_a_deleted_look_alike_is_not_followed(aws, capsys, mark, tags, outputs):
    cfn, s3, res = _gone(SC_NAME if outputs or tags is AUTO_TAGS else "team-data-lake", mark, tags=tags,
                         outputs=outputs)
    assert main(["destroy", "llm", "--delete-checkpoints", "--yes", "--region", "us-east-1"]) == 2
    assert capsys.readouterr().err.startswith("error: no stack dl-llm in us-east-1")
    assert _versions(s3, res["CheckpointsBucket"]) == 4
