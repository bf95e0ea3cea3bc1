"""`dl-launcher status JOB` finds the job's stack, its checkpoint bucket and the controller's
state, and shows a shortfall after one controller run (issue 24: a deploy that completes and
then waits must say why). moto in-process, the fleet tests' flaky EC2."""
from __future__ import annotations

import dataclasses
import json

import boto3

from constructs_lib.runtime.contract import capacity_state_key
from dl_launcher.cli import main
from tests.fleet.conftest import BUCKET, VCPU_LIMIT, Cloud


def test_status_by_job_name_shows_the_quota_shortfall_after_one_run(aws, capsys):
    cloud = Cloud()
    spec = dataclasses.replace(cloud.spec(), cluster="dl-t", state_key=capacity_state_key("dl-t"))
    for t in ("p5.48xlarge", "p5en.48xlarge", "p4d.24xlarge"):
        cloud.ec2.unavailable.add(t)
        cloud.ec2.answer[t] = VCPU_LIMIT
    cloud.controller(spec).reconcile()
    boto3.client("cloudformation", region_name="us-east-1").create_stack(StackName="dl-t", TemplateBody=json.dumps({
        "Resources": {"T": {"Type": "AWS::SNS::Topic"}}, "Outputs": {"CheckpointBucket": {"Value": BUCKET}}}))
    capsys.readouterr()
    assert main(["status", "t"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("cluster dl-t: current type none (nothing launched); 0 running")
    (short,) = [line for line in out.splitlines() if line.startswith("short: ")]
    assert short.startswith("short: 4 x p4d.24xlarge (spot): quota: VcpuLimitExceeded")
    assert main(["status", "t", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["short"]["kind"] == "quota"
