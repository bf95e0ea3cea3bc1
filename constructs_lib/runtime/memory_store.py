"""The memory tier's files on a node (host memory: tmpfs), and what the supervisor does with them
when a run ends. memory_tier.py writes them from the training processes.

    <root>/gen-G/own/step-N/                 this node's part of snapshot N when it was a full save
                                             (DCP files, shard markers), or made from the slots of
                                             a raw one between runs (memory_slots.materialize)
    <root>/gen-G/own/slots/, layout-F/       raw snapshots and their layout (memory_slots.py)
    <root>/gen-G/held/node-K/...             the same for node K, received from K: K's buddy copy
    <root>/gen-G/settled/rank-R              the newest snapshot rank R knows whole across the
                                             cluster (every rank wrote, sent and received it)

Snapshots of one generation only: a run's start clears every earlier one (the supervisor has
sent what it could when that run ended).
"""
from __future__ import annotations

import os
import re
import shutil
import sys
import threading
from typing import Callable, Optional

from . import memory_raw, memory_slots, shards
from .layout import make_final, name_for, newest_local, step_of

_HELD = re.compile(r"^node-(\d{1,7})\Z", re.ASCII)


# The top bit of a snapshot's attempt number is set; a periodic save's never is (shards.new_attempt).
SNAPSHOT_BIT = 0x8000_0000


def attempt_for(generation: Optional[str], step: int) -> str:
    """A snapshot's attempt: fixed by its generation and step, never a periodic save's."""
    return shards.new_attempt(generation, SNAPSHOT_BIT | (step & 0x7FFF_FFFF))


def gen_root(root: str, generation: str) -> str:
    return os.path.join(root, f"gen-{generation}")


def own_root(root: str, generation: str) -> str:
    return os.path.join(gen_root(root, generation), "own")


def held_root(root: str, generation: str, node: int) -> str:
    return os.path.join(gen_root(root, generation), "held", f"node-{node}")


def rank_files(part: str, rank: int) -> list[str]:
    """A rank's files in a full save's node part (raw snapshots travel from their slots): its DCP
    shard files, its marker, and (global rank 0, DCP's coordinator) the step's .metadata."""
    names = sorted(n for n in os.listdir(part) if (m := memory_raw.DISTCP.match(n)) and int(m.group(1)) == rank)
    names.append(f"{shards.MARKERS}/rank-{rank}.json")
    if rank == 0:
        names.append(shards.METADATA)
    return names


def pack(part: str, rank: int) -> tuple[list, bytes]:
    """This rank's files of a complete node part: ([[name, size], ...], their bytes back to back)."""
    names = rank_files(part, rank)
    blobs = []
    for n in names:
        with open(os.path.join(part, n), "rb") as f:
            blobs.append(f.read())
    return [[n, len(b)] for n, b in zip(names, blobs)], b"".join(blobs)


def file_in(header: list, data: memoryview, name: str) -> Optional[bytes]:
    """The bytes of `name` in a packed rank's files (receive's header over `data`), or None."""
    at = 0
    for n, size in header:
        if not isinstance(size, int) or size < 0:
            return None
        if n == name:
            return bytes(data[at:at + size]) if at + size <= len(data) else None
        at += size
    return None


def receive(held: str, step: int, attempt: str, header: list, data: memoryview) -> Optional[str]:
    """Write one rank's files from its buddy (header: [[name, size], ...] over `data`); the part is
    complete here once every rank of the sending node has arrived. Returns its path then."""
    tmp = shards.tmp_dir(held, step, attempt)
    at = 0
    for name, size in header:
        if not _safe(name) or not isinstance(size, int) or size < 0 or at + size > len(data):
            raise ValueError(f"a buddy's file {name!r} of {size!r} bytes does not fit what was sent")
        path = os.path.join(tmp, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data[at:at + size])
        at += size
    return shards.complete_if_whole(held, step, attempt, guard_uploads=False, sync=False)


def _safe(name: object) -> bool:
    """A name a buddy's full-save part may carry: DCP's files, .metadata and markers (raw and layout
    files are made on this node, from its own slots)."""
    return (isinstance(name, str) and (bool(memory_raw.DISTCP.match(name)) or name == shards.METADATA
                                       or bool(re.match(rf"^{re.escape(shards.MARKERS)}/rank-\d{{1,7}}\.json\Z", name))))


def settle(root: str, generation: str, step: int, *, rank: int = 0, prune: bool = True) -> None:
    """Mark `step` whole across the cluster (as rank `rank` knows it: one small file a rank, written
    in place) and, with `prune`, drop every older snapshot directory of this generation (there are
    some only after a full save: raw snapshots live in their slots)."""
    s = Settled(root, generation, rank)
    try:
        s.mark(step, prune=prune)
    finally:
        s.close()


