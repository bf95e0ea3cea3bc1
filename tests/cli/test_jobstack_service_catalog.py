"""Stacks Service Catalog launched from a dl-launcher product (SC-<account>-pp-<id>) are jobs to the
CLI (issue 40): found by the job output, the product's own mark (OUTPUT_PRODUCT) and Service
Catalog's AutoTags, which no user can set (aws: is a reserved prefix). Look-alikes stay invisible:
a stack a user tagged to look like a launch, and a launch of another product without the mark.
destroy terminates the provisioned product through Service Catalog, never the stack under it.

moto has no TerminateProvisionedProduct: the call goes through botocore (its parameters checked
against Service Catalog's API model) and a before-call hook does what Service Catalog's launch
role does, deleting the stack in moto's CloudFormation (docs/security.md)."""
from __future__ import annotations

import json

import aws_cdk as cdk
import boto3
import pytest
from botocore.awsrequest import AWSResponse

from constructs_lib.runtime.contract import OUTPUT_CLUSTER, OUTPUT_JOB, OUTPUT_PRODUCT, OUTPUT_STATE_KEY, capacity_state_key
from dl_launcher.cli import main
from dl_launcher.destroy import destroy
from dl_launcher.jobstack import SC_PRODUCT, SC_PROVISIONED_PRODUCT, NoStack, deployed_jobs, describe, job_of

ACCOUNT = "123456789012"
PROFILE = "single-gpu-training"
MARKS = (OUTPUT_JOB, OUTPUT_PRODUCT, OUTPUT_CLUSTER, OUTPUT_STATE_KEY)


@pytest.fixture(scope="module")
def product(tmp_path_factory):
    """One product's template as the portfolio builds it (`-c portfolio=platform -c product=...`)."""
    from dl_stacks.portfolio_app import build

    out = tmp_path_factory.mktemp("product")
    app = cdk.App(outdir=str(out))
    stack = build(app, {"portfolio": "platform", "product": PROFILE, "snapshots": str(out / "snapshots")})
    app.synth()
    return json.loads((out / f"{stack.artifact_id}.template.json").read_text())


def auto_tags(pp: str) -> list[dict]:
    """What Service Catalog puts on a stack it launches (the Administrator Guide, "AutoTags")."""
    return [{"Key": SC_PROVISIONED_PRODUCT, "Value": f"arn:aws:servicecatalog:us-east-1:{ACCOUNT}:stack/llm/{pp}"},
            {"Key": SC_PRODUCT, "Value": f"arn:aws:catalog:us-east-1:{ACCOUNT}:product/prod-abcdefgh"},
            {"Key": "aws:servicecatalog:portfolioArn", "Value": f"arn:aws:catalog:us-east-1:{ACCOUNT}:portfolio/port-abc"},
            {"Key": "team", "Value": "ml"}]  # a cost TagOption the user picked


def launch(cfn, product: dict, *, pp: str = "pp-abc123", tags=None, drop=()) -> str:
    """The product's outputs (the marks, as the product template declares them, minus `drop`) on a
    stack named as Service Catalog names a launch, with a retained checkpoint bucket; its id."""
    outputs = {k: product["Outputs"][k] for k in MARKS if k not in drop}
    outputs["CheckpointBucket"] = {"Value": {"Ref": "Checkpoints"}}
    template = {"Parameters": {"JobName": {"Type": "String"}},
                "Resources": {"Checkpoints": {"Type": "AWS::S3::Bucket", "DeletionPolicy": "Retain"}},
                "Outputs": outputs}
    return cfn.create_stack(StackName=f"SC-{ACCOUNT}-{pp}", TemplateBody=json.dumps(template),
                            Parameters=[{"ParameterKey": "JobName", "ParameterValue": "llm"}],
                            Tags=auto_tags(pp) if tags is None else tags)["StackId"]


def test_the_product_template_declares_the_marks(product):
    outs = product["Outputs"]
    assert outs[OUTPUT_JOB]["Value"] == {"Ref": "JobName"} and outs[OUTPUT_CLUSTER]["Value"] == {"Ref": "JobName"}
    assert outs[OUTPUT_PRODUCT]["Value"] == f"platform/{PROFILE}"
    assert outs[OUTPUT_STATE_KEY]["Value"] == capacity_state_key(PROFILE)  # the product's own state key


