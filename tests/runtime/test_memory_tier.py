"""The memory tier (memory_tier.py, memory_store.py): a real FSDP2 job of 2 nodes x 2 ranks (gloo,
separate processes) keeps every step in memory and on the buddy node; the second node is killed
mid-step; from the first node alone (its own part and its copy of the dead node's) the step comes
back through S3 (moto) equal to what rank 0 recorded for that step. Then the ring of buddies, and
one tier in this process: its room check, its worker thread, its threads' priorities. The hostile
and fenced cases on the tier's files are in test_memory_store.py."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from constructs_lib.runtime import contract, memory_raw, memory_slots, memory_store
from constructs_lib.runtime.agent import NodeAgent
from constructs_lib.runtime.memory_ring import neighbours, ring
from constructs_lib.runtime.sharded_store import commit, push_part
from tests.runtime.free_port import free_port

ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).with_name("memory_job.py")


def _run_job(root: Path, *, die_at: int, uneven: int = -1, extra: tuple[str, ...] = ()) -> list[int]:
    port = free_port()
    (root / "ref").mkdir(parents=True)
    procs = []
    for r in range(4):
        node = r // 2
        env = {k: v for k, v in os.environ.items() if not k.startswith("DL_")}
        env.update(RANK=str(r), WORLD_SIZE="4", LOCAL_RANK=str(r % 2), LOCAL_WORLD_SIZE="2", GROUP_RANK=str(node),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), DL_GENERATION="3", PYTHONPATH=str(ROOT),
                   DL_MEMORY_DIR=str(root / f"node-{node}" / "mem"), DL_CHECKPOINT_DIR=str(root / f"node-{node}" / "ckpt"),
                   DL_RUN_DIR=str(root / f"node-{node}" / "run"))
        with open(root / f"rank-{r}.err", "wb") as err:
            procs.append(subprocess.Popen([sys.executable, str(JOB), "--reference", str(root / "ref"), "--die-at",
                                           str(die_at), "--uneven", str(uneven), *extra],
                                          env=env, stdout=subprocess.DEVNULL, stderr=err))
    try:
        return [p.wait(timeout=180) for p in procs]
    finally:
        for p in procs:
            p.kill()


@pytest.mark.parametrize("uneven", [-1, 4], ids=["raw", "one-rank-changed-after-the-others-wrote-raw"])
def test_a_dead_nodes_shards_come_back_from_its_buddy_equal_to_the_step(store, tmp_path, monkeypatch, uneven):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    codes = _run_job(tmp_path, die_at=5, uneven=uneven)
    assert codes[2:] == [-9, -9] and codes[:2] == [1, 1], codes
    assert "tier threads: [('link', 19), ('worker', 19)]" in (tmp_path / "rank-0.err").read_text()
    mem = tmp_path / "node-0" / "mem"
    assert memory_store.settled(str(mem), "3") == 4, "step 5 completed; its snapshot never began: one step lost"
    g = Path(memory_store.gen_root(str(mem), "3"))
    assert [p.name for p in (g / "own").iterdir() if p.name.startswith("step-")] == (
        [] if uneven < 0 else ["step-000000000004"]), "older dropped; a raw step stays in its slots until a node dies"

    # The supervisor's side on node 0: node 1 is gone, so its part goes to S3 from the buddy copy.
    local = tmp_path / "node-0" / "ckpt"
    monkeypatch.setenv("DL_RUN_DIR", str(tmp_path / "node-0" / "run"))
    sent: list[int] = []

    def push_held(path: str, step: int, part: dict) -> None:
        push_part(store, path, step, part)
        sent.append(part["node_rank"])
        assert commit(store, step, part["attempt"]) is None, "node 0's own part is not there yet"

    step = memory_store.promote(str(mem), "3", str(local), newest_remote=None, owner_gone=lambda n: n == 1,
                                push_held=push_held, push_older=lambda *a: pytest.fail("no step after 4"),
                                log=lambda m: None)
    assert step == 4 and sent == [1]
    # Step 4 was written raw in the layout of step 3's full save (its note grew there): promote made
    # node 0's part and its copy of node 1's from their slots, and to_dcp turned them into DCP's files.
    own = {p.name for p in (g / "own" / "step-000000000004").iterdir()}
    held = {p.name for p in (g / "held" / "node-1" / "step-000000000004").iterdir()}
    if uneven < 0:
        assert own >= {"__0.raw", "__1.raw", ".metadata"} and held >= {"__2.raw", "__3.raw"}
    else:  # rank 3's vote made step 4 a full save: node 0's raw slots, written by then, were dropped
        assert not any(memory_raw.is_fast_file(n) for n in own | held), (own, held)
        assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= own and {"__2_0.distcp", "__3_0.distcp"} <= held
    assert NodeAgent(store, str(local), log=lambda m: None).upload_once() == 4
    assert store.has_step(4), "node 0's part and node 1's copy make the step"

    got = store.pull(str(tmp_path / "restored"), 4)  # every file: a reader of another world size
    assert got is not None
    dcp_to_torch_save(got[1], str(tmp_path / "whole.pt"))
    whole = torch.load(tmp_path / "whole.pt", weights_only=False)
    assert whole["meta"]["note"] == "4x", "step 4's own value (raw), not the full save's of step 3 (3x)"
    restored = whole["model"]
    want = torch.load(tmp_path / "ref" / "step-4.pt")
    assert restored.keys() == want.keys()
    for k in want:
        assert torch.equal(restored[k], want[k]), f"{k} is not step 4's"


def test_a_node_that_dies_in_the_vote_leaves_the_step_it_sent_whole_and_it_is_kept(store, tmp_path, monkeypatch):
    """Node 1 wrote, sent and received step 5, then died in its vote: node 0 never marks 5 settled,
    but holds it whole (its own part and node 1's copy), so it sends 5 as well as the settled 4."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    codes = _run_job(tmp_path, die_at=-1, extra=("--die-in-vote", "5"))
    assert codes[2:] == [-9, -9] and codes[:2] == [1, 1], codes
    mem = tmp_path / "node-0" / "mem"
    assert memory_store.settled(str(mem), "3") == 4, "the vote on 5 never passed"
    local = tmp_path / "node-0" / "ckpt"
    monkeypatch.setenv("DL_RUN_DIR", str(tmp_path / "node-0" / "run"))
    sent: list[int] = []
    asked: list[int] = []

    def push_held(path: str, step: int, part: dict) -> None:
        push_part(store, path, step, part)
        sent.append(step)

    agent = NodeAgent(store, str(local), log=lambda m: None)
    step = memory_store.promote(str(mem), "3", str(local), newest_remote=None, owner_gone=lambda n: asked.append(n) or True,
                                push_held=push_held, push_older=lambda path, s: agent.push(s, path), log=lambda m: None)
    assert step == 5 and sent == [4, 5] and asked == [1], (step, sent, asked)
    assert store.has_step(4), "step 4 went before the supervisor's flush: a node marked 4 only sends 4"
    assert agent.upload_once() == 5 and store.has_step(5)
    got = store.pull(str(tmp_path / "restored"), 5)
    assert got is not None
    dcp_to_torch_save(got[1], str(tmp_path / "whole.pt"))
    restored = torch.load(tmp_path / "whole.pt", weights_only=False)["model"]
    want = torch.load(tmp_path / "ref" / "step-5.pt")
    assert all(torch.equal(restored[k], want[k]) for k in want), "step 5 exactly: no step lost"


def test_the_step_after_the_settled_one_is_not_sent_when_the_dead_nodes_copy_of_it_never_came(tmp_path):
    """Node 1 died as its snapshot of 5 began: node 0 wrote its own part of 5, but no copy of node
    1's came, so no node can make 5 whole in S3; node 0 sends 4 only (not twice the state)."""
    codes = _run_job(tmp_path, die_at=-1, extra=("--die-before-send", "5"))
    assert codes[2:] == [-9, -9] and codes[:2] == [1, 1], codes
    mem = tmp_path / "node-0" / "mem"
    assert memory_store.settled(str(mem), "3") == 4
    assert 5 in memory_slots.stamped_steps(memory_store.own_root(str(mem), "3")), "node 0's own part of 5 is here"
    sent: list[int] = []
    step = memory_store.promote(str(mem), "3", str(tmp_path / "ckpt"), newest_remote=None, owner_gone=lambda n: True,
                                push_held=lambda path, s, part: sent.append(s),
                                push_older=lambda *a: pytest.fail("nothing kept after 4"), log=lambda m: None)
    assert step == 4 and sent == [4] and sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step-000000000004"]


def test_after_an_in_process_restart_the_tier_saves_with_a_coordinator_new_to_the_job(tmp_path):
    """torch's DCP caches save plans per process; a survivor whose cache is warm from generation 1
    sent an empty plan to generation 2's new coordinator, whose save then failed (and the tier
    stopped for the run) before the tier stopped asking DCP to cache."""
    ports = [str(free_port()), str(free_port())]
    job = Path(__file__).with_name("tier_restart_job.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DL_")} | {"PYTHONPATH": str(ROOT)}

    def start(role: str) -> subprocess.Popen:
        err = open(tmp_path / f"{role}.err", "wb")
        return subprocess.Popen([sys.executable, str(job), role, "--ports", *ports, "--root", str(tmp_path)],
                                env=env, stdout=subprocess.DEVNULL, stderr=err)

    procs = [start("survivor"), start("gone")]
    try:
        assert procs[1].wait(timeout=120) == 0, (tmp_path / "gone.err").read_text()[-3000:]
        procs.append(start("new"))
        codes = [p.wait(timeout=120) for p in procs]
    finally:
        for p in procs:
            p.kill()
    logs = {r: (tmp_path / f"{r}.err").read_text() for r in ("survivor", "gone", "new")}
    assert codes == [0, 0, 0] and not any("memory tier" in t for t in logs.values()), logs
    for node, role in ((0, "new"), (1, "survivor")):
        assert memory_store.settled(str(tmp_path / f"node-{node}-{role}" / "mem"), "2") == 21, logs


