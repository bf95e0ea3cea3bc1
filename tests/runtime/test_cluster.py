"""The agreed membership: plan choice, the conditional write in S3, liveness from EC2."""
from __future__ import annotations

import threading
import time

import boto3
import pytest

from constructs_lib.runtime import contract, rendezvous
from constructs_lib.runtime.cluster import ClusterState, Liveness, Member, Plan, choose_members, unaccounted


def _joins(**addrs_at) -> dict[str, dict]:
    return {n: {"node": n, "addr": a, "at": t} for n, (a, t) in addrs_at.items()}


def test_survivors_keep_their_ranks_and_newcomers_follow_in_join_order():
    previous = Plan(4, (Member("i-a", "10.0.0.9"), Member("i-b", "10.0.0.10"), Member("i-c", "10.0.0.11")), 99)
    joins = _joins(**{"i-c": ("10.0.0.11", 5.0), "i-z": ("10.0.0.2", 7.0), "i-y": ("10.0.0.200", 6.0),
                      "i-b": ("10.0.0.10", 9.0)})
    members = choose_members(3, joins, previous, gone={"i-a"})
    # i-b keeps rank 0 over its lower-addressed newcomers; among newcomers, the first to join.
    assert [m.node for m in members] == ["i-b", "i-c", "i-y"]
    assert choose_members(4, joins, previous, gone={"i-a"}) is not None
    assert choose_members(5, joins, previous, gone={"i-a"}) is None, "wait for enough live nodes"
    assert choose_members(4, joins, previous, gone={"i-a", "i-z"}) is None, "a gone joiner does not count"


def test_a_new_plan_waits_for_previous_members_that_neither_joined_left_nor_went():
    previous = Plan(2, (Member("i-a", "a"), Member("i-b", "b"), Member("i-c", "c")), 10)
    assert unaccounted(previous, joins={"i-a"}, leaves={"i-b"}, gone=set()) == ["i-c"]
    assert unaccounted(previous, joins={"i-a"}, leaves={"i-b"}, gone={"i-c"}) == []
    assert unaccounted(None, joins=set(), leaves=set(), gone=set()) == []


def test_every_generation_has_its_own_port_and_env():
    plan = Plan(7, (Member("i-a", "10.1.0.10"), Member("i-b", "10.1.0.9")), 41)
    assert plan.port == contract.RENDEZVOUS_PORT_BASE + 7
    assert Plan(7 + contract.RENDEZVOUS_PORT_SPAN, plan.members, None).port == plan.port
    env = rendezvous.write(plan, "i-b", 8, "dl-x")
    assert env == {"MASTER_ADDR": "10.1.0.10", "MASTER_PORT": str(plan.port), "NNODES": "2", "NODE_RANK": "1",
                   "NPROC_PER_NODE": "8", "WORLD_SIZE": "16", "DL_GENERATION": "7", "DL_CLUSTER": "dl-x"}
    assert contract.read_env("rendezvous_env") == env
    assert open(contract.path("hostfile")).read() == "10.1.0.10 slots=8\n10.1.0.9 slots=8\n"
    with pytest.raises(ValueError):
        rendezvous.env_for(plan, "i-stranger", 8)


def test_one_plan_per_generation_however_many_propose_at_once(store):
    cluster = ClusterState(store)
    proposals = [Plan(3, (Member(f"i-{k}", f"10.0.0.{k}"), Member("i-z", "10.0.0.99")), k) for k in range(8)]
    results = []
    threads = [threading.Thread(target=lambda p=p: results.append(cluster.propose(p))) for p in proposals]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    standing = cluster.plan(3)
    assert all(r == standing for r in results), "every proposer ends up with the same plan"
    assert cluster.newest_generation() == 3


def test_joins_leaves_and_the_end_of_the_job(store):
    cluster = ClusterState(store)
    assert cluster.newest_generation() == 0 and cluster.plan(1) is None
    cluster.join(1, Member("i-a", "10.0.0.1"), health={"raid": "degraded x"})
    cluster.join(1, Member("i-b", "10.0.0.2"))
    cluster.leave(2, "i-c", reason="termination notice", pushed=40)
    assert set(cluster.joins(1)) == {"i-a", "i-b"} and cluster.joins(1)["i-a"]["addr"] == "10.0.0.1"
    assert cluster.join_details(1)["i-a"]["health"] == {"raid": "degraded x"}
    assert cluster.leaves(2) == {"i-c"} and cluster.activity(2) and not cluster.activity(3)
    cluster.unjoin(1, Member("i-b", "10.0.0.2"))
    assert set(cluster.joins(1)) == {"i-a"}
    cluster.mark_failed(reason="first")
    cluster.mark_failed(reason="second")
    assert cluster.failed()["reason"] == "first", "the first word on the job's end stands"
    assert store.latest() is None, "cluster state never looks like a checkpoint"


