"""The job verbs find a training stack whatever its name (issue 40 item 5): a team that builds
TrainingStack in its own app under its own name gets status, logs, shell and destroy, found by the
launcher's own marks (the DlLauncherJob output and the dl-launcher:job tag, both naming the job).
A stack with one of them only, or with the two disagreeing, stays invisible: the tag is anyone's to
set on any stack, and an output is any template's (docs/security.md)."""
from __future__ import annotations

import json

import aws_cdk as cdk
import boto3
import pytest

from constructs_lib.runtime.contract import OUTPUT_CLUSTER, OUTPUT_JOB, OUTPUT_STATE_KEY, TAG_JOB, capacity_state_key
from dl_launcher.cli import main
from dl_launcher.errors import CliError
from dl_launcher.jobstack import NoStack, deployed_jobs, describe, job_of
from dl_stacks.selection import select
from dl_stacks.settings import from_context
from dl_stacks.training_stack import TrainingStack
from tests.cli.conftest import job_stack

TOPIC = {"T": {"Type": "AWS::SNS::Topic"}}
NAME = "ml-team-llm"  # the team's own stack name: nothing like dl-<job>
CONSTRUCT = "LlmTraining"  # its construct id, which names the cluster


@pytest.fixture(scope="module")
def team_app(tmp_path_factory):
    """A team's own App with the training stack under its own name, synthesized: its outputs and
    the stack tags cdk deploy would set (the cloud assembly's manifest)."""
    settings = from_context({"profile": "single-gpu-training", "job": "llm", "preflight": "false"})
    out = tmp_path_factory.mktemp("team")
    app = cdk.App(outdir=str(out))
    # Its construct id (the cluster id) apart from its stack name, as `stack_name=` allows.
    stack = TrainingStack(app, CONSTRUCT, stack_name=NAME, settings=settings, selection=select(settings),
                          env=cdk.Environment(region="us-east-1"))
    app.synth()
    assert stack.stack_name == NAME
    manifest = json.loads((out / "manifest.json").read_text())
    return (json.loads((out / f"{stack.artifact_id}.template.json").read_text()),
            manifest["artifacts"][stack.artifact_id]["properties"]["tags"])


def _create(cfn, name: str, *, said: str | None = None, tagged: str | None = None, outputs: dict | None = None) -> None:
    outs = {k: {"Value": v} for k, v in (outputs or {}).items()}
    if said is not None:
        outs[OUTPUT_JOB] = {"Value": said}
    cfn.create_stack(StackName=name, TemplateBody=json.dumps({"Resources": TOPIC, "Outputs": outs}),
                     Tags=[{"Key": TAG_JOB, "Value": tagged}] if tagged is not None else [])


def test_a_training_stack_of_another_name_is_found_by_its_output_and_tag(aws, team_app, capsys):
    template, tags = team_app
    assert template["Outputs"][OUTPUT_JOB]["Value"] == "llm" and tags[TAG_JOB] == "llm"
    cfn = boto3.client("cloudformation", region_name="us-east-1")
    cfn.create_stack(StackName=NAME, TemplateBody=json.dumps({"Resources": TOPIC, "Outputs": {
        OUTPUT_JOB: template["Outputs"][OUTPUT_JOB]}}), Tags=[{"Key": k, "Value": v} for k, v in tags.items()])
    for job in ("llm", "dl-llm"):  # the job, or the stack name the CLI would have looked for
        assert describe(cfn, job, "us-east-1")["StackName"] == NAME
    assert deployed_jobs(cfn) == ["llm"]
    # A verb reaches that stack: status reads its CheckpointBucket output, which this stand-in lacks.
    assert main(["status", "llm", "--region", "us-east-1"]) == 2
    assert f"stack {NAME} has no CheckpointBucket output" in capsys.readouterr().err