def test_a_rank_that_cannot_open_the_tiers_port_turns_the_tier_off_everywhere_and_training_goes_on(tmp_path):
    codes = _run_job(tmp_path, die_at=-1, extra=("--no-listen-on", "3"))
    assert codes == [0, 0, 0, 0], codes
    for r in range(4):
        err = (tmp_path / f"rank-{r}.err").read_text()
        assert "the memory tier is off for this run: no link to its buddy" in err, err[-2000:]
    assert memory_store.settled(str(tmp_path / "node-0" / "mem"), "3") is None
    assert len(list((tmp_path / "ref").iterdir())) == 8, "every step trained"


@pytest.mark.parametrize("domains,apart", [
    (["a", "a", "b", "b"], True),                 # two AZs (or partitions): every buddy in the other
    (["a", "a", "a", "b", "b", "b"], True),
    (["a", "a", "a", "b"], False),                # three in one domain: some pair must share it
    (["z"] * 5, False),                           # a cluster placement group: one domain
])
def test_buddies_are_in_another_failure_domain_where_the_counts_allow(domains, apart):
    order = ring(domains)
    assert sorted(order) == list(range(len(domains)))
    pairs = [(n, neighbours(order, n)[0]) for n in order]
    assert all(neighbours(order, to)[1] == n for n, to in pairs), "each node receives from the one that sends to it"
    assert all(to != n for n, to in pairs)
    assert all(domains[n] != domains[to] for n, to in pairs) == apart