class Settled:
    """A rank's settled mark, its file kept open: one write a snapshot, not an open and a close."""

    def __init__(self, root: str, generation: str, rank: int) -> None:
        self.gen, self.rank = gen_root(root, generation), rank
        self.fd: Optional[int] = None

    def mark(self, step: int, *, prune: bool) -> None:
        if self.fd is None:
            d = os.path.join(self.gen, "settled")
            os.makedirs(d, exist_ok=True)
            self.fd = os.open(os.path.join(d, f"rank-{self.rank}"), os.O_WRONLY | os.O_CREAT, 0o600)
        os.pwrite(self.fd, b"%20d" % step, 0)  # one write of a fixed width: never half of one
        if prune:
            _prune(self.gen, step)

    def close(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)


def _prune(g: str, step: int) -> None:
    for d in [os.path.join(g, "own"), *_held_dirs(g)]:
        for n in os.listdir(d) if os.path.isdir(d) else []:
            s = _step_in(n)
            if s is not None and s < step:
                path = os.path.join(d, n)
                shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else _unlink(path)


def _step_in(name: str) -> Optional[int]:
    """The step a snapshot entry is of: step-N, or .tmp-step-N-<attempt> (one cut short)."""
    if name.startswith(".tmp-"):
        name = name[5:22]
    return step_of(name)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _held_dirs(g: str) -> list[str]:
    h = os.path.join(g, "held")
    return [os.path.join(h, n) for n in sorted(os.listdir(h)) if _HELD.match(n)] if os.path.isdir(h) else []


def settled(root: str, generation: str) -> Optional[int]:
    """The newest step some rank of this node marked whole (one rank passing the snapshot's
    collective proves it for every rank)."""
    d = os.path.join(gen_root(root, generation), "settled")
    steps = []
    for n in os.listdir(d) if os.path.isdir(d) else []:
        if re.match(r"^rank-\d{1,7}\Z", n, re.ASCII):
            with open(os.path.join(d, n), "rb") as f:
                text = f.read(64).strip()
            if text.isdigit() and len(text) <= 19:
                steps.append(int(text))
    return max(steps, default=None)


def warm(root: str, generation: str) -> Optional[threading.Thread]:
    """Once this node's ranks keep snapshots in memory (a settled mark exists), the supervisor
    imports torch on a thread of its own, while the run trains: after a node's death promote
    rebuilds DCP's files with torch.save (memory_raw.to_dcp), and importing torch there, in the
    supervisor's first recovery, took 1.9 s of a 4.4 s in-process recovery (bench/goodput.py
    --fsdp --inprocess). Cheap to call every poll: the thread that imports, once a process (where
    torch is not installed, its one try), or None."""
    global _warmed
    if _warmed or "torch" in sys.modules or not os.path.isdir(os.path.join(gen_root(root, generation), "settled")):
        return None
    _warmed = True
    t = threading.Thread(target=_import_torch, daemon=True, name="dl-warm-torch")
    t.start()
    return t


_warmed = False  # memory_store.warm started its thread in this process


def _import_torch() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:  # promote says so, where it needs it
        pass


def clear(root: str) -> None:
    """Every snapshot: at a run's start they belong to a run that is over."""
    if os.path.isdir(root):
        for n in os.listdir(root):
            if n.startswith("gen-"):
                shutil.rmtree(os.path.join(root, n), ignore_errors=True)


def promote(root: str, generation: str, local_dir: str, *, newest_remote: Optional[int],
            owner_gone: Callable[[int], bool], push_held: Callable[[str, int, dict], None],
            push_older: Callable[[str, int], None], log: Callable[[str], None],
            outcome: str = "") -> Optional[int]:
    """Between runs, after generation `generation` ended: the newest settled snapshot, and the
    next where this node holds it whole, become this node's saves step-N in `local_dir`, and each
    held part of them whose owner is gone is sent to S3 in its owner's place (push_held(path, step,
    part)). The newest is pushed next like any save; one kept before it is pushed here and now
    (push_older(path, step)), as the supervisor's flush takes the newest only. Nothing older than a
    checkpoint in S3, nor than one here that will be whole there (_stands: by how the generation
    ended, its `outcome`). Returns the newest step kept, or None.

    Why the next one too: the vote that settles step N returns on the ranks at slightly different
    times, so a node that dies in between leaves some nodes marked N and others N-1; each node
    sending both means every node sends the newest step any rank marked, and S3 takes a step only
    with every node's part of its attempt. The next one is whole in S3 as well when every rank
    wrote it and the dead node's copy arrived before it died: one step fewer lost."""
    step = settled(root, generation)
    if step is None:
        return None
    own = own_root(root, generation)
    later = sorted(s for s in memory_slots.stamped_steps(own) | _full_steps(own) if s > step)
    local = newest_local(local_dir)
    looked: dict[int, bool] = {}  # owner_gone may wait seconds for a live owner: once a node

    def gone(node: int) -> bool:
        if node not in looked:
            looked[node] = owner_gone(node)
        return looked[node]

    kept = None
    for s in [step, *later[:1]]:
        if (newest_remote is not None and s <= newest_remote) or (local is not None and _stands(local[0], s, outcome)):
            continue
        if s != step and not _held_whole(root, generation, s, gone):
            break  # a gone owner's only copy lacks it: no node can make it whole in S3, so send nothing of it
        if _promote_step(root, generation, s, local_dir, gone, push_held,
                         log if s == step else lambda line: None):  # the next step need not be here
            if kept is not None:
                push_older(os.path.join(local_dir, name_for(kept)), kept)
            kept = s
    if kept is not None and local is not None and local[0] > kept:  # a periodic save the dead node never sent
        push_older(os.path.join(local_dir, name_for(kept)), kept)
    return kept