def test_a_service_catalog_launch_is_found_by_describe_and_status(aws, product, capsys):
    cfn = boto3.client("cloudformation", region_name="us-east-1")
    launch(cfn, product)
    assert describe(cfn, "llm", "us-east-1")["StackName"] == f"SC-{ACCOUNT}-pp-abc123"
    assert deployed_jobs(cfn) == ["llm"]
    # status reads the product's state key from the stack (the profile's, not the job's name)
    assert main(["status", "llm", "--region", "us-east-1"]) == 2
    err = capsys.readouterr().err
    assert f"/{capacity_state_key(PROFILE)}: has the controller run yet?" in err, err


def test_destroy_terminates_the_provisioned_product_through_service_catalog(aws, product):
    cfn, s3 = boto3.client("cloudformation", region_name="us-east-1"), boto3.client("s3", region_name="us-east-1")
    stack_id = launch(cfn, product)
    bucket = cfn.describe_stacks(StackName=stack_id)["Stacks"][0]["Outputs"]
    bucket = next(o["OutputValue"] for o in bucket if o["OutputKey"] == "CheckpointBucket")
    catalog = boto3.client("servicecatalog", region_name="us-east-1")
    asked: list[dict] = []

    def service_catalog(params, **_):  # what Service Catalog's launch role does on termination
        asked.append(json.loads(params["body"]))  # the request as serialized by botocore
        cfn.delete_stack(StackName=stack_id)
        return AWSResponse("https://servicecatalog", 200, {}, None), {"RecordDetail": {"RecordId": "rec-1"}}

    catalog.meta.events.register("before-call.service-catalog.TerminateProvisionedProduct", service_catalog)
    said: list[str] = []
    assert destroy(cfn, s3, "llm", "us-east-1", delete_checkpoints=True, confirm=lambda _: True, poll=0.01,
                   say=said.append, catalog=catalog) == 0
    assert [p["ProvisionedProductId"] for p in asked] == ["pp-abc123"] and asked[0]["TerminateToken"]
    assert said[0].startswith(f"terminating Service Catalog provisioned product pp-abc123 in us-east-1: it deletes "
                              f"stack SC-{ACCOUNT}-pp-abc123"), said
    assert f"deleted bucket {bucket} (0 object versions)" in said, said
    assert bucket not in {b["Name"] for b in s3.list_buckets()["Buckets"]}


@pytest.mark.parametrize("case", ["user-tagged", "no product mark", "no job output", "provisioned tag only"])
def test_a_look_alike_launch_is_not_found(aws, product, capsys, case):
    cfn = boto3.client("cloudformation", region_name="us-east-1")
    if case == "user-tagged":  # tags any user may set: the same names without the reserved aws: prefix
        launch(cfn, product, tags=[{"Key": t["Key"].removeprefix("aws:"), "Value": t["Value"]} for t in auto_tags("pp-abc123")])
    elif case == "no product mark":  # a launch of another team's product that declares the job output
        launch(cfn, product, drop=(OUTPUT_PRODUCT,))
    elif case == "no job output":
        launch(cfn, product, drop=(OUTPUT_JOB,))
    else:
        launch(cfn, product, tags=auto_tags("pp-abc123")[:1])
    (stack,) = cfn.describe_stacks(StackName=f"SC-{ACCOUNT}-pp-abc123")["Stacks"]
    assert job_of(stack) is None
    with pytest.raises(NoStack, match="no dl-launcher job is deployed there"):
        describe(cfn, "llm", "us-east-1")
    assert main(["destroy", "llm", "--yes", "--region", "us-east-1"]) == 2
    assert capsys.readouterr().err.startswith("error: no stack dl-llm in us-east-1")
    assert cfn.describe_stacks(StackName=f"SC-{ACCOUNT}-pp-abc123")["Stacks"][0]["StackStatus"] == "CREATE_COMPLETE"
