"""`dl-launcher status JOB` finds the job's stack, its checkpoint bucket and the controller's
state, and shows a shortfall after one controller run (issue 24: a deploy that completes and
then waits must say why). moto in-process, the fleet tests' flaky EC2."""
from __future__ import annotations

import dataclasses
import json

import boto3

from constructs_lib.runtime.contract import capacity_state_key
from dl_launcher.cli import main
from tests.cli.conftest import job_stack
from tests.fleet.conftest import BUCKET, VCPU_LIMIT, Cloud


def test_status_by_job_name_shows_the_quota_shortfall_after_one_run(aws, capsys):
    cloud = Cloud()
    stack = job_stack(boto3.client("cloudformation", region_name="us-east-1"), "t", {"CheckpointBucket": BUCKET})
    spec = dataclasses.replace(cloud.spec(stack=stack), cluster="dl-t", state_key=capacity_state_key("dl-t"))
    for t in ("p5.48xlarge", "p5en.48xlarge", "p4d.24xlarge"):
        cloud.ec2.unavailable.add(t)
        cloud.ec2.answer[t] = VCPU_LIMIT
    cloud.controller(spec).reconcile()
    capsys.readouterr()
    assert main(["status", "t"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1].startswith("cluster dl-t: current type none (nothing launched); 0 running")
    (short,) = [line for line in out.splitlines() if line.startswith("short: ")]
    assert short.startswith("short: 4 x p4d.24xlarge (spot): quota: VcpuLimitExceeded")
    assert main(["status", "t", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["short"]["kind"] == "quota"


def test_status_prices_the_running_nodes_and_shows_the_idle_guard_warning(aws, capsys):
    """Two nodes at the CostModel's $40/h plus $0.05/h each, $0.10/h fixed: $80.20/h now; the
    guard's pending warning says when it stops and why."""
    import time

    from constructs_lib.fleet import idle_notice
    from constructs_lib.runtime.contract import guard_state_key

    cloud = Cloud()
    model = json.dumps({"as_of": "AWS list prices of 2026-11-25", "fixed_per_hour": 0.10, "per_node_hour": 0.05,
                        "instance_per_node_hour": {"p5.48xlarge": 40.0}})
    stack = job_stack(boto3.client("cloudformation", region_name="us-east-1"), "t",
                      {"CheckpointBucket": BUCKET, "CostModel": model})
    spec = dataclasses.replace(cloud.spec(nodes=2, stack=stack), cluster="dl-t", state_key=capacity_state_key("dl-t"))
    cloud.controller(spec).reconcile()
    # Another stack's cluster of the same name (a job of that name elsewhere, a product): neither
    # listed nor priced
    other = "arn:aws:cloudformation:us-east-1:123456789012:stack/SC-123456789012-pp-abcdef/22222222-2222-2222-2222-222222222222"
    theirs = dataclasses.replace(spec, stack=other, state_key=capacity_state_key("dl-t") + ".other")
    cloud.controller(theirs).reconcile()
    now = time.time()
    idle_notice.save(cloud.s3, BUCKET, guard_state_key("dl-t"), idle_notice.GuardRecord(
        checked_at=now, mode="interactive", state="idle", reason="no session open for 30 min", act="warn",
        warned_at=now, stop_at=now + 15 * 60))
    capsys.readouterr()
    assert main(["status", "t"]) == 0
    out = capsys.readouterr().out
    assert "cluster dl-t: current type p5.48xlarge; 2 running;" in out, out
    (cost,) = [line for line in out.splitlines() if line.startswith("cost: ")]
    assert cost.startswith("cost: $80.20/h now ($1,924.80/day); about $")
    so_far = float(cost.split("about $")[1].split(" ")[0].replace(",", ""))
    assert 0 <= so_far < 1.0, "launched seconds ago"
    (guard,) = [line for line in out.splitlines() if line.startswith("idle guard")]
    assert "interactive cluster" in guard and "stops at" in guard and "(15 min)" in guard
    assert "no session open for 30 min" in guard
    assert main(["status", "t", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["cost"]["per_hour"] == 80.2 and body["idle_guard"]["act"] == "warn"
    assert len(body["instances"]) == 2
