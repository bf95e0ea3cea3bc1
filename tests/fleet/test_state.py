"""The controller's state and its lease in S3 (moto), including the races the lease exists for."""
from __future__ import annotations

import threading

import pytest

from constructs_lib.fleet import ControllerState, StateStore
from constructs_lib.fleet.state import HISTORY, LEASE_SECONDS, LeaseLost
from tests.fleet.conftest import BUCKET


def _store(cloud) -> StateStore:
    return StateStore(cloud.s3, BUCKET, "_control/x/capacity-state.json")


def test_state_round_trip_keeps_the_last_200_transitions(cloud):
    store = _store(cloud)
    assert store.load() is None
    lease, state = store.acquire(1000.0)
    assert state == ControllerState(lease_until=1000.0 + LEASE_SECONDS), "the first run starts from nothing"
    state.instance_type, state.loss_since, state.noticed = "p5.48xlarge", 5.0, {"i-1": 3.0}
    for n in range(HISTORY + 7):
        state.record({"at": float(n), "kind": "waiting"})
    store.save(lease, state, release=True)
    again = store.load()
    assert again == state and again.lease_until == 0.0
    assert len(again.history) == HISTORY and again.history[0]["at"] == 7.0


def test_a_newer_controller_s_fields_are_ignored_not_fatal():
    assert ControllerState.from_json('{"cluster": "x", "from_the_future": 1}') == ControllerState(cluster="x")


def test_one_holder_at_a_time_and_an_expired_lease_is_taken_over_once(cloud):
    now = 1000.0
    first, _ = _store(cloud).acquire(now)
    assert first.until == now + LEASE_SECONDS
    assert _store(cloud).acquire(first.until - 1) is None, "held"
    racers = [_store(cloud) for _ in range(8)]
    start, got = threading.Barrier(len(racers)), []

    def take(store):
        start.wait()
        got.append(store.acquire(first.until + 1))

    threads = [threading.Thread(target=take, args=(s,)) for s in racers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len([g for g in got if g]) == 1, "exactly one run takes an expired lease over"


def test_the_first_lease_ever_is_taken_once(cloud):
    racers = [_store(cloud) for _ in range(8)]
    start, got = threading.Barrier(len(racers)), []

    def take(store):
        start.wait()
        got.append(store.acquire(0.0))

    threads = [threading.Thread(target=take, args=(s,)) for s in racers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len([g for g in got if g]) == 1


def test_a_run_that_outlived_its_lease_cannot_overwrite_the_new_holder(cloud):
    old_lease, old_state = _store(cloud).acquire(0.0)
    new_lease, new_state = _store(cloud).acquire(old_lease.until + 1)
    new_state.instance_type = "p5en.48xlarge"
    new_lease = _store(cloud).save(new_lease, new_state)
    old_state.instance_type = "p5.48xlarge"
    with pytest.raises(LeaseLost, match="taken over"):
        _store(cloud).save(old_lease, old_state, release=True)
    assert _store(cloud).load().instance_type == "p5en.48xlarge"
    _store(cloud).save(new_lease, new_state, release=True)
    assert _store(cloud).acquire(1.0) is not None, "released: free at once"
