"""The `dl-launcher` console script as a user meets it: installed by the README's set-up, every
verb with its --help, the selector's verbs unchanged, and every mistake one line, exit 2."""
from __future__ import annotations

import json
import subprocess

import boto3
import pytest

from tests.cli.conftest import CONSOLE, ROOT, job_stack, run

VERBS = ("recommend", "profiles", "catalog", "bench", "preflight", "status", "logs", "shell", "destroy")


def test_the_console_script_is_installed_and_lists_every_verb_with_examples():
    assert CONSOLE.exists(), "pyproject [project.scripts] dl-launcher, installed by scripts/bootstrap.sh"
    r = run("--help")
    assert r.returncode == 0 and r.stdout.startswith("usage: dl-launcher")
    assert "Examples:" in r.stdout and "dl-launcher destroy multi-node-training" in r.stdout
    for verb in VERBS:
        assert f"    {verb}" in r.stdout, verb


@pytest.mark.parametrize("verb", VERBS)
def test_every_verb_has_help(verb):
    r = run(verb, "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: dl-launcher"), r.stdout[:200]


def test_recommend_is_the_selectors_answer_in_the_users_region():
    r = run("recommend", "--profile", "single-gpu-training", "--json", AWS_DEFAULT_REGION="us-west-2")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["region"] == "us-west-2", "the region follows the AWS environment"
    pinned = run("recommend", "--profile", "single-gpu-training", "--json", "--region", "us-east-1",
                 AWS_DEFAULT_REGION="us-west-2")
    assert json.loads(pinned.stdout)["region"] == "us-east-1"


@pytest.mark.parametrize("argv,expected", [
    (["statu", "x"], "invalid choice: 'statu'"),
    (["destroy"], "the following arguments are required: job"),
    (["status", "x", "--jsn"], "closest: --json"),
    (["preflight", "--profile", "multi-node-trainin"], "unknown profile 'multi-node-trainin'; closest: multi-node-training"),
    (["preflight", "--profile", "training", "--region", "eu-centrall-1"], "closest: eu-central-1"),
    (["preflight", "--profile", "training", "--nodes", "0"], "nodes"),
    (["recommend", "--profile", "nope"], "unknown profile 'nope'"),
])
def test_mistakes_are_one_line_exit_2(argv, expected):
    r = run(*argv)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr
    assert expected in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_mistake_before_any_aws_call_is_one_line_without_jsii_banners():
    """launch builds the stack in-process (jsii and Node); destroy's confirmation is asked for
    before AWS is; the tests' own environment silences jsii, a user's does not."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION"}
    for argv, expected in ((["launch", "-c", "profile=training", "-c", "job=Bad_Name", "--yes"],
                            "error: context job='Bad_Name': use 1-40 lower-case letters"),
                           (["destroy", "llm", "--delete-checkpoints"],
                            "error: --delete-checkpoints deletes every checkpoint for good: pass --yes")):
        r = subprocess.run([str(CONSOLE), *argv], cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)},
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith(expected), r.stderr[-2000:]
    # preflight builds the stack too, then reports (no AWS here: its credentials check fails)
    r = subprocess.run([str(CONSOLE), "preflight", "--profile", "dev-prototyping"], cwd=ROOT,
                       env={**env, "PYTHONPATH": str(ROOT)}, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=300)
    assert r.stdout.startswith("preflight: 1 x ") and "b'!!" not in r.stdout + r.stderr, (r.stdout + r.stderr)[-2000:]


def test_a_job_with_no_stack_names_the_deployed_ones_and_only_those(moto_endpoint):
    """Another team's dl-llm-7c (no dl-launcher mark) is neither offered as the closest name nor
    listed as a job; a verb naming it is one line and leaves it alone."""
    cfn = boto3.client("cloudformation", region_name="us-east-1", endpoint_url=moto_endpoint)
    job_stack(cfn, "llm-7b")
    cfn.create_stack(StackName="dl-llm-7c", TemplateBody=json.dumps({"Resources": {"T": {"Type": "AWS::SNS::Topic"}}}))
    try:
        for verb in ("status", "destroy", "logs", "shell"):
            r = run(verb, "llm-7", endpoint=moto_endpoint)
            assert r.returncode == 2 and r.stderr.count("\n") == 1, (verb, r.stderr)
            assert "no stack dl-llm-7 in us-east-1 (job 'llm-7'); closest: llm-7b; deployed jobs there: llm-7b;" in r.stderr
            r = run(verb, "llm-7c", endpoint=moto_endpoint)
            assert r.returncode == 2 and r.stderr.count("\n") == 1, (verb, r.stderr)
            assert r.stderr.startswith("error: stack dl-llm-7c in us-east-1 was not made by dl-launcher"), r.stderr
        assert cfn.describe_stacks(StackName="dl-llm-7c")["Stacks"][0]["StackStatus"] == "CREATE_COMPLETE"
    finally:
        cfn.delete_stack(StackName="dl-llm-7b")
        cfn.delete_stack(StackName="dl-llm-7c")


def test_shell_rank_beyond_the_cluster_is_one_line_and_counts_only_its_stacks_nodes(moto_endpoint):
    """Two nodes carry the cluster name dl-shelly; only one carries this stack's id (TAG_STACK)."""
    from constructs_lib.runtime.contract import TAG_CLUSTER, TAG_STACK

    cfn = boto3.client("cloudformation", region_name="us-east-1", endpoint_url=moto_endpoint)
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=moto_endpoint)
    stack = job_stack(cfn, "shelly")
    other = "arn:aws:cloudformation:us-east-1:123456789012:stack/SC-123456789012-pp-abcdef/22222222-2222-2222-2222-222222222222"
    ids = [ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1, InstanceType="p5.48xlarge", TagSpecifications=[
        {"ResourceType": "instance", "Tags": [{"Key": TAG_CLUSTER, "Value": "dl-shelly"}, {"Key": TAG_STACK, "Value": s}]}]
        )["Instances"][0]["InstanceId"] for s in (stack, other)]
    try:
        r = run("shell", "shelly", "--rank", "1", endpoint=moto_endpoint)
        assert r.returncode == 2 and r.stderr == "error: --rank 1: the cluster has 1 running node(s): 0-0\n", r.stderr
    finally:
        ec2.terminate_instances(InstanceIds=ids)
        cfn.delete_stack(StackName="dl-shelly")