@pytest.mark.parametrize("placement,domain", [
    ({"availability-zone-id": "use1-az4", "partition-number": "2"}, "use1-az4/partition-2"),
    ({"availability-zone-id": "use1-az4"}, "use1-az4"),   # a cluster placement group: the zone only
    ({}, ""),
])
def test_a_nodes_failure_domain_comes_from_its_placement(monkeypatch, placement, domain):
    from constructs_lib.runtime.config import node_identity
    from tests.runtime.fake_imds import FakeImds

    fake = FakeImds({contract.TAG_CLUSTER: "dl-x", contract.TAG_NODES: "2"})
    fake.placement = placement
    fake.start()
    try:
        monkeypatch.setenv("DL_IMDS_ENDPOINT", fake.endpoint)
        for k in ("DL_CLUSTER", "DL_NODES"):
            monkeypatch.delenv(k, raising=False)
        assert node_identity().failure_domain == domain
    finally:
        fake.stop()


@pytest.fixture
def world_of_one(monkeypatch):
    """A gloo process group of one rank, this process: MemoryTier makes its own group in it."""
    import torch.distributed as dist

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_a_memory_directory_too_small_turns_the_tier_off_on_every_rank(tmp_path, monkeypatch, world_of_one):
    """One rank (gloo, world 1) stands for the agreement; the log says what was short."""
    from torch.distributed.tensor import DeviceMesh, distribute_tensor
    from constructs_lib.runtime.memory_tier import MemoryTier

    said: list[str] = []
    tier = MemoryTier(root=str(tmp_path / "mem"), generation="3", rank=0, world_size=1, local_world_size=1,
                      node_rank=0, finish=lambda *a, **k: None, log=said.append)
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    big = distribute_tensor(torch.zeros(1), DeviceMesh("cpu", [0]))
    monkeypatch.setattr("constructs_lib.runtime.memory_tier._nbytes", lambda state: free)  # 4 x the free space
    assert tier.snapshot(0, {"w": big}) is False and tier.thread is None
    assert "memory tier is off" in said[0] and "GiB free" in said[0]
    assert tier.snapshot(1, {"w": big}) is False, "off for the rest of the run"


