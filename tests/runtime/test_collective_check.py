"""The pre-generation all-reduce (collective_check.py, allreduce_probe.py, busbw.py).

The drill: four real Supervisors (threads) against moto_server's S3 and EC2, a 3-node job and a
spare; each generation's members run the real probe (gloo over 127.0.0.1, a process per node).
One member's all-reduce is slowed by the test hook (contract.ENV_ALLREDUCE_TEST_DELAY): it never
runs the command, tags itself for replacement, and the job runs on the other two and the spare.
The only timing the assertions rest on is the injected delay: a second per all-reduce on the slow
node against a baseline threshold (0.01 GB/s) that a 1 MiB gloo all-reduce on loopback passes by
30x when no node is delayed and misses by 7x when one is.
"""
from __future__ import annotations

import os
import threading
import time

import boto3
import pytest

from constructs_lib.runtime import busbw, contract
from constructs_lib.runtime.cluster import ClusterState, Liveness
from constructs_lib.runtime.collective_check import CollectiveCheck
from constructs_lib.runtime.store import CheckpointStore
from constructs_lib.runtime.supervisor import Supervisor, SupervisorConfig
from dl_selector import allreduce_baselines
from tests.runtime.drill import _port_range, port_base


# ---- the arithmetic --------------------------------------------------------------------------------
def test_bus_bandwidth_is_nccl_tests_formula():
    # nccl-tests' own example (doc/PERFORMANCE.md): algBW x 2(n-1)/n; 1 GB in 1 s on 8 ranks is 1.75 GB/s.
    assert busbw.bus_bandwidth(10**9, 1.0, 8) == pytest.approx(1.75)
    # A published row (NVIDIA/nccl#527, 2 x 8 A100): 1073741824 B in 35215 us on 16 ranks -> 57.17 GB/s busbw.
    assert busbw.bus_bandwidth(1073741824, 35215e-6, 16) == pytest.approx(57.17, abs=0.01)
    assert busbw.bus_bandwidth(1024, 0.0, 8) == 0.0 and busbw.bus_bandwidth(1024, 1.0, 1) == 0.0


def test_pairs_cover_every_node_twice_in_disjoint_rounds():
    for n in range(3, 9):
        rounds = busbw.pair_rounds(n)
        pairs = [p for r in rounds for p in r]
        assert sorted(pairs) == sorted((i, (i + 1) % n) for i in range(n))
        for r in rounds:
            ranks = [x for p in r for x in p]
            assert len(ranks) == len(set(ranks)), (n, r)
    assert busbw.pair_rounds(2) == []


def test_the_slowest_is_the_node_whose_best_pair_is_slow():
    pairs = {(0, 1): 40.0, (1, 2): 39.0, (2, 3): 5.0, (3, 0): 6.0}
    assert busbw.slowest(4, pairs) == 3
    v = busbw.judge(20.0, {4: 77.9}, 4, pairs)
    assert v.below and v.exclude == 3 and "slowest by pairs: rank 3" in v.line(256, 4, "p4d.24xlarge")


def test_no_baseline_is_reported_never_enforced_and_two_nodes_are_never_excluded():
    v = busbw.judge(1.0, {}, 4, {})
    assert not v.below and "no baseline for p5.48xlarge at 4 nodes: recorded, not enforced" in v.line(
        256, 4, "p5.48xlarge")
    two = busbw.judge(10.0, {2: 77.9}, 2, {})
    assert two.below and two.exclude is None and "cannot be told apart" in two.line(256, 2, "p4d.24xlarge")
    assert not busbw.needs_pairs(10.0, {2: 77.9}, 2) and busbw.needs_pairs(10.0, {3: 77.9}, 3)


