"""A member's death, told to the nodes by the controller (issue 37 item 0): on EC2's state-change
event for a member that goes, the Lambda writes the gone record the nodes' liveness check reads,
before it reconciles. moto in-process; the record is read back with the node runtime's own
ClusterState.gone_nodes(), never by a restated key."""
from __future__ import annotations

import json

import boto3
import pytest

from constructs_lib.fleet import gone, handler
from constructs_lib.fleet.job_end import JOB_END_ENV, JobEndWatch
from constructs_lib.runtime.cluster import ClusterState
from constructs_lib.runtime.contract import GONE_DIR
from constructs_lib.runtime.store import CheckpointStore
from tests.fleet.conftest import BUCKET, REGION, Cloud, live_instances, recorded, state_change

PREFIX = "jobs/llm"
SCHEDULE = {"source": "aws.events", "detail-type": "Scheduled Event", "detail": {}}


@pytest.fixture
def spec(cloud, monkeypatch):
    """A job with a command: its checkpoints (and cluster records) in the state's bucket, as a product's."""
    spec = cloud.spec()
    monkeypatch.setenv(handler.SPEC_ENV, spec.to_json())
    monkeypatch.setenv(JOB_END_ENV, JobEndWatch(BUCKET, PREFIX).to_json())
    handler.handle(SCHEDULE, None)
    assert len(cloud.store(spec).load().members) == spec.nodes
    return spec


def _nodes_view(cloud: Cloud) -> ClusterState:
    """What every node of the job reads (the supervisor's own ClusterState)."""
    return ClusterState(CheckpointStore(BUCKET, PREFIX, client=cloud.s3))


def _objects(cloud: Cloud) -> dict[str, bytes]:
    listed = cloud.s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])
    return {o["Key"]: cloud.s3.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read() for o in listed}


def _puts_below_gone(calls) -> list[str]:
    return [p["Key"] for op, p in calls if op == "s3:PutObject" and f"/{GONE_DIR}/" in p["Key"]]


@pytest.mark.parametrize("state", ["stopping", "shutting-down", "terminated", "stopped"])
def test_a_member_that_goes_is_recorded_gone_for_every_node_before_the_reconcile(cloud, spec, state):
    doomed = sorted(cloud.store(spec).load().members)[0]
    cloud.raw.terminate_instances(InstanceIds=[doomed])
    got, calls = recorded(state_change(doomed, state))
    assert [t["kind"] for t in got["transitions"]] == ["replaced"], got
    assert _nodes_view(cloud).gone_nodes() == {doomed}, "every node's next look finds it"
    # The state's GET, then the record's PUT, then the reconcile: the nodes hear first.
    ops = [op for op, _ in calls]
    assert ops[:2] == ["s3:GetObject", "s3:PutObject"], ops
    (key,) = _puts_below_gone(calls)
    body = json.loads(_objects(cloud)[key])
    assert set(body) == {"node", "state", "at", "by"} and (body["node"], body["state"], body["by"]) == (
        doomed, state, "controller")
    assert isinstance(body["at"], float)


def test_telling_the_nodes_costs_one_put_per_member_that_goes(cloud, spec, monkeypatch):
    """What BENCHMARKS.md's per-event table counts: a loss told and one untold differ in S3 by the
    record's PUT alone (no read, no list); the write itself asks EC2 nothing (first test)."""
    import collections

    first, second = sorted(cloud.store(spec).load().members)[:2]
    cloud.raw.terminate_instances(InstanceIds=[first])
    with monkeypatch.context() as m:
        m.setattr(handler, "_tell_the_nodes", lambda *a: None)
        _, untold = recorded(state_change(first, "terminated"))
    cloud.raw.terminate_instances(InstanceIds=[second])
    _, told = recorded(state_change(second, "terminated"))
    # S3's alone: the reconcile's EC2 calls depend on what it finds (the first loss's replacement is still recent).
    count = lambda calls: collections.Counter(op for op, _ in calls if op.startswith("s3:"))  # noqa: E731
    assert count(told) - count(untold) == {"s3:PutObject": 1} and not count(untold) - count(told), (untold, told)
    assert _puts_below_gone(told) and not _puts_below_gone(untold)


def test_the_record_reads_as_a_nodes_own_does(cloud, spec):
    """The same shape as ClusterState.record_gone's, plus "by": the nodes cannot tell them apart by key."""
    doomed, other = sorted(cloud.store(spec).load().members)[:2]
    _nodes_view(cloud).record_gone(other, "terminated or unknown to EC2")
    recorded(state_change(doomed, "terminated"))
    bodies = {json.loads(b)["node"]: json.loads(b) for k, b in _objects(cloud).items() if f"/{GONE_DIR}/" in k}
    assert set(bodies) == {doomed, other} == _nodes_view(cloud).gone_nodes()
    assert set(bodies[doomed]) - set(bodies[other]) == {"by"}