def test_one_worker_thread_takes_every_snapshot_in_turn_and_ends_when_stopped(tmp_path, monkeypatch, world_of_one):
    """The tier's snapshots run on one thread for the run, one at a time (the next waits for the
    previous to settle, as the staging buffers are reused), and stop() ends that thread after the
    snapshot in flight without waiting for it (a failed generation's, in an in-process restart)."""
    import threading

    from torch.distributed.tensor import DeviceMesh, distribute_tensor
    from constructs_lib.runtime.memory_tier import MemoryTier

    ran: list[tuple[int, int, bool]] = []
    release = threading.Event()

    def work(self, step, staged, fresh):
        ran.append((step, threading.get_ident(), fresh))
        if step == 2:
            release.wait(30)
            raise RuntimeError("gloo: Connection closed by peer")

    monkeypatch.setattr(MemoryTier, "_write_send_settle", work)
    said: list[str] = []
    tier = MemoryTier(root=str(tmp_path / "mem"), generation="3", rank=0, world_size=1, local_world_size=1,
                      node_rank=0, finish=lambda *a, **k: None, log=said.append)
    w = distribute_tensor(torch.zeros(4), DeviceMesh("cpu", [0]))
    for step in range(2):
        assert tier.snapshot(step, {"w": w}) is True
    tier.wait()
    assert [s for s, _t, _f in ran] == [0, 1] and ran[0][1] == ran[1][1] != threading.get_ident()
    assert [f for _s, _t, f in ran] == [True, False], "the staging buffers are new only the first time"
    worker = tier.thread
    assert tier.snapshot(2, {"w": w}) is True
    tier.stop()  # returns at once: the snapshot of step 2 still waits on its peer
    assert tier.thread is None and worker.is_alive()
    release.set()
    worker.join(30)
    assert not worker.is_alive(), "the worker ended after its last snapshot"
    assert tier.broken and "stopped at step 2" in said[-1]