def test_the_baselines_file_has_a_source_and_a_date_for_every_row():
    rows = allreduce_baselines.load()
    assert rows and all(r.source and r.date and r.nodes >= 2 for r in rows)
    assert allreduce_baselines.for_type("p4d.24xlarge")[2] == 77.9
    assert busbw.parse_baseline(busbw.format_baseline({2: 77.9, 4: 60.0})) == {2: 77.9, 4: 60.0}
    assert busbw.parse_baseline("2:x,1:5,3:-1,junk") == {}


# ---- the drill -------------------------------------------------------------------------------------
@pytest.fixture
def ports(tmp_path, monkeypatch):
    lock = _port_range(tmp_path)
    monkeypatch.setenv("DL_RENDEZVOUS_PORT_BASE", str(port_base(lock)))
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    yield
    lock.close()


def test_a_slow_node_never_trains_and_the_job_runs_without_it(bucket, tmp_path, ports):
    ec2 = boto3.client("ec2", region_name="us-east-1")
    ids = [i["InstanceId"] for i in ec2.run_instances(ImageId="ami-12c6146b", MinCount=4, MaxCount=4,
                                                      InstanceType="p4d.24xlarge")["Instances"]]
    said: list[str] = []
    trained = tmp_path / "trained"
    trained.mkdir()

    def node(k: int, delay: float) -> Supervisor:
        name = "abcd"[k]
        store = CheckpointStore(bucket, "jobs/bw", log=said.append)
        cluster = ClusterState(store)
        script = tmp_path / f"{name}.sh"
        script.write_text(f'echo "$DL_GENERATION" >> {trained / ids[k]}\n')
        cfg = SupervisorConfig(cluster="dl-bw", nodes=3, nproc_per_node=1, node=ids[k], addr=f"127.0.0.{k + 1}",
                               poll=0.1, liveness_poll=0.5, member_grace=60.0, max_failures=2, stop_timeout=2.0,
                               flush_timeout=1.0, retry_base=0.05)
        log = (lambda line: said.append(f"{name}: {line}"))
        sup = Supervisor(cfg, store, cluster, Liveness(ec2, cluster, me=ids[k], stale=30.0, log=log),
                         local_dir=str(tmp_path / name), command_file=str(script), log=log)
        env = {**os.environ, contract.ENV_COLLECTIVE_CHECK: "1", contract.ENV_ALLREDUCE_BASELINE: "3:0.02",
               contract.ENV_INSTANCE_TYPE: "p4d.24xlarge", contract.ENV_ALLREDUCE_TEST_DELAY: str(delay)}
        sup.collective = CollectiveCheck.from_env(env, me=sup.me, cluster=cluster, ec2=ec2, nproc=1, log=log,
                                                  health=lambda *a: None, hold_rounds=1, sleep=lambda s: None)
        sup.collective.iters = 2
        return sup

    slow = 1
    sups = [node(k, 1.0 if k == slow else 0.0) for k in range(4)]
    ended: dict[int, object] = {}

    def run(k: int) -> None:
        try:
            ended[k] = sups[k].run()
        except BaseException as e:  # noqa: BLE001 - reported by the assertion below
            ended[k] = e
        finally:
            sups[k].stop_beats()

    threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(4)]
    for t in threads[:3]:
        t.start()
    cluster = ClusterState(CheckpointStore(bucket, "jobs/bw"))
    deadline = time.monotonic() + 60
    while cluster.plan(1) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert cluster.plan(1) is not None and ids[slow] in cluster.plan(1).nodes(), said[-20:]
    threads[3].start()  # the spare: what the capacity controller launches
    for t in threads:
        t.join(timeout=240)
    assert ended == {0: contract.EXIT_FINISHED, 1: contract.EXIT_FAILED, 2: contract.EXIT_FINISHED,
                     3: contract.EXIT_FINISHED}, "\n".join([repr(ended), *said[-60:]])
    # The slow node never ran the command; the job ran once, in generation 2, on the other three.
    assert not (trained / ids[slow]).exists()
    assert {p.name: p.read_text().split() for p in trained.iterdir()} == {i: ["2"] for i in ids if i != ids[slow]}
    plan2 = cluster.plan(2)
    assert plan2 is not None and ids[slow] not in plan2.nodes() and ids[3] in plan2.nodes()
    tags = ec2.describe_tags(Filters=[{"Name": "resource-id", "Values": [ids[slow]]},
                                      {"Name": "key", "Values": [contract.TAG_HEALTH]}])["Tags"]
    assert tags and tags[0]["Value"].startswith(f"{contract.HEALTH_REPLACE}: collective check:"), tags
    rank = cluster.plan(1).rank_of(ids[slow])
    assert any(f"slowest by pairs: rank {rank}" in line for line in said), said[-40:]
    assert any(line.startswith("a: generation 1 ended: excluded") for line in said), said[-40:]
    # Generation 2 (no delayed node) passed the same threshold; its figure is recorded for people.
    assert any("collective check, generation 2:" in line and line.endswith(": ok") for line in said), said[-40:]
    record = cluster.collective(2)
    assert record and record["nodes"] == 3 and not record["below"], record