@pytest.mark.parametrize("said,tagged", [
    (None, "llm"),      # the tag alone: anyone may tag any stack
    ("llm", None),      # the output alone: cdk deploy --tags replaced the tag, or a copied template
    ("llm", "other"),   # the two disagree
    ("other", "llm"),
])
def test_a_look_alike_of_another_name_is_not_found(aws, capsys, said, tagged):
    cfn = boto3.client("cloudformation", region_name="us-east-1")
    _create(cfn, "team-data-lake", said=said, tagged=tagged, outputs={"CheckpointBucket": "their-bucket"})
    with pytest.raises(NoStack, match=r"no stack dl-llm in us-east-1 .*no dl-launcher job is deployed there"):
        describe(cfn, "llm", "us-east-1")
    assert deployed_jobs(cfn) == ([] if said != tagged else [said])
    assert main(["destroy", "llm", "--yes", "--region", "us-east-1"]) == 2
    assert capsys.readouterr().err.startswith("error: no stack dl-llm in us-east-1")
    assert cfn.describe_stacks(StackName="team-data-lake")["Stacks"][0]["StackStatus"] == "CREATE_COMPLETE"


def test_the_dl_name_comes_first_and_two_other_names_are_refused(aws):
    cfn = boto3.client("cloudformation", region_name="us-east-1")
    _create(cfn, "team-a", said="llm", tagged="llm")
    _create(cfn, "team-b", said="llm", tagged="llm")
    with pytest.raises(CliError, match=r"^job llm in us-east-1 is run by 2 stacks \(team-a, team-b\): nothing was done"):
        describe(cfn, "llm", "us-east-1")
    job_stack(cfn, "llm")
    assert describe(cfn, "llm", "us-east-1")["StackName"] == "dl-llm"


def test_a_dl_stack_that_is_not_ours_is_still_refused_unless_the_job_runs_elsewhere(aws):
    cfn = boto3.client("cloudformation", region_name="us-east-1")
    _create(cfn, "dl-llm")  # another team's, named like ours
    with pytest.raises(CliError, match="stack dl-llm in us-east-1 was not made by dl-launcher"):
        describe(cfn, "llm", "us-east-1")
    _create(cfn, NAME, said="llm", tagged="llm")
    assert describe(cfn, "llm", "us-east-1")["StackName"] == NAME
    assert job_of(cfn.describe_stacks(StackName="dl-llm")["Stacks"][0]) is None


def test_status_of_a_renamed_stack_reads_the_cluster_the_stack_names(aws, team_app, capsys):
    """`stack_name=` sets the stack's name apart from its construct id, which names the cluster
    and the controller's state key: status reads both from the stack's outputs."""
    import dataclasses

    from tests.fleet.conftest import BUCKET, Cloud

    template, tags = team_app
    assert template["Outputs"][OUTPUT_CLUSTER]["Value"] == CONSTRUCT
    assert template["Outputs"][OUTPUT_STATE_KEY]["Value"] == capacity_state_key(CONSTRUCT)
    cloud = Cloud()
    cfn = boto3.client("cloudformation", region_name="us-east-1")
    outputs = {k: template["Outputs"][k] for k in (OUTPUT_JOB, OUTPUT_CLUSTER, OUTPUT_STATE_KEY)}
    stack_id = cfn.create_stack(StackName=NAME, TemplateBody=json.dumps({"Resources": TOPIC, "Outputs": {
        **outputs, "CheckpointBucket": {"Value": BUCKET}}}), Tags=[{"Key": k, "Value": v} for k, v in tags.items()])["StackId"]
    spec = dataclasses.replace(cloud.spec(nodes=1, stack=stack_id), cluster=CONSTRUCT,
                               state_key=capacity_state_key(CONSTRUCT))
    cloud.controller(spec).reconcile()
    capsys.readouterr()
    assert main(["status", "llm", "--region", "us-east-1"]) == 0
    out = capsys.readouterr().out
    assert f"cluster {CONSTRUCT}: current type " in out and "1 running" in out, out
