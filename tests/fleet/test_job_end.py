"""The bill ends when the job does (issue 34 item 3): once the nodes record that the job finished
or failed for good, the controller terminates the cluster (on_end=stop) or keeps it (keep), never
launches again, and `dl-launcher status` starts with the job's state.

moto in-process; the records are written by the node runtime's own ClusterState (what the
supervisor calls), not by hand, except where a test forges or breaks one on purpose."""
from __future__ import annotations

import dataclasses
import json

import boto3
import pytest
from botocore.exceptions import ClientError

from constructs_lib.fleet import Controller, handler
from constructs_lib.fleet.job_end import JOB_END_ENV, JobEndWatch
from constructs_lib.runtime.cluster import ClusterState
from constructs_lib.runtime.contract import capacity_state_key
from constructs_lib.runtime.store import CheckpointStore
from dl_launcher.cli import main
from tests.cli.conftest import job_stack
from tests.fleet.conftest import BUCKET, Cloud, live_instances

PREFIX = "jobs/t"


def _setup(cloud: Cloud, on_end: str = "stop", nodes: int = 2):
    stack = job_stack(boto3.client("cloudformation", region_name="us-east-1"), "t", {"CheckpointBucket": BUCKET})
    spec = dataclasses.replace(cloud.spec(nodes=nodes, stack=stack), cluster="dl-t", state_key=capacity_state_key("dl-t"))
    return spec, _controllers(cloud, spec, on_end)


def _controllers(cloud: Cloud, spec, on_end: str):
    """A new Controller per run, as each Lambda invocation builds its own."""
    watch = JobEndWatch(BUCKET, PREFIX, on_end)
    return lambda: Controller(cloud.ec2, spec, cloud.store(spec), log=cloud.logs.append, job_end=watch)


def _nodes_records(cloud: Cloud) -> ClusterState:
    return ClusterState(CheckpointStore(BUCKET, PREFIX, client=cloud.s3))


def _running(cloud: Cloud) -> list[str]:
    return [i["InstanceId"] for i in live_instances(cloud.raw, "dl-t")]


def _status(capsys, *extra: str) -> str:
    capsys.readouterr()
    assert main(["status", "t", *extra]) == 0
    return capsys.readouterr().out


def test_a_finished_job_terminates_its_nodes_and_status_says_finished_at_its_step(cloud, capsys):
    spec, ctl = _setup(cloud)
    ctl().reconcile()
    first = _running(cloud)
    assert len(first) == 2
    assert _status(capsys).startswith("job: starting (no generation formed yet); no complete checkpoint yet\n")

    _nodes_records(cloud).mark_finished(generation=3, node=first[0], step=1200)  # as the supervisor does
    done = ctl().reconcile()
    assert [t.kind for t in done] == ["job-ended", "terminated-ended"]
    assert _running(cloud) == [], "every node of the finished job is terminated"
    assert cloud.s3.list_objects_v2(Bucket=BUCKET, Prefix=f"{PREFIX}/")["KeyCount"] >= 1, "the job's prefix stays"

    asked = len(cloud.ec2.requests)
    for _ in range(3):  # the schedule and the terminations' own events: nothing is launched again
        ctl().reconcile()
    assert len(cloud.ec2.requests) == asked and _running(cloud) == []

    out = _status(capsys)
    lines = out.splitlines()
    assert lines[0].startswith("job: finished at step 1200 (generation 3, ")
    assert lines[1] == f"  on_end=stop: the nodes are terminated; checkpoints stay in s3://{BUCKET}/{PREFIX}/"
    assert any(line.startswith("cluster dl-t: stopped with the job; 0 running") for line in lines)
    body = json.loads(_status(capsys, "--json"))
    assert body["job"]["state"] == "finished" and body["job"]["step"] == 1200 and body["job"]["acted"] is True


def test_a_failed_job_terminates_its_nodes_and_status_shows_attempts_and_last_lines(cloud, capsys):
    spec, ctl = _setup(cloud)
    ctl().reconcile()
    node = _running(cloud)[0]
    tail = [f"step {i} loss 2.{i}" for i in range(25)] + ["RuntimeError: CUDA error: out of memory"]
    _nodes_records(cloud).mark_failed(generation=4, node=node, attempts=3, last_lines=tail[-20:],
                                      reason="the command failed 3 times in a row without a newer checkpoint (exit 1)")
    ctl().reconcile()
    assert _running(cloud) == []
    lines = _status(capsys).splitlines()
    assert lines[0].startswith("job: failed after 3 attempts (generation 4, ")
    assert lines[0].endswith("): the command failed 3 times in a row without a newer checkpoint (exit 1)")
    shown = [line[4:] for line in lines if line.startswith("  | ")]
    assert shown == tail[-20:] and shown[-1] == "RuntimeError: CUDA error: out of memory"