def test_a_member_that_never_joins_ends_the_check_within_its_bound(bucket, tmp_path, ports):
    """Only rank 1 of a 2-member plan runs the probe: it gives up at torch's timeout, and the
    generation ends as peer-lost (the next one forms with whoever is alive), never a hang."""
    from constructs_lib.runtime.cluster import Member, Plan
    members = (Member("i-0000000000000000a", "127.0.0.1"), Member("i-0000000000000000b", "127.0.0.1"))
    said: list[str] = []
    check = CollectiveCheck(size_mib=1, baselines={2: 0.02}, instance_type="p4d.24xlarge", me=members[1],
                            cluster=ClusterState(CheckpointStore(bucket, "jobs/bw")), ec2=None, nproc=1,
                            log=said.append, health=lambda *a: None, timeout=3.0)
    outcome, detail = check.check(Plan(1, members, None))
    assert outcome == "peer-lost" and detail.startswith("collective check: the all-reduce failed"), (detail, said)


def test_a_probe_that_cannot_work_never_stops_the_job(bucket, tmp_path, ports, monkeypatch, capsys):
    """Where the supervisor's Python has no torch (a container job, a venv of the runtime's own),
    the probe says so and the command starts; a probe that keeps failing on this node ends one
    generation as peer-lost, and the next starts without it: the check alone never stops a job."""
    import sys
    from constructs_lib.runtime import allreduce_probe
    from constructs_lib.runtime.cluster import Member, Plan
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
        assert allreduce_probe.main(["--master", "127.0.0.1", "--port", "1", "--nodes", "2", "--node-rank", "0",
                                     "--size-mib", "1"]) == 0
    assert '"skipped": "no torch in ' in capsys.readouterr().out

    members = (Member("i-0000000000000000a", "127.0.0.1"), Member("i-0000000000000000b", "127.0.0.1"))
    said: list[str] = []
    health: list[tuple] = []
    check = CollectiveCheck(size_mib=1, baselines={2: 0.02}, instance_type="p4d.24xlarge", me=members[1],
                            cluster=ClusterState(CheckpointStore(bucket, "jobs/bw")), ec2=None, nproc=1,
                            log=said.append, health=lambda *a: health.append(a), timeout=2.0)
    check._probe = lambda plan, rank: {"skipped": "no torch in /usr/bin/python3"}
    assert check.check(Plan(1, members, None)) is None
    assert said[-1] == "collective check skipped: no torch in /usr/bin/python3" and health[-1][1] == "degraded"
    check._probe = lambda plan, rank: "the all-reduce failed (exit 1): NCCL error"
    assert check.check(Plan(2, members, None))[0] == "peer-lost"
    assert check.check(Plan(3, members, None)) is None, said[-1]
    assert "2 failed in a row on this node, so generation 3 starts without it" in said[-1]
