"""The memory tier's files on a node (memory_store.py, kept.py): a buddy's copy is hostile input
(its file names, its sizes), a copy of another attempt or generation is never sent for a step,
settling drops older snapshots, snapshots' attempts never meet periodic saves', and a holder sends
the dead node's part only once the owner is recorded gone."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from constructs_lib.runtime import memory_raw, memory_store, shards

ROOT = Path(__file__).resolve().parents[2]


def _held_part(root: Path, step: int, attempt: str, node: int = 1) -> Path:
    held = Path(memory_store.held_root(str(root), "3", node))
    for lr in range(2):
        rank = node * 2 + lr
        body = os.urandom(64)
        mark = shards.json.dumps({"rank": rank, "node_rank": node, "local_world_size": 2, "world_size": 4,
                                  "attempt": attempt, "step": step, "reads": [f"__{rank}_0.distcp"]}).encode()
        header = [[f"__{rank}_0.distcp", len(body)], [f".dl-shards/rank-{rank}.json", len(mark)]]
        memory_store.receive(str(held), step, attempt, header, memoryview(body + mark))
    return held / f"step-{step:012d}"


# A full save's part carries DCP files, markers and .metadata only; raw and layout files are made
# on this node from its own slots, so a buddy that sends one is refused.
@pytest.mark.parametrize("name", ["../../etc/cron.d/x", "/abs", ".dl-shards/../x", "__1_0.distcp/../../y", 7,
                                  memory_raw.raw_name(1), memory_raw.layout_name(1)])
def test_a_buddys_file_names_are_checked_before_anything_is_written(tmp_path, name):
    with pytest.raises(ValueError):
        memory_store.receive(str(tmp_path / "held"), 4, "g3-80000004", [[name, 1]], memoryview(b"x"))
    assert not list(tmp_path.rglob("x")) and not list(tmp_path.rglob("y"))


def test_sizes_that_overrun_what_was_sent_are_refused(tmp_path):
    with pytest.raises(ValueError):
        memory_store.receive(str(tmp_path / "held"), 4, "g3-80000004", [["__1_0.distcp", 10]], memoryview(b"x"))


def test_a_copy_of_another_attempt_is_never_sent_for_this_step(tmp_path):
    mem = tmp_path / "mem"
    stale = _held_part(mem, 4, "g2-80000004")  # generation 2's copy of step 4
    assert stale.is_dir() and shards.node_part(str(stale)) is not None
    own = Path(memory_store.own_root(str(mem), "3")) / "step-000000000004"
    own.mkdir(parents=True)
    memory_store.settle(str(mem), "3", 4)
    pushed: list = []
    memory_store.promote(str(mem), "3", str(tmp_path / "ckpt"), newest_remote=None, owner_gone=lambda n: True,
                         push_held=lambda *a: pushed.append(a), push_older=lambda *a: None, log=lambda m: None)
    assert pushed == [], "fenced by generation and step: never mixed into generation 3's step 4"


def test_a_snapshot_no_newer_than_s3_is_left_and_a_live_owners_copy_is_not_sent(tmp_path):
    mem = tmp_path / "mem"
    _held_part(mem, 4, memory_store.attempt_for("3", 4))
    memory_store.settle(str(mem), "3", 4)
    pushed: list = []
    args = dict(owner_gone=lambda n: False, push_held=lambda *a: pushed.append(a), push_older=lambda *a: None, log=lambda m: None)
    assert memory_store.promote(str(mem), "3", str(tmp_path / "ckpt"), newest_remote=4, **args) is None
    memory_store.promote(str(mem), "3", str(tmp_path / "ckpt"), newest_remote=3, **args)
    assert pushed == [], "the owner is alive: it sends its own part"


def test_settling_a_step_drops_older_snapshots_and_ones_cut_short(tmp_path):
    mem = tmp_path / "mem"
    for step in (3, 4, 5):
        _held_part(mem, step, memory_store.attempt_for("3", step))
    cut = Path(shards.tmp_dir(memory_store.held_root(str(mem), "3", 1), 4, memory_store.attempt_for("3", 4)))
    cut.mkdir()
    memory_store.settle(str(mem), "3", 3)
    memory_store.settle(str(mem), "3", 5)
    held = Path(memory_store.held_root(str(mem), "3", 1))
    assert sorted(p.name for p in held.iterdir() if p.name != ".commit.lock") == ["step-000000000005"]
    assert memory_store.settled(str(mem), "3") == 5


def test_attempts_of_snapshots_and_of_periodic_saves_never_meet():
    snap = {memory_store.attempt_for("7", s) for s in (0, 1, 2**31 - 1, 2**31 + 5)}
    assert all(int(a.split("-")[1], 16) >= 2**31 for a in snap) and len(snap) == 4
    assert all(int(shards.new_attempt("7").split("-")[1], 16) < 2**31 for _ in range(200))
    assert memory_store.attempt_for("7", 4) != memory_store.attempt_for("8", 4)


def _own_part(mem: Path, step: int) -> None:
    own = Path(memory_store.own_root(str(mem), "3"))
    for lr in range(2):
        (own / f".tmp-step-{step:012d}-{memory_store.attempt_for('3', step)}").mkdir(parents=True, exist_ok=True)
        (own / f".tmp-step-{step:012d}-{memory_store.attempt_for('3', step)}" / f"__{lr}_0.distcp").write_bytes(b"x")
        shards.finish_rank(str(own), step, memory_store.attempt_for("3", step), rank=lr, node_rank=0,
                           local_world_size=2, world_size=4, reads=[f"__{lr}_0.distcp"], sync=False,
                           expect=["__0_0.distcp"] if lr == 0 else None)


@pytest.mark.parametrize("recorded_after,sent", [(0.0, True), (1.0, True), (None, False)])
def test_a_holder_sends_its_copy_once_the_owner_is_recorded_gone_and_not_for_a_live_owner(
        tmp_path, monkeypatch, recorded_after, sent):
    """recorded_after: seconds after the run's end at which the failed run's askers record the
    owner gone (None: never, it is alive and sends its own part)."""
    import time as clock

    from constructs_lib.runtime import kept
    from constructs_lib.runtime.cluster import Member, Plan

    mem = tmp_path / "mem"
    monkeypatch.setenv("DL_MEMORY_DIR", str(mem))
    _held_part(mem, 4, memory_store.attempt_for("3", 4))
    _own_part(mem, 4)
    memory_store.settle(str(mem), "3", 4)
    start = clock.monotonic()

    class Records:  # the cluster's gone records, and the node's cached liveness look (never newer)
        def gone_nodes(self):
            late = recorded_after is not None and clock.monotonic() - start >= recorded_after
            return {"i-b"} if late else set()

    class Look:
        def gone(self, nodes, **_kw):
            return {"i-b"} & set(nodes) if recorded_after == 0.0 else set()

    pushed: list = []
    monkeypatch.setattr(kept.sharded_store, "push_part", lambda store, path, step, part: pushed.append(part["node_rank"]))
    monkeypatch.setattr(kept.sharded_store, "commit", lambda *a: None)
    plan = Plan(generation=3, members=(Member("i-a", "10.0.0.1"), Member("i-b", "10.0.0.2")), resume_step=None)
    kept.promote(plan=plan, node="i-a", local_dir=str(tmp_path / "ckpt"), store=None, cluster=Records(),
                 membership=Look(), newest=lambda: None, ride=lambda fn, what: fn(), log=lambda m: None)
    assert pushed == ([1] if sent else [])
    assert (tmp_path / "ckpt" / "step-000000000004").is_dir(), "its own part is the node's newest save either way"


def test_a_snapshot_takes_the_place_of_a_local_save_of_its_step_and_leaves_a_newer_one(tmp_path):
    """A kill in the step after an async periodic save of step 4: the survivors hold their own
    save of 4, but the dead node's part of it never reaches S3; its buddy's snapshot of 4 does.
    A save here newer than the snapshot (a notice's: every node sends it) is left to stand, and so is
    one of the same step when the job finished."""
    mem, ckpt = tmp_path / "mem", tmp_path / "ckpt"
    _held_part(mem, 4, memory_store.attempt_for("3", 4))
    _own_part(mem, 4)
    memory_store.settle(str(mem), "3", 4)
    periodic = ckpt / "step-000000000004"
    periodic.mkdir(parents=True)
    (periodic / "__0_0.distcp").write_bytes(b"periodic")
    pushed: list = []
    args = dict(owner_gone=lambda n: True, push_held=lambda path, step, part: pushed.append((step, part["node_rank"])),
                push_older=lambda *a: None, log=lambda m: None)
    (ckpt / "step-000000000005").mkdir()
    assert memory_store.promote(str(mem), "3", str(ckpt), newest_remote=3, **args) is None
    (ckpt / "step-000000000005").rmdir()
    assert memory_store.promote(str(mem), "3", str(ckpt), newest_remote=3, outcome="finished", **args) is None, (
        "the job finished: its last save stands, not sent twice")
    assert pushed == [] and (periodic / "__0_0.distcp").read_bytes() == b"periodic"
    assert memory_store.promote(str(mem), "3", str(ckpt), newest_remote=3, **args) == 4
    assert pushed == [(4, 1)], "the dead node's part of step 4, from its buddy's copy"
    part = shards.node_part(str(periodic))
    assert part and part["attempt"] == memory_store.attempt_for("3", 4), "the snapshot's attempt, whole in S3 with the held part"


@pytest.mark.parametrize("outcome, kept", [("peer-lost", 4), ("interrupted", None)])
def test_a_snapshot_older_than_a_local_save_is_sent_only_when_a_member_was_lost(tmp_path, outcome, kept):
    """A kill right after a survivor's async periodic save of step 5 completed on its disk, before
    the snapshot of 5: the dead node's part of 5 never comes, so the snapshot of 4 is sent, ahead
    of the supervisor's flush (which takes the newest save here). After a notice every node sends
    its save of the notice's step: the older snapshot is left."""
    mem, ckpt = tmp_path / "mem", tmp_path / "ckpt"
    _held_part(mem, 4, memory_store.attempt_for("3", 4))
    _own_part(mem, 4)
    memory_store.settle(str(mem), "3", 4)
    (ckpt / "step-000000000005").mkdir(parents=True)
    pushed: list = []
    got = memory_store.promote(str(mem), "3", str(ckpt), newest_remote=3, owner_gone=lambda n: True,
                               push_held=lambda path, step, part: pushed.append(("held", step)),
                               push_older=lambda path, step: pushed.append(("own", step)), log=lambda m: None,
                               outcome=outcome)
    assert got == kept
    assert pushed == ([("held", 4), ("own", 4)] if kept else [])


def test_the_supervisor_imports_torch_ahead_only_once_its_ranks_keep_snapshots(tmp_path):
    """A recovery's promote rebuilds DCP files with torch: once a snapshot settled on this node,
    the supervisor (a process without torch until then) imports it on a thread while the run trains."""
    code = """
import sys
from constructs_lib.runtime import memory_store
root, gen = sys.argv[1], "3"
assert memory_store.warm(root, gen) is None and "torch" not in sys.modules, "no snapshot here: torch stays out"
memory_store.Settled(root, gen, 0).mark(7, prune=False)
t = memory_store.warm(root, gen)
assert t is not None and t.daemon
assert memory_store.warm(root, gen) is None, "one thread at a time"
t.join(timeout=120)
assert "torch" in sys.modules and memory_store.warm(root, gen) is None
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]
