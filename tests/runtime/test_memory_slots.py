"""A raw snapshot's slots (memory_slots.py) become a node part only as they were stamped: the step
and attempt fence them, a slot caught mid-write is never used, and what a buddy sent (stamps,
templates) is checked before a byte of it is trusted. The end-to-end path (a real FSDP2 job whose
node dies, its step back from the slots through S3) is tests/runtime/test_memory_tier.py."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from constructs_lib.runtime import memory_raw, memory_slots, memory_store, shards

GEN = "3"


def _part(root: Path, node: int = 1, steps=(4,), layout: int = 2) -> dict[int, bytes]:
    """Node `node`'s two ranks with a template of layout `layout` and a raw snapshot of each step."""
    written = {}
    for lr in range(2):
        rank = node * 2 + lr
        mark = {"rank": rank, "node_rank": node, "local_world_size": 2, "world_size": 4,
                "reads": [f"__{rank}_0.distcp"], "layout": layout}
        memory_slots.write_template(str(root), rank, layout, layout_json=json.dumps({"rank": rank, "items": []}),
                                    mark=mark, metadata=None)
        slots = memory_slots.Slots(str(root), rank)
        for step in steps:
            written[rank] = bytes([rank, step]) * 10
            slots.write(step, memory_store.attempt_for(GEN, step), layout, [written[rank][:7], written[rank][7:]])
        slots.close()
    return written


def test_a_stamped_slot_becomes_the_node_part_with_its_markers(tmp_path):
    written = _part(tmp_path)
    path = memory_slots.materialize(str(tmp_path), 4, memory_store.attempt_for(GEN, 4))
    assert path == str(tmp_path / "step-000000000004")
    part = shards.node_part(path)
    assert part and part["node_rank"] == 1 and part["attempt"] == memory_store.attempt_for(GEN, 4)
    for rank, data in written.items():
        assert (Path(path) / memory_raw.raw_name(rank)).read_bytes() == data
        assert (Path(path) / memory_raw.layout_name(rank)).exists()


def test_two_slots_keep_the_step_before_the_one_in_flight(tmp_path):
    _part(tmp_path, steps=(4, 5))
    # step 6 is being written over step 4's slot on one rank: its stamp is blank
    memory_slots.Slots(str(tmp_path), 3).drop(6)
    assert memory_slots.materialize(str(tmp_path), 6, memory_store.attempt_for(GEN, 6)) is None
    assert memory_slots.materialize(str(tmp_path), 4, memory_store.attempt_for(GEN, 4)) is None, "overwritten"
    assert memory_slots.materialize(str(tmp_path), 5, memory_store.attempt_for(GEN, 5)) is not None


def test_a_snapshot_every_two_steps_still_keeps_the_one_before_in_flight(tmp_path):
    """save_to_memory(every=2) keeps odd steps only: the slot is the older one, not step % 2."""
    _part(tmp_path, steps=(3, 5))
    assert memory_slots.materialize(str(tmp_path), 3, memory_store.attempt_for(GEN, 3)) is not None
    memory_slots.Slots(str(tmp_path), 3).drop(7)  # step 7 is being written on one rank
    assert memory_slots.materialize(str(tmp_path), 5, memory_store.attempt_for(GEN, 5)) is not None
    assert memory_slots.materialize(str(tmp_path), 7, memory_store.attempt_for(GEN, 7)) is None


def test_a_slot_of_another_generation_or_a_rank_short_is_not_this_step(tmp_path):
    _part(tmp_path)
    assert memory_slots.materialize(str(tmp_path), 4, memory_store.attempt_for("9", 4)) is None
    memory_slots.Slots(str(tmp_path), 2).drop(4)  # one rank's slot caught mid-write: no whole node
    assert memory_slots.materialize(str(tmp_path), 4, memory_store.attempt_for(GEN, 4)) is None


@pytest.mark.parametrize("tamper", ["stamp-garbage", "stamp-size", "mark-rank", "mark-reads", "raw-short"])
def test_what_a_buddy_sent_is_checked_before_it_is_used(tmp_path, tamper):
    _part(tmp_path)
    slots, tdir = tmp_path / "slots", tmp_path / "layout-2"
    attempt = memory_store.attempt_for(GEN, 4)
    if tamper == "stamp-garbage":
        (slots / "__2.s0.stamp").write_bytes(b"\xff{not json")
    elif tamper == "stamp-size":
        (slots / "__2.s0.stamp").write_text(json.dumps({"step": 4, "attempt": attempt, "layout": 2, "size": -1}))
    elif tamper == "mark-rank":
        (tdir / "__2.mark.json").write_text(json.dumps({"rank": 0, "layout": 2}))
    elif tamper == "mark-reads":
        m = json.loads((tdir / "__2.mark.json").read_text())
        (tdir / "__2.mark.json").write_text(json.dumps({**m, "reads": [{"not": "a name"}]}))
    else:
        (slots / "__2.s0.raw").write_bytes(b"12")
    if tamper == "raw-short":  # bytes that are not the stamp's: the step is not here
        assert memory_slots.materialize(str(tmp_path), 4, attempt) is None
    else:
        with pytest.raises(ValueError):
            memory_slots.materialize(str(tmp_path), 4, attempt)


