"""The lease's conditional write, raced deterministically (issue 35 item 9): two controllers both
read the state before either writes it, and exactly one launches.

No threads and no timing: controller A's read of the state object runs controller B's whole
reconcile before A's read returns, so the order is fixed: A reads, B reads, B writes and launches,
then A writes. Only the write's condition (If-None-Match: * for the first state ever, If-Match on
the ETag read after that) can stop A now. A's EC2 view lags B's launch, as DescribeInstances does
for a launch seconds old (the EC2 API reference's "eventual consistency"): without the condition
A would launch a second cluster. moto 5 answers a failed condition with 412 PreconditionFailed as
S3 does (checked first below, so that a moto that ignored it reads as that, not as a lost race).
"""
from __future__ import annotations

from typing import Any, Callable

import boto3
import pytest

from constructs_lib.fleet import StateStore
from tests.fleet.conftest import BUCKET, CLUSTER, REGION, Clock, FlakyEc2, live_instances

P5 = "p5.48xlarge"


class ReadHook:
    """The S3 client, except that after the first read of `key` (found or NoSuchKey) it calls `then()` once."""

    def __init__(self, client: Any, key: str, then: Callable[[], Any]) -> None:
        self._client, self._key, self._then = client, key, then
        self.fired = False

    def get_object(self, **kw: Any) -> Any:
        try:
            return self._client.get_object(**kw)
        finally:
            if kw.get("Key") == self._key and not self.fired:
                self.fired = True
                self._then()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def test_moto_refuses_a_put_whose_condition_fails(cloud):
    """What the race below rests on: S3's (and moto's) answer to a failed If-Match / If-None-Match."""
    s3 = cloud.s3
    etag = s3.put_object(Bucket=BUCKET, Key="k", Body=b"1", IfNoneMatch="*")["ETag"]
    for condition in ({"IfNoneMatch": "*"}, {"IfMatch": '"0123456789abcdef0123456789abcdef"'}):
        with pytest.raises(Exception) as e:
            s3.put_object(Bucket=BUCKET, Key="k", Body=b"2", **condition)
        assert e.value.response["Error"]["Code"] == "PreconditionFailed", condition
    assert s3.put_object(Bucket=BUCKET, Key="k", Body=b"3", IfMatch=etag)["ETag"] != etag


@pytest.mark.parametrize("before", ["no state yet (If-None-Match)", "a released state (If-Match)"])
def test_two_controllers_that_read_before_either_writes_launch_once(cloud, before):
    clock = Clock()
    spec = cloud.spec()
    if before.startswith("a released"):
        lease, state = cloud.store(spec).acquire(clock.now - 3600)
        cloud.store(spec).save(lease, state, release=True)  # an earlier run's state, lease given up
    first_etag = _etag(cloud, spec.state_key)

    ec2_a = FlakyEc2(boto3.client("ec2", region_name=REGION))
    ec2_b = FlakyEc2(boto3.client("ec2", region_name=REGION))
    b = cloud.controller(spec, clock, ec2=ec2_b)
    b_done: list = []

    def b_runs_whole():
        assert _etag(cloud, spec.state_key) == first_etag, "B reads what A read: nothing was written yet"
        b_done.extend(b.reconcile())
        # A's DescribeInstances does not show B's launch yet (seconds old)
        ec2_a.hidden.update(i["InstanceId"] for i in live_instances(cloud.raw))

    store_a = StateStore(ReadHook(cloud.s3, spec.state_key, b_runs_whole), spec.state_bucket, spec.state_key)
    a = cloud.controller(spec, clock, ec2=ec2_a)
    a.store = store_a
    a_done = a.reconcile()

    assert store_a.s3.fired and [t.kind for t in b_done] == ["launched"]
    assert [t.kind for t in a_done] == ["waiting"] and "holds the lease" in a_done[0].reason, a_done
    assert ec2_a.requests == [], "A lost the write and asked EC2 for nothing"
    assert len(ec2_b.requests) == 1
    assert cloud.types() == {P5: spec.nodes}, "one cluster, not two"
    stored = cloud.store(spec).load()
    assert stored.instance_type == P5 and stored.lease_until == 0.0 and stored.cluster == CLUSTER
    assert [h["kind"] for h in stored.history] == ["launched"], "B's state stands; A wrote nothing"


def _etag(cloud, key: str):
    try:
        return cloud.s3.head_object(Bucket=BUCKET, Key=key)["ETag"]
    except Exception:
        return None