def test_every_thread_of_the_tier_yields_its_core_to_training_and_no_thread_of_trainings_own(tmp_path, monkeypatch):
    """Real torch: the tier's gloo group's threads (made when the group is, named by gloo) and its
    worker run at nice 19; the job's own group's threads and the training thread keep theirs."""
    import threading
    import time

    import torch.distributed as dist
    from torch.distributed.tensor import DeviceMesh, distribute_tensor
    from constructs_lib.runtime.memory_threads import threads as _threads
    from constructs_lib.runtime.memory_tier import MemoryTier

    def nice(tid: int) -> int:
        return os.getpriority(os.PRIO_PROCESS, tid)

    def names(tids: set[int]) -> list[str]:
        until = time.monotonic() + 10  # each thread names itself once it runs
        while True:
            got = sorted(Path(f"/proc/self/task/{t}/comm").read_text().strip() for t in tids)
            if all("gloo" in n for n in got) or time.monotonic() > until:
                return got
            time.sleep(0.01)

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    before = _threads()  # an earlier test's groups' threads may outlive their groups
    dist.init_process_group("gloo", rank=0, world_size=1)
    tier = None
    try:
        job_group = _threads() - before
        tier = MemoryTier(root=str(tmp_path / "mem"), generation="3", rank=0, world_size=1, local_world_size=1,
                          node_rank=0, finish=lambda *a, **k: None, log=lambda line: None)
        tiers = _threads() - job_group - before
        assert names(tiers) == ["gloo_tcp_loop", "pt_gloo_runloop", "pt_gloo_runloop"], "the tier's group's, by gloo's names"
        assert {nice(t) for t in tiers} == {19}
        assert len(job_group) >= 3 and {nice(t) for t in job_group} == {0}, "the job's group's (and its store's) keep theirs"
        assert nice(threading.get_native_id()) == 0
        w = distribute_tensor(torch.zeros(4), DeviceMesh("cpu", [0]))
        tier.snapshot(0, {"w": w})
        tier.wait()
        assert nice(tier.thread.native_id) == 19
    finally:
        if tier is not None:
            tier.close()
        dist.destroy_process_group()


def test_what_a_snapshot_sends_is_its_steps_state_whichever_way_it_was_given_and_a_stopped_tier_keeps_none(
        tmp_path, monkeypatch, world_of_one):
    """save_to_memory's two ways, mixed: (model, optimizer) refilled, then a state dict of another
    shape (new buffers), then (model, optimizer) again: each snapshot holds its own step's state.
    Once stopped (an in-process restart's teardown), the tier holds nothing of the model."""
    import gc
    import weakref

    from torch import nn
    from constructs_lib.runtime.memory_staging import stage
    from constructs_lib.runtime.memory_tier import MemoryTier
    from constructs_lib.runtime.state_of import StateOf

    sent: list[dict] = []
    monkeypatch.setattr(MemoryTier, "_write_send_settle",
                        lambda self, step, staged, fresh: sent.append({k: v.clone() for k, v in staged["model"].items()}))
    tier = MemoryTier(root=str(tmp_path / "mem"), generation="3", rank=0, world_size=1, local_world_size=1,
                      node_rank=0, finish=lambda *a, **k: None)
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    state_of = StateOf()
    for step in range(5):
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
        live = state_of(model, opt)
        if step == 3:
            assert tier.snapshot(step, {**live, "extra": {"epoch": step}})
        else:
            assert tier.snapshot(step, live=(model, opt, state_of))
        tier.wait()
        want = stage(live, None)[0]["model"]
        assert all(torch.equal(sent[-1][k], want[k]) for k in want), f"step {step} sent another step's state"
    assert tier.refill.plan is not None  # the last snapshot was refilled or learned again
    tier.stop()
    assert tier.staged is None and tier.refill.plan is None
    gone = weakref.ref(model.weight)
    del model, opt, live, want
    gc.collect()
    assert gone() is None, "the tier kept the model's tensors after it stopped"
