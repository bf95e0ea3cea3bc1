"""What a node asks S3 while it waits for a plan (issue 36: the busiest second at 1,000 nodes must
fit one prefix's 5,500 reads/s): one LIST of the generation per look, a plan read once, the job's
end records and the newest generation every few looks. Against moto_server, every request counted."""
from __future__ import annotations

import threading

from constructs_lib.runtime import contract
from constructs_lib.runtime.cluster import ClusterState, Liveness, Member, Plan
from constructs_lib.runtime.membership import Hooks, Membership

from .test_cluster import Counted


class Keyed:
    """Every request a boto3 client makes, as (operation, key or prefix)."""

    def __init__(self, client) -> None:
        self.calls: list[tuple[str, str]] = []
        client.meta.events.register("before-parameter-build", lambda params, model, **kw: self.calls.append(
            (model.name, params.get("Key", params.get("Prefix", "")))))

    def count(self, op: str, ending: str) -> int:
        return sum(1 for o, k in self.calls if o == op and k.endswith(ending))


def test_one_list_of_a_generation_says_its_joins_leaves_failures_and_plan(store):
    cluster = ClusterState(store)
    for i, node in enumerate(["i-0a", "i-0b", "i-0c"]):
        cluster.join(5, Member(node, f"10.0.0.{i + 1}"))
    cluster.join(5, Member("i-0a", "10.0.0.1"))  # twice: its first join counts
    cluster.leave(5, "i-0c", "notice", None)
    cluster.record_failure(5, "i-0b", "exit 1")
    seen = Counted(store.client)
    view = cluster.view(5)
    assert seen.calls == ["ListObjectsV2"]
    assert view.joins == cluster.joins(5) and view.leaves == cluster.leaves(5) == {"i-0c"}
    assert view.failures == set(cluster.failures(5)) == {"i-0b"}
    assert not view.planned
    cluster.propose(Plan(5, (Member("i-0a", "10.0.0.1"), Member("i-0b", "10.0.0.2")), None))
    assert cluster.view(5).planned and not cluster.view(6).planned


def test_a_plan_is_read_once_and_a_missing_one_asked_again(store):
    cluster, other = ClusterState(store), ClusterState(store)
    seen = Counted(store.client)
    assert cluster.plan(3) is None and cluster.plan(3) is None
    assert seen.calls == ["GetObject", "GetObject"], "no plan yet: asked each time"
    written = other.propose(Plan(3, (Member("i-0a", "10.0.0.1"),), 7))
    seen.calls.clear()
    assert cluster.plan(3) == written and cluster.plan(3) == written
    assert seen.calls == ["GetObject"], "a plan is written once (If-None-Match): read once"


def _membership(store, ended, *, nodes: int = 2, poll: float = 0.02) -> Membership:
    cluster = ClusterState(store)
    me = Member("i-0a", "10.0.0.1")
    hooks = Hooks(ended=ended, last_ran=lambda: 0, resume_step=lambda: None)
    return Membership(cluster, Liveness(None, cluster, me=me.node, stale=30.0), me, hooks, nodes=nodes,
                      poll=poll, liveness_poll=2 * poll, log=lambda line: None)


def test_a_node_waiting_for_a_plan_reads_the_end_every_few_looks_and_still_finds_it(store):
    cluster = ClusterState(store)
    m = _membership(store, lambda: contract.EXIT_FINISHED if cluster.finished() else None)
    seen = Keyed(store.client)
    got: list = []
    waiting = threading.Thread(target=lambda: got.append(m.join(1)))
    waiting.start()  # one node of two: no plan can form, it looks at every poll
    while seen.count("ListObjectsV2", "/gen-000001/") < 4 * Membership.LOOK_POLLS:
        waiting.join(0.01)
    cluster.mark_finished(generation=1, node="i-0b", step=None)
    waiting.join(30)
    assert got == [contract.EXIT_FINISHED], "the job's end still ends the wait"
    looks = seen.count("ListObjectsV2", "/gen-000001/")
    ends = seen.count("GetObject", "/finished.json")
    newest = sum(1 for o, k in seen.calls if o == "ListObjectsV2" and k.endswith("/_cluster/"))
    assert ends <= looks // Membership.LOOK_POLLS + 1 and newest <= looks // Membership.LOOK_POLLS + 1, seen.calls
    assert ends < looks / 2 and newest < looks / 2, "not at every look"
    assert seen.count("ListObjectsV2", "/join/") == seen.count("ListObjectsV2", "/leave/") == 0, \
        "joins and leaves come from the generation's one LIST"
    assert seen.count("GetObject", "/gen-000001/plan.json") == 0, "no plan is read before the listing shows one"