def test_a_non_members_event_writes_nothing(cloud, spec):
    before = _objects(cloud)
    other = cloud.raw.run_instances(ImageId="ami-12c6146b", InstanceType="g5.xlarge", MinCount=1, MaxCount=1,
                                    SubnetId=cloud.subnets[0])["Instances"][0]["InstanceId"]
    cloud.raw.terminate_instances(InstanceIds=[other])
    got, calls = recorded(state_change(other, "terminated"))
    assert "ignored" in got and [op for op, _ in calls] == ["s3:GetObject"], calls
    assert _objects(cloud) == before and _nodes_view(cloud).gone_nodes() == set()


@pytest.mark.parametrize("state", ["pending", "running"])
def test_a_member_coming_up_writes_nothing(cloud, spec, state):
    member = sorted(cloud.store(spec).load().members)[0]
    got, calls = recorded(state_change(member, state))
    assert "ignored" in got and [op for op, _ in calls] == ["s3:GetObject"], calls
    assert _nodes_view(cloud).gone_nodes() == set()


def test_a_spot_warning_is_no_death(cloud, spec):
    """Two minutes' notice: the node saves and leaves by itself; it is not gone yet."""
    warned = live_instances(cloud.raw)[0]["InstanceId"]
    got, calls = recorded({"source": "aws.ec2", "detail-type": handler.SPOT_WARNING,
                          "detail": {"instance-id": warned, "instance-action": "terminate"}})
    assert [t["kind"] for t in got["transitions"]] == ["replaced"] and not _puts_below_gone(calls)
    assert _nodes_view(cloud).gone_nodes() == set()


@pytest.mark.parametrize("refuse", ["AccessDenied", "SlowDown", "InternalError"])
def test_a_record_s3_refuses_never_stops_the_reconcile(cloud, spec, refuse, capsys):
    doomed = sorted(cloud.store(spec).load().members)[0]
    cloud.raw.terminate_instances(InstanceIds=[doomed])
    got, calls = recorded(state_change(doomed, "shutting-down"), refuse=(refuse, f"/{GONE_DIR}/"))
    assert [t["kind"] for t in got["transitions"]] == ["replaced"], got
    assert cloud.types() == {"p5.48xlarge": spec.nodes}
    assert _nodes_view(cloud).gone_nodes() == set(), "the heartbeats remain the nodes' backstop"
    said = [line for line in capsys.readouterr().out.splitlines() if "could not record" in line]
    assert len(said) == 1 and doomed in said[0] and refuse in said[0], said


def test_a_missing_bucket_never_stops_the_reconcile(cloud, spec, monkeypatch, capsys):
    monkeypatch.setenv(JOB_END_ENV, JobEndWatch("dl-no-such-bucket", PREFIX).to_json())
    doomed = sorted(cloud.store(spec).load().members)[0]
    cloud.raw.terminate_instances(InstanceIds=[doomed])
    got, _ = recorded(state_change(doomed, "terminated"))
    assert "replaced" in [t["kind"] for t in got["transitions"]], got
    assert "NoSuchBucket" in capsys.readouterr().out


def test_a_job_without_a_command_has_no_generations_to_tell(cloud, spec, monkeypatch):
    monkeypatch.delenv(JOB_END_ENV)
    doomed = sorted(cloud.store(spec).load().members)[0]
    cloud.raw.terminate_instances(InstanceIds=[doomed])
    got, calls = recorded(state_change(doomed, "terminated"))
    assert [t["kind"] for t in got["transitions"]] == ["replaced"] and not _puts_below_gone(calls)


@pytest.mark.parametrize("node", ["../../_control/llm-7b/capacity-state", "i-0abc/../x", "i-0123456789abcdef0\n",
                                  "", None, ["i-0123456789abcdef0"], "i-" + "0" * 300])
def test_an_id_that_is_not_an_instance_id_writes_nothing(aws, node):
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket=BUCKET)
    said: list[str] = []
    assert gone.record_gone(s3, JobEndWatch(BUCKET, PREFIX), node, "terminated", log=said.append) is False
    assert s3.list_objects_v2(Bucket=BUCKET).get("KeyCount") == 0
    assert len(said) == 1 and "is not an instance id" in said[0] and len(said[0]) < 200 and "\n" not in said[0]


def test_a_state_that_is_no_death_writes_nothing(aws):
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket=BUCKET)
    for state in ("pending", "running", "../x", None):
        assert gone.record_gone(s3, JobEndWatch(BUCKET, PREFIX), "i-0123456789abcdef0", state) is False
    assert s3.list_objects_v2(Bucket=BUCKET).get("KeyCount") == 0