def _stands(local: int, snapshot: int, outcome: str) -> bool:
    """Whether this node's newest local save, of step `local`, will be whole in S3 and at least as
    new as the snapshot of step `snapshot`, which is then not sent. A save of the same step stands
    only when the job finished (sending the step again would double its last upload): after a
    hard kill the dead node's part of an async periodic save never reaches S3, while its buddy
    holds its snapshot of that step (a kill in the step after a periodic save went back 10 steps).
    A newer one stands unless a member was lost ("peer-lost"): a notice's save, which every node
    sends (the run takes no snapshot at it), but not a periodic save the dead node never sent."""
    if snapshot > local:
        return False
    if snapshot == local:
        return outcome == "finished"
    return outcome != "peer-lost"


def _held_whole(root: str, generation: str, step: int, owner_gone: Callable[[int], bool]) -> bool:
    """Whether each copy this node holds for an owner that is gone has `step` whole."""
    attempt = attempt_for(generation, step)
    for held in _held_dirs(gen_root(root, generation)):
        node = _held_node(held)
        if not owner_gone(node):
            continue
        try:
            if _held_copy(held, node, step, attempt) is None:
                return False
        except (ValueError, OSError):
            return False
    return True


def _held_node(held: str) -> int:
    return int(_HELD.match(os.path.basename(held)).group(1))  # type: ignore[union-attr]


def _held_copy(held: str, node: int, step: int, attempt: str) -> Optional[tuple[str, dict]]:
    """Node `node`'s part of `step` in its copy here, made from the slots if need be: (its path, its
    part), or None when it is not whole here. Raises ValueError or OSError on a buddy's slot or
    template that does not hold together."""
    part_dir = memory_slots.materialize(held, step, attempt) or os.path.join(held, name_for(step))
    part = shards.node_part(part_dir) if os.path.isdir(part_dir) else None
    if part is None or part["node_rank"] != node or part["attempt"] != attempt:
        return None
    return part_dir, part


def _full_steps(part_root: str) -> set[int]:
    return {s for n in os.listdir(part_root) if (s := step_of(n)) is not None} if os.path.isdir(part_root) else set()


def _promote_step(root: str, generation: str, step: int, local_dir: str, owner_gone: Callable[[int], bool],
                  push_held: Callable[[str, int, dict], None], log: Callable[[str], None]) -> bool:
    g = gen_root(root, generation)
    attempt = attempt_for(generation, step)
    try:
        own = memory_slots.materialize(own_root(root, generation), step, attempt) or os.path.join(g, "own", name_for(step))
    except (ValueError, OSError) as e:
        log(f"this node's part of snapshot {step} cannot be read back ({e}): resuming from S3's newest")
        return False
    mine = shards.node_part(own) if os.path.isdir(own) else None
    if mine is None or mine["attempt"] != attempt:
        log(f"snapshot {step} settled but this node's part of it is not whole here: resuming from S3's newest")
        return False
    tmp = os.path.join(local_dir, f".tmp-{name_for(step)}-memory")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        memory_raw.to_dcp(own, tmp)
    except ValueError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        log(f"this node's part of snapshot {step} cannot be turned into its checkpoint files ({e}): resuming from S3's newest")
        return False
    sent = [node for held in _held_dirs(g) if (node := _push_held(held, step, attempt, owner_gone, push_held, log)) is not None]
    make_final(tmp, os.path.join(local_dir, name_for(step)), guard_uploads=True)
    log(f"step {step} kept in memory: sending this node's part" +
        (f" and node {', '.join(map(str, sent))}'s from the buddy copy" if sent else "") +
        "; the next generation resumes there once every node's part is in S3")
    return True


def _push_held(held: str, step: int, attempt: str, owner_gone: Callable[[int], bool],
               push_held: Callable[[str, int, dict], None], log: Callable[[str], None]) -> Optional[int]:
    """The copy of a buddy's part of `step` sent in its owner's place, if the owner is gone: its node."""
    node = _held_node(held)
    try:
        copy = _held_copy(held, node, step, attempt)
    except (ValueError, OSError) as e:  # a buddy's slot or template that does not hold together
        log(f"node {node}'s copy of snapshot {step} cannot be read back: {e}")
        return None
    if copy is None or not owner_gone(node):
        return None
    part_dir, part = copy
    try:
        dcp = memory_raw.dcp_copy(part_dir)
    except ValueError as e:  # a buddy's raw part that does not hold together: S3's newest stands for it
        log(f"node {node}'s part of snapshot {step} cannot be turned into its checkpoint files: {e}")
        return None
    push_held(dcp, step, part)
    return node