def test_on_end_keep_leaves_the_nodes_running_replaces_none_and_status_says_so(cloud, capsys):
    spec, ctl = _setup(cloud, on_end="keep")
    ctl().reconcile()
    kept = sorted(_running(cloud))
    _nodes_records(cloud).mark_finished(generation=1, node=kept[0], step=10)
    assert [t.kind for t in ctl().reconcile()] == ["job-ended"]
    assert sorted(_running(cloud)) == kept
    cloud.raw.terminate_instances(InstanceIds=[kept[0]])  # a reclamation after the end: no replacement
    asked = len(cloud.ec2.requests)
    ctl().reconcile()
    assert len(cloud.ec2.requests) == asked and _running(cloud) == kept[1:]
    out = _status(capsys)
    assert "1 node(s) kept for debugging (on_end=keep): nothing is replaced; `dl-launcher destroy` ends the bill" in out

    # Redeployed with on_end=stop: the deployed setting holds, the kept node goes.
    _controllers(cloud, spec, "stop")().reconcile()
    assert _running(cloud) == []


def test_a_throttled_termination_is_retried_and_nothing_launches_meanwhile(cloud):
    spec, ctl = _setup(cloud)
    ctl().reconcile()
    nodes = _running(cloud)
    _nodes_records(cloud).mark_finished(generation=1, node=nodes[0], step=5)
    refusals = []

    def throttled(**kw):
        refusals.append(kw["InstanceIds"])
        raise ClientError({"Error": {"Code": "RequestLimitExceeded", "Message": "Request limit exceeded."}},
                          "TerminateInstances")

    cloud.ec2.terminate_instances = throttled
    done = ctl().reconcile()
    assert [t.kind for t in done] == ["job-ended", "waiting"] and "RequestLimitExceeded" in done[-1].reason
    assert sorted(_running(cloud)) == sorted(nodes) and refusals
    state = cloud.store(spec).load()
    assert state.ended["kind"] == "finished", "the end is stored before the termination is tried"
    asked = len(cloud.ec2.requests)
    del cloud.ec2.terminate_instances  # AWS answers again
    assert [t.kind for t in ctl().reconcile()] == ["terminated-ended"]
    assert _running(cloud) == [] and len(cloud.ec2.requests) == asked


def test_a_job_without_a_command_never_ends_even_with_a_forged_record(cloud, capsys):
    spec = dataclasses.replace(cloud.spec(nodes=2), cluster="dl-t", state_key=capacity_state_key("dl-t"))
    _setup(cloud)  # the stack's outputs
    cloud.controller(spec).reconcile()  # no job_end: deployed without a command
    _nodes_records(cloud).mark_finished(generation=1, node="i-forged", step=1)
    cloud.raw.terminate_instances(InstanceIds=[_running(cloud)[0]])
    cloud.controller(spec).reconcile()
    assert len(_running(cloud)) == 2, "a lost node is still replaced"
    assert _status(capsys).startswith("job: none (no command): the nodes wait for you and never end by themselves")


BROKEN = [
    ("not JSON", b"{\"at\": 1", "not JSON"),
    ("a list", b"[1, 2]", "not an object with a time `at`"),
    ("no time", b"{\"step\": 5}", "not an object with a time `at`"),
    ("a text time", b"{\"at\": \"yesterday\"}", "not an object with a time `at`"),
    ("an infinite time", b"{\"at\": 1e999}", "not an object with a time `at`"),
    ("a boolean time", b"{\"at\": true}", "not an object with a time `at`"),
    ("not UTF-8", b"\xff\xfe{}", "not JSON"),
    ("too big", b"{\"at\": 1, \"reason\": \"" + b"x" * 70000 + b"\"}", "more than the 65536 any supervisor writes"),
]


@pytest.mark.parametrize("body,why", [(b, w) for _, b, w in BROKEN], ids=[n for n, _, _ in BROKEN])
def test_a_malformed_record_is_set_aside_never_a_crash_and_never_an_end(cloud, capsys, body, why):
    spec, ctl = _setup(cloud)
    ctl().reconcile()
    cloud.s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}/_cluster/finished.json", Body=body)
    ctl().reconcile()
    assert len(_running(cloud)) == 2
    assert any('"job-record-set-aside"' in line and why in line for line in cloud.logs), cloud.logs[-3:]
    assert _status(capsys).startswith("job: starting")