def test_liveness_from_ec2(aws):
    ec2 = boto3.client("ec2", region_name="us-east-1")
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/20")["Subnet"]["SubnetId"]
    ids = [i["InstanceId"] for i in ec2.run_instances(ImageId="ami-12c6146b", MinCount=3, MaxCount=3,
                                                      SubnetId=subnet)["Instances"]]
    ec2.terminate_instances(InstanceIds=[ids[0]])
    ec2.stop_instances(InstanceIds=[ids[1]])
    live = Liveness(ec2)
    assert live.gone(ids) == {ids[0], ids[1]}
    assert live.gone([ids[2], "i-0000000000000dead"]) == {"i-0000000000000dead"}, "unknown ids are gone"
    assert live.gone([]) == set()


class Counted:
    """Every request a boto3 client makes, by operation."""

    def __init__(self, client) -> None:
        self.calls: list[str] = []
        client.meta.events.register("before-call", lambda model, **kw: self.calls.append(model.name))


def test_reading_every_join_is_one_list_whatever_the_number_of_joiners(store):
    cluster = ClusterState(store)
    for i in range(60):
        cluster.join(4, Member(f"i-{i:017x}", f"10.0.{i // 250}.{i % 250 + 1}"))
    seen = Counted(store.client)
    joins = cluster.joins(4)
    assert len(joins) == 60 and joins["i-00000000000000003"]["addr"] == "10.0.0.4"
    assert seen.calls == ["ListObjectsV2"], "the listing says who and where: no GET per joiner"
    first, last = joins["i-00000000000000000"]["at"], joins["i-0000000000000003b"]["at"]
    assert 0 <= last - first < 60 and abs(first - time.time()) < 300, "each join's time, to the millisecond"
    order = sorted(joins, key=lambda n: joins[n]["at"])
    assert order == [f"i-{i:017x}" for i in range(60)], "join order survives joins within one second"


class Throttled:
    """EC2 whose DescribeInstances answers RequestLimitExceeded (what EC2 says when the account's
    bucket is empty) or, with `unknown`, InvalidInstanceID.NotFound naming those ids."""

    def __init__(self, ec2, *, throttle: bool = False, unknown: tuple[str, ...] = ()) -> None:
        self.ec2, self.throttle, self.unknown, self.asked = ec2, throttle, set(unknown), []

    def get_paginator(self, name):
        outer = self

        class P:
            def paginate(self, InstanceIds):
                from botocore.exceptions import ClientError
                outer.asked.append(sorted(InstanceIds))
                if outer.throttle:
                    raise ClientError({"Error": {"Code": "RequestLimitExceeded", "Message": "Request limit exceeded."}},
                                      "DescribeInstances")
                missing = sorted(outer.unknown & set(InstanceIds))
                if missing:
                    raise ClientError({"Error": {"Code": "InvalidInstanceID.NotFound", "Message":
                                       f"The instance IDs '{', '.join(missing)}' do not exist"}}, "DescribeInstances")
                return outer.ec2.get_paginator(name).paginate(InstanceIds=InstanceIds)
        return P()


def _instances(n):
    ec2 = boto3.client("ec2", region_name="us-east-1")
    return ec2, [i["InstanceId"] for i in ec2.run_instances(ImageId="ami-12c6146b", MinCount=n, MaxCount=n)["Instances"]]


def test_only_a_stopped_heartbeat_is_asked_about_and_by_one_node_only(store):
    ec2, ids = _instances(6)
    cluster = ClusterState(store)
    for i in ids:
        cluster.beat(i)
    ec2.terminate_instances(InstanceIds=[ids[5]])
    checker, other = sorted(ids[:5])[0], sorted(ids[:5])[1]
    fakes = {n: Throttled(ec2) for n in (checker, other)}
    live = {n: Liveness(fakes[n], cluster, me=n, stale=30) for n in fakes}
    assert live[other].gone(ids) == set() and live[checker].gone(ids) == set(), "every beat is fresh"
    assert fakes[checker].asked == fakes[other].asked == [], "no EC2 call while every node beats"
    # ids[5]'s beat goes stale (S3's clock moves on 31 s): the checker asks about it alone.
    beats, now = cluster.beats()
    stale = {**beats, ids[5]: now - 31}
    cluster.beats = lambda: (stale, now)
    assert live[other].gone(ids) == set() and fakes[other].asked == [], "not the checker: it only reads"
    assert live[checker].gone(ids) == {ids[5]} and fakes[checker].asked == [[ids[5]]]
    assert live[other].gone(ids) == {ids[5]} and fakes[other].asked == [], "the checker's record reaches the others"