def test_a_rendezvous_reads_the_end_once_after_the_supervisor_did(store):
    """Supervisor.run reads the end records (membership.ended) right before each rendezvous: the
    rendezvous' first look does not read them again."""
    cluster = ClusterState(store)
    asked: list[int] = []

    def ended():
        asked.append(1)
        return None

    m = _membership(store, ended, nodes=1, poll=1.0)
    assert m.ended() is None and len(asked) == 1
    plan = m.rendezvous()
    m.stop_beats()
    assert isinstance(plan, Plan) and plan.nodes() == ["i-0a"] and cluster.plan(1) == plan
    assert len(asked) == 1, "the first look went by the supervisor's read"


def test_a_node_short_of_a_full_generation_asks_neither_liveness_nor_the_end_records(store):
    """While fewer nodes have joined than the job needs, no plan can be written whoever is gone, and
    the end records are read only once the top-level listing shows one: a fleet that boots for a
    minute costs each waiting node one LIST per look and one top-level LIST every few looks."""
    m = _membership(store, lambda: None, nodes=3)
    m.liveness_poll = 0.0  # liveness would be asked at every look if it were asked at all
    seen = Keyed(store.client)
    m.cluster.join(1, Member("i-0b", "10.0.0.2"))
    waiting = threading.Thread(target=lambda: m.join(1), daemon=True)
    waiting.start()  # two of three
    while seen.count("ListObjectsV2", "/gen-000001/") < 3 * Membership.LOOK_POLLS and waiting.is_alive():
        waiting.join(0.01)
    m.cluster.join(1, Member("i-0c", "10.0.0.3"))  # the third: the plan forms and the wait ends
    waiting.join(30)
    assert not waiting.is_alive() and m.cluster.plan(1) is not None
    before_third = seen.calls[:next(i for i, (o, k) in enumerate(seen.calls) if o == "PutObject" and "i-0c" in k)]
    assert not any(k.endswith(("/beat/", "/gone/")) for o, k in before_third), before_third
    assert not any(k.endswith(("/finished.json", "/failed.json")) for o, k in before_third), before_third


def _instances(n):
    import boto3
    ec2 = boto3.client("ec2", region_name="us-east-1")
    ids = [i["InstanceId"] for i in ec2.run_instances(ImageId="ami-12c6146b", MinCount=n, MaxCount=n)["Instances"]]
    return ec2, sorted(ids)


def _node(store, ec2, node: str, *, nodes: int = 2, liveness_poll: float = 100.0) -> Membership:
    cluster = ClusterState(store)
    me = Member(node, "10.0.0.1")
    hooks = Hooks(ended=lambda: None, last_ran=lambda: 1, resume_step=lambda: None)
    return Membership(cluster, Liveness(ec2, cluster, me=node, stale=30.0), me, hooks, nodes=nodes,
                      poll=0.02, liveness_poll=liveness_poll, member_grace=600.0, log=lambda line: None)


def test_a_previous_member_that_has_not_rejoined_is_asked_about_at_once_by_the_joined(store):
    """Issue 37: a member killed a second after its beat, while the survivors re-form, must not hold
    the next plan for its heartbeat's 30 s (or the 600 s member grace): the joined nodes ask EC2."""
    ec2, (a, b, c) = _instances(3)
    cluster = ClusterState(store)
    cluster.propose(Plan(1, (Member(a, "10.0.0.1"), Member(b, "10.0.0.2")), None))
    for n in (a, b, c):
        cluster.beat(n)
    ec2.terminate_instances(InstanceIds=[b])
    cluster.join(2, Member(c, "10.0.0.3"))  # the replacement
    got: list = []
    # A liveness period of 100 s: only the urgency can explain an answer within the test.
    t = threading.Thread(target=lambda: got.append(_node(store, ec2, a).join(2)))
    t.start()
    t.join(30)
    assert got and isinstance(got[0], Plan), "a plan within the test's bound"
    assert sorted(got[0].nodes()) == sorted([a, c]) and cluster.gone_nodes() == {b}


def test_a_plan_never_names_a_member_recorded_gone_since_the_last_look(store):
    ec2, (a, b, c) = _instances(3)
    cluster = ClusterState(store)
    for n in (a, b, c):
        cluster.beat(n)
    m = _node(store, ec2, a, liveness_poll=2.0)  # a node short of a full set looks every second
    assert m.gone([a, b]) == set()  # a fresh answer, kept for the period
    cluster.join(1, Member(b, "10.0.0.2"))
    cluster.record_gone(b, "terminated")  # the controller's event, after the last look
    got: list = []
    t = threading.Thread(target=lambda: got.append(m.join(1)))
    t.start()
    t.join(0.5)
    assert t.is_alive() and cluster.plan(1) is None, "no plan with the dead member, and none without a second node"
    cluster.join(1, Member(c, "10.0.0.3"))
    t.join(30)
    assert got and sorted(got[0].nodes()) == sorted([a, c])