def test_a_forged_record_is_shown_cleaned_and_cut_to_size(cloud, capsys):
    """A node may write any record: its text reaches status without terminal escapes, its fields
    of the wrong type are dropped, its lines are cut to size."""
    spec, ctl = _setup(cloud)
    ctl().reconcile()
    cloud.s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}/_cluster/failed.json", Body=json.dumps({
        "at": 1.7e9, "generation": "7", "attempts": -2, "reason": "\x1b[2J\x1b]0;owned\x07gone" + "y" * 900,
        "last_lines": ["ok", 5, {"a": 1}, "\x1b[31mred\x1b[0m", "z" * 5000] + ["more"] * 50}).encode())
    ctl().reconcile()
    assert _running(cloud) == [], "a forged end ends its own cluster (the documented risk)"
    out = _status(capsys)
    assert "\x1b" not in out and "\x07" not in out
    first = out.splitlines()[0]
    assert first.startswith("job: failed (2023-11-14T22:13:20Z): ") and len(first) < 600
    shown = [line[4:] for line in out.splitlines() if line.startswith("  | ")]
    assert len(shown) == 20 and all(len(s) <= 300 for s in shown)


def test_resume_reads_the_records_again(cloud):
    spec, ctl = _setup(cloud)
    ctl().reconcile()
    _nodes_records(cloud).mark_finished(generation=1, node="i-0", step=5)
    ctl().reconcile()
    assert _running(cloud) == []
    assert [t.kind for t in ctl().reconcile(resume=True)] == ["job-ended"], "still finished: nothing launches"
    assert _running(cloud) == []
    cloud.s3.delete_object(Bucket=BUCKET, Key=f"{PREFIX}/_cluster/finished.json")
    ctl().reconcile(resume=True)
    assert len(_running(cloud)) == 2


def test_the_lambda_reads_where_the_job_ends_from_its_environment(cloud, monkeypatch):
    spec, _ = _setup(cloud)
    monkeypatch.setenv(handler.SPEC_ENV, spec.to_json())
    monkeypatch.setenv(JOB_END_ENV, JobEndWatch(BUCKET, PREFIX, "stop").to_json())
    handler.handle({"detail-type": "Scheduled Event", "detail": {}}, None)
    nodes = _running(cloud)
    assert len(nodes) == 2
    _nodes_records(cloud).mark_failed(generation=1, node=nodes[0], reason="setup failed", last_lines=["pip: error"])
    kinds = [t["kind"] for t in handler.handle({"detail-type": "Scheduled Event", "detail": {}}, None)["transitions"]]
    assert kinds == ["job-ended", "terminated-ended"] and _running(cloud) == []
    monkeypatch.setenv(JOB_END_ENV, '{"bucket": "b", "prefix": "jobs/t", "on_end": "kep"}')
    with pytest.raises(ValueError, match="on_end 'kep': allowed stop, keep"):
        handler.load_job_end()


def test_status_shows_a_running_job_by_generation_and_step_and_a_restore_from_the_nodes_metric(cloud, capsys, tmp_path):
    import time

    from constructs_lib.runtime import contract
    from constructs_lib.runtime.cluster import Member, Plan

    spec, ctl = _setup(cloud)
    ctl().reconcile()
    a, b = sorted(_running(cloud))
    records = _nodes_records(cloud)
    (tmp_path / "model.pt").write_bytes(b"weights")
    records.store.push(str(tmp_path), 300)
    records.propose(Plan(2, (Member(a, "10.0.0.1"), Member(b, "10.0.0.2")), resume_step=300))
    assert _status(capsys).startswith("job: running (generation 2, 2 node(s)); newest complete step 300\n")
    cw = boto3.client("cloudwatch", region_name="us-east-1")
    cw.put_metric_data(Namespace=contract.NS_JOB, MetricData=[{
        "MetricName": contract.M_RESTORING, "Value": 1.0, "Timestamp": time.time(),
        "Dimensions": [{"Name": contract.DIM_JOB, "Value": "dl-t"}, {"Name": contract.DIM_INSTANCE, "Value": a}]}])
    assert _status(capsys).startswith("job: restoring step 300 (generation 2, 2 node(s))\n")
    # A plan a node broke: status still answers, with the reason.
    cloud.s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}/_cluster/gen-000003/plan.json", Body=b'{"generation": 3}')
    assert _status(capsys).startswith(f"job: running; its records in s3://{BUCKET}/{PREFIX}/ could not be read (")
