"""Which stacks the job verbs act on (issue 35 item 2): the ones the training stack marks as a
job's, as synthesized and as cdk deploy leaves them, never a stack by its dl- name alone; and the
verbs' hostile and valid input, each mistake one line, exit 2, before any AWS call."""
from __future__ import annotations

import json

import boto3
import pytest

from constructs_lib.runtime.contract import OUTPUT_JOB, TAG_JOB, TAG_STACK
from dl_launcher.cli import main
from dl_launcher.jobstack import deployed_jobs, describe, job_of
from tests.cli.conftest import job_stack

TOPIC = {"T": {"Type": "AWS::SNS::Topic"}}


@pytest.fixture(scope="module")
def synthesized(tmp_path_factory):
    """The real app's template and cloud-assembly manifest for -c job=mark (what cdk deploy reads)."""
    import app

    out = tmp_path_factory.mktemp("synth")
    assert app.main({"profile": "multi-node-training", "job": "mark", "approve_hourly": "100000",
                     "preflight": "false"}, outdir=str(out)) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    return json.loads((out / "dl-mark.template.json").read_text()), manifest["artifacts"]["dl-mark"]["properties"]


def test_the_training_stack_names_its_job_in_an_output_and_a_stack_tag(synthesized):
    template, props = synthesized
    assert template["Outputs"][OUTPUT_JOB]["Value"] == "mark"
    assert props["tags"][TAG_JOB] == "mark", "cdk deploy sets these on the stack (without --tags)"
    # the shell command the stack prints picks a node of this stack, not any of the cluster's name
    session = json.dumps(template["Outputs"]["SsmSessionCommand"]["Value"])
    assert f"Name=tag:{TAG_STACK},Values=" in session and '{"Ref": "AWS::StackId"}' in session, session


@pytest.mark.parametrize("deployed_with", ["cdk deploy", "cdk deploy --tags team=ml", "before the output existed"])
def test_a_job_s_stack_is_found_however_cdk_deployed_it(aws, synthesized, deployed_with):
    """`cdk deploy --tags` replaces the stack's own tags (the CDK CLI passes either; moto keeps what
    it was given), and stacks deployed before OUTPUT_JOB carry the tag only: each is still the job's."""
    template, props = synthesized
    outputs = {} if deployed_with.startswith("before") else {OUTPUT_JOB: template["Outputs"][OUTPUT_JOB]}
    tags = {"team": "ml"} if "--tags" in deployed_with else props["tags"]
    cfn = boto3.client("cloudformation", region_name="us-east-1")
    cfn.create_stack(StackName="dl-mark", TemplateBody=json.dumps({"Resources": TOPIC, "Outputs": outputs}),
                     Tags=[{"Key": k, "Value": v} for k, v in tags.items()])
    for name in ("mark", "dl-mark"):  # the job, or its stack's name
        assert job_of(describe(cfn, name, "us-east-1")) == "mark"
    assert deployed_jobs(cfn) == ["mark"]


def test_only_the_jobs_stacks_are_listed_and_offered(aws):
    cfn = boto3.client("cloudformation", region_name="us-east-1")
    job_stack(cfn, "llm")
    job_stack(cfn, "gone")
    cfn.delete_stack(StackName="dl-gone")
    body = json.dumps({"Resources": TOPIC})
    cfn.create_stack(StackName="dl-data-lake", TemplateBody=body)  # another team's, named like ours
    cfn.create_stack(StackName="dl-lake", TemplateBody=json.dumps({"Resources": TOPIC, "Outputs": {
        OUTPUT_JOB: {"Value": "data-lake"}}}))  # an output naming another stack's job
    cfn.create_stack(StackName="SC-123456789012-pp-abcdefgh", TemplateBody=body,
                     Tags=[{"Key": TAG_JOB, "Value": "llm"}])
    assert deployed_jobs(cfn) == ["llm"]


@pytest.mark.parametrize("verb", ["status", "logs", "shell", "destroy"])
@pytest.mark.parametrize("job,expected", [
    ("", "job '': a job name is 1-40 lower-case letters, digits and dashes"),
    ("Data_Lake", "closest: data-lake"),
    ("x" * 41, "closest: " + "x" * 40),
    ("../etc/passwd", "closest: etc-passwd"),
    ("dl-", "job 'dl-': a job name"),
    ("llm;rm -rf ~", "closest: llm-rm-rf"),
    ("a\x1b[2Jb", "job 'a\\x1b[2Jb'"),  # a terminal escape is shown escaped, never sent raw
    ("llm\u00e9", "job 'llm\\xe9'"),
])
def test_a_job_name_no_stack_can_have_is_one_line_before_any_aws_call(capsys, verb, job, expected):
    # no moto here: the tests' AWS endpoint is dead, so an AWS call would be a different line
    assert main([verb, job, "--region", "us-east-1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and expected in err, err
    assert "\x1b" not in err


@pytest.mark.parametrize("argv,expected", [
    (["shell", "llm", "--rank", "-1"], "argument --rank: '-1': a node's rank is a whole number from 0"),
    (["shell", "llm", "--rank", "one"], "argument --rank: 'one'"),
    (["logs", "llm", "--since", "0m"], "'0m' is not a duration"),
    (["logs", "llm", "--since", "1y"], "'1y' is not a duration"),
    (["status", "llm", "--region", "eu-centrall-1"], "unknown region 'eu-centrall-1'; closest: eu-central-1"),
    (["destroy", "llm", "--region", "us-east-1;x"], "unknown region 'us-east-1;x'; closest: us-east-1"),
    (["status", "llm", "--region", ""], "unknown region ''"),
])
def test_other_bad_arguments_are_one_line_before_any_aws_call(capsys, argv, expected):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and expected in err, err


def test_a_region_from_the_environment_that_is_no_region_says_where_it_came_from(capsys, monkeypatch):
    for var in ("CDK_DEFAULT_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_REGION", "us-eest-1")
    assert main(["status", "llm"]) == 2
    err = capsys.readouterr().err
    assert "unknown region 'us-eest-1'" in err and err.rstrip().endswith("(from AWS_REGION; --region NAME sets it)")


def test_valid_arguments_reach_the_job_s_stack(aws, capsys):
    """The same verbs with good input get past every check to the stack (moto has none)."""
    for argv in (["shell", "llm", "--rank", "0"], ["logs", "llm", "--since", "30m"], ["status", "dl-llm"],
                 ["destroy", "llm", "--region", "eu-central-1"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: no stack dl-llm in "), err