def test_promote_leaves_a_held_copy_that_does_not_hold_together_and_sends_its_own(tmp_path):
    mem = tmp_path / "mem"
    own = Path(memory_store.own_root(str(mem), GEN))
    held = Path(memory_store.held_root(str(mem), GEN, 1))
    _part(own, node=0)
    _part(held, node=1)
    (own / "layout-2" / ".metadata").write_bytes(b"meta")  # global rank 0's, as a full save leaves it
    (held / "slots" / "__3.s0.stamp").write_bytes(b"[]")
    memory_store.settle(str(mem), GEN, 4)
    lines: list[str] = []
    step = memory_store.promote(str(mem), GEN, str(tmp_path / "ckpt"), newest_remote=None, owner_gone=lambda n: True,
                                push_held=lambda *a: pytest.fail("a copy that does not hold together was sent"),
                                push_older=lambda *a: None, log=lines.append)
    assert any("node 1's copy of snapshot 4 cannot be read back" in ln for ln in lines), lines
    assert step == 4 and (tmp_path / "ckpt" / "step-000000000004").is_dir(), "its own part goes on"


def test_a_buddys_frame_may_hold_what_the_held_slots_it_replaces_hold(tmp_path, monkeypatch):
    """With /dev/shm sized to the tier's 4 x, the free space alone is short of a snapshot once the
    slots are full: a frame is bounded by the free space plus what the held slots hold."""
    from constructs_lib.runtime.memory_tier import MemoryTier

    tier = object.__new__(MemoryTier)
    tier.root = str(tmp_path)
    tier.held_slots = memory_slots.Slots(str(tmp_path / "held"), 3)
    tier.held_slots.write(4, memory_store.attempt_for(GEN, 4), 2, [b"x" * 1000])
    tier.held_slots.write(5, memory_store.attempt_for(GEN, 5), 2, [b"y" * 700])
    monkeypatch.setattr(MemoryTier, "_free", lambda self: 10)
    assert tier.held_slots.size() == 1700
    for kind in ("raw", "part"):
        assert tier._fits({"kind": kind, "step": 6}, 1710) and not tier._fits({"kind": kind, "step": 6}, 1711), kind
    # a raw frame no larger than the slot it goes over (step 4's, the older) needs no look at the free space
    monkeypatch.setattr(MemoryTier, "_free", lambda self: pytest.fail("statvfs for a frame that replaces its like"))
    assert tier._fits({"kind": "raw", "step": 6}, 1000)
    tier.held_slots.close()


@pytest.mark.parametrize("header, why", [
    ({"kind": "raw", "step": 6, "rank": 2, "layout": 2}, "from rank 2"),            # another rank's stream
    ({"kind": "raw", "step": -6, "rank": 3, "layout": 2}, "of step -6"),
    ({"kind": "raw", "step": 6, "rank": 3, "layout": 2, "attempt": "g9-s6"}, "with attempt"),
    ({"kind": "raw", "step": 6, "rank": 3}, "without its layout"),
])
def test_a_buddys_raw_frame_is_checked_before_a_byte_of_it_goes_into_a_slot(tmp_path, header, why):
    """The link reads a raw frame straight into the held slot: the header is checked first, so a
    bad frame blanks no stamp and overwrites nothing (steps 4 and 5 stay as they were)."""
    from constructs_lib.runtime.memory_tier import MemoryTier

    tier = object.__new__(MemoryTier)
    tier.recv_rank, tier.generation = 3, GEN
    tier.held_slots = memory_slots.Slots(str(tmp_path), 3)
    tier.held_slots.write(4, memory_store.attempt_for(GEN, 4), 2, [b"x" * 100])
    tier.held_slots.write(5, memory_store.attempt_for(GEN, 5), 2, [b"y" * 100])
    header = {"attempt": memory_store.attempt_for(GEN, 6), **header}
    try:
        with pytest.raises(ValueError, match=why):
            tier._receive_into(header, 100)
        assert memory_slots.stamped_steps(str(tmp_path)) == {4, 5}
        good = {"kind": "raw", "step": 6, "rank": 3, "layout": 2, "attempt": memory_store.attempt_for(GEN, 6)}
        tier._receive_into(good, 3)[:] = b"zzz"
        assert tier._receive(good, memoryview(b"zzz")) is True
        assert memory_slots.stamped_steps(str(tmp_path)) == {5, 6}, "step 6 over the older slot, step 4's"
    finally:
        tier.held_slots.close()