def test_a_slow_node_is_confirmed_running_and_throttling_confirms_nothing(store):
    ec2, ids = _instances(3)
    cluster = ClusterState(store)
    for i in ids[:2]:
        cluster.beat(i)
    me = sorted(ids[:2])[0]
    assert Liveness(Throttled(ec2), cluster, me=me).gone(ids) == set(), "no beat yet, but EC2 says running"
    ec2.terminate_instances(InstanceIds=[ids[2]])
    throttled = Throttled(ec2, throttle=True)
    log: list[str] = []
    assert Liveness(throttled, cluster, me=me, log=log.append).gone(ids) == set()
    assert throttled.asked and "RequestLimitExceeded" in log[0] and "no node is counted gone" in log[0]


def test_an_unknown_id_among_many_is_gone_and_the_rest_asked_again(aws):
    ec2, ids = _instances(250)
    dead = "i-0000000000000dead"
    fake = Throttled(ec2, unknown=(dead,))
    ec2.terminate_instances(InstanceIds=[ids[7]])
    assert Liveness(fake).gone([*ids, dead]) == {dead, ids[7]}
    # The unknown id sorts first: its chunk of 200 fails, is asked again without it (199), then the rest.
    assert [len(a) for a in fake.asked] == [200, 199, 51], "chunks of 200; the chunk with the unknown id once more"


def test_an_id_ec2_answers_without_is_gone_not_running():
    """EC2 stops listing a terminated instance about an hour after it ends, without an error: an id
    its answer leaves out is gone (a dead member counted running would hold every plan)."""
    from botocore.stub import Stubber
    ec2 = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    live, listed = "i-0123456789abcdef0", "i-0123456789abcdef1"
    with Stubber(ec2) as stub:
        stub.add_response("describe_instances", {"Reservations": [{"Instances": [
            {"InstanceId": live, "State": {"Name": "running", "Code": 16}}]}]},
            {"InstanceIds": sorted([live, listed])})
        assert Liveness(ec2).gone([live, listed]) == {listed}
        stub.assert_no_pending_responses()


def test_a_node_that_joined_twice_keeps_its_first_join_time(store):
    """Join order decides newcomers' ranks: a node that joined again (a restarted supervisor) keeps
    its place from the first join, or a restart would push it behind nodes that came later."""
    cluster = ClusterState(store)
    a, b = Member("i-0000000000000000a", "10.0.0.1"), Member("i-0000000000000000b", "10.0.0.2")
    cluster.join(3, a)
    time.sleep(0.01)
    cluster.join(3, b)
    time.sleep(0.01)
    cluster.join(3, a)  # again, later
    joins = cluster.joins(3)
    assert joins[a.node]["at"] < joins[b.node]["at"]
    assert [m.node for m in choose_members(2, joins, None)] == [a.node, b.node]


@pytest.mark.parametrize("dead_first", [True, False])
def test_a_failed_runs_peer_killed_a_second_after_its_beat_is_known_at_the_first_urgent_look(store, dead_first):
    """Issue 37: a kill must be known in seconds whatever the instance-id order. The dead peer's beat
    is still fresh; the first two live-looking members in id order ask EC2 at once (a single asker
    would be the dead node itself when it sorts first); the others only read."""
    ec2, ids = _instances(4)
    ids = sorted(ids)
    cluster = ClusterState(store)
    for i in ids:
        cluster.beat(i)
    dead = ids[0] if dead_first else ids[3]
    ec2.terminate_instances(InstanceIds=[dead])
    fakes = {n: Throttled(ec2) for n in ids if n != dead}
    live = {n: Liveness(fakes[n], cluster, me=n, stale=30) for n in fakes}
    for n in fakes:  # the usual look: every beat is fresh, so nobody is asked about
        assert live[n].gone(ids) == set() and fakes[n].asked == []
    askers = ids[:2]
    bystander = next(n for n in ids[2:] if n != dead)
    peers = [n for n in ids if n != bystander]
    assert live[bystander].gone(peers, urgent=peers, among=ids) == set() and fakes[bystander].asked == [], \
        "not among the first two: it only reads"
    asker = next(n for n in askers if n != dead)
    others = [n for n in ids if n != asker]
    assert live[asker].gone(others, urgent=others, among=ids) == {dead}
    assert fakes[asker].asked == [others], "every peer not proven alive, asked about at once"
    assert cluster.gone_nodes() == {dead}, "recorded for every node"
    assert live[bystander].gone(peers, urgent=peers, among=ids) == {dead}, "the record reaches the others"
