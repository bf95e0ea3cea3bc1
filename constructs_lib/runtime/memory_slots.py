"""The memory tier's raw snapshots in two fixed slots per rank (issue 37).

After a full save has fixed a rank's layout (memory_raw.py), each later snapshot is that rank's
bytes written over the older of two files: no directory, marker, rename or listing per step (those
cost more CPU per step than the bytes of a small model). A node part in the form a sharded save
has (raw files, their layout, shard markers, DCP's .metadata) is made from a slot only when a node
died: materialize(), called by the supervisor between runs.

    <part root>/layout-F/__R.layout.json   rank R's layout fixed by the full save of step F
    <part root>/layout-F/__R.mark.json     what R's shard marker says besides its step and attempt
    <part root>/layout-F/.metadata         DCP's .metadata of that save (global rank 0 only)
    <part root>/slots/__R.sI.raw           R's raw bytes of the step in slot I (0 or 1: each write
                                           goes over the slot not holding R's newest step, so that
                                           it stays whole while the next is written, every K)
    <part root>/slots/__R.sI.stamp         {"step", "attempt", "layout": F, "size"}: written after
                                           the bytes, blanked before they are overwritten (one
                                           write in place of STAMP bytes: never half of one)

A part root is a node's own (memory_store.own_root) or its copy of a buddy's (held_root). What is
under a held root came from the buddy: every name and number is checked before it is used.
"""
from __future__ import annotations

import json
import mmap
import os
import re
import shutil
from typing import Any, Optional, Sequence

from . import memory_raw, shards
from .layout import name_for, write_atomic
from .records import whole

SLOTS = 2
STAMP = 256
_BLANK = b" " * STAMP
_LAYOUT_DIR = re.compile(r"^layout-(\d{1,12})\Z", re.ASCII)
_MAX_JSON = 64 << 20  # a mark or layout over this is not one a full save wrote


def _slots_dir(part_root: str) -> str:
    return os.path.join(part_root, "slots")


def layout_dir(part_root: str, layout: int) -> str:
    return os.path.join(part_root, f"layout-{layout}")


def raw_path(part_root: str, rank: int, slot: int) -> str:
    return os.path.join(_slots_dir(part_root), f"__{rank}.s{slot}.raw")


def _stamp_path(part_root: str, rank: int, slot: int) -> str:
    return os.path.join(_slots_dir(part_root), f"__{rank}.s{slot}.stamp")


def write_template(part_root: str, rank: int, layout: int, *, layout_json: str, mark: dict,
                   metadata: Optional[bytes]) -> None:
    """What rank `rank`'s raw snapshots after the full save of step `layout` need to become a node
    part: its layout, its marker's read sets and world, and (global rank 0) DCP's .metadata. Older
    layouts go, except the newest before this one (the settled step may still be in it)."""
    d = layout_dir(part_root, layout)
    os.makedirs(d, exist_ok=True)
    write_atomic(os.path.join(d, memory_raw.layout_name(rank)), layout_json)
    write_atomic(os.path.join(d, f"__{rank}.mark.json"), json.dumps(mark))
    if metadata is not None:
        write_atomic(os.path.join(d, shards.METADATA), metadata)
    older = sorted(int(m.group(1)) for n in os.listdir(part_root) if (m := _LAYOUT_DIR.match(n)) and int(m.group(1)) < layout)
    for f in older[:-1]:
        shutil.rmtree(layout_dir(part_root, f), ignore_errors=True)


class Slots:
    """One rank's two slot files under a part root, kept open: a snapshot is a pwritev (its own) or
    bytes read from the buddy's connection straight into the slot's mapping (a buddy's), not a file.
    This object is the slots' only writer (the rank's tier thread, or the link's reader for a
    buddy's copy); it knows which step each slot holds from the stamps it wrote."""

    def __init__(self, part_root: str, rank: int) -> None:
        self.root, self.rank = part_root, rank
        self.fds: dict[tuple[int, str], int] = {}
        self.sizes: list[Optional[int]] = [None] * SLOTS  # each raw file's, once looked at (_size)
        self.holds = [_stamp_or_none(_stamp_path(part_root, rank, s)) for s in range(SLOTS)]
        self.maps: dict[int, mmap.mmap] = {}  # a raw file mapped whole, kept while its size stays
        self._open: Optional[tuple[int, int]] = None  # (step, slot) between receive_into and received

    def _next(self, step: int) -> int:
        """The slot a snapshot of `step` goes into: the one holding `step` already, else the one not
        holding the newest step (by its number, not `step % 2`: with every=2 every step kept is odd,
        and one slot would hold the settled step and be overwritten by the next)."""
        steps = [h["step"] if h else -1 for h in self.holds]
        return steps.index(step) if step in steps else steps.index(min(steps))

    def drop(self, step: int) -> None:
        """The slot `step` would use holds nothing any more (a full save of `step` stands in it)."""
        self._resize(self._blank(step), 0)

    def write(self, step: int, attempt: str, layout: int, chunks: Sequence[Any]) -> None:
        """`chunks` (buffers) back to back as `step`'s bytes, over the older slot."""
        views = [memoryview(c).cast("B") for c in chunks]
        size = sum(v.nbytes for v in views)
        s = self._blank(step)
        fd = self._fd(s, "raw")
        self._resize(s, size)
        at = 0
        while views:
            n = os.pwritev(fd, views[:1024], at)  # IOV_MAX
            at += n
            memory_raw.written(views, n)
        self._stamped(s, step, attempt, layout, size)

    def receive_into(self, step: int, size: int) -> memoryview:
        """Where `size` bytes of `step` read from the buddy's connection go: the older slot's file,
        mapped, its stamp blanked until received(). No buffer between the socket and the slot: one
        copy of the buddy's bytes, not two. The file's blocks are allocated first, so that a full
        memory directory is an error here (ENOSPC), never a SIGBUS on a write into the mapping."""
        s = self._blank(step)
        self._open = (step, s)
        if not size:
            self._resize(s, 0)
            return memoryview(b"")
        mm = self.maps.get(s)
        if mm is None or len(mm) != size:
            self._resize(s, size)
            os.posix_fallocate(self._fd(s, "raw"), 0, size)
            # MAP_POPULATE: the page tables filled now, not one fault a page while the bytes arrive
            mm = self.maps[s] = mmap.mmap(self._fd(s, "raw"), size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
        return memoryview(mm)

    def received(self, step: int, attempt: str, layout: int, size: int) -> None:
        """receive_into's bytes of `step` are all in the slot: stamped, so the slot holds the step."""
        if self._open is None or self._open[0] != step:
            raise ValueError(f"step {step} was not being received into a slot")
        s, self._open = self._open[1], None
        if self._size(s) != size:
            raise ValueError(f"{size} bytes of step {step} for a slot of {self._size(s)}")
        self._stamped(s, step, attempt, layout, size)

    def raw_of(self, step: int) -> tuple[int, int]:
        """(the open raw file holding `step`, its size): what sendfile sends from."""
        s = [h["step"] if h else None for h in self.holds].index(step)
        return self._fd(s, "raw"), self.holds[s]["size"]  # type: ignore[index]

    def _blank(self, step: int) -> int:
        """The slot `step` goes into, its stamp blanked: from here until the new stamp it holds no step."""
        s = self._next(step)
        os.pwrite(self._fd(s, "stamp"), _BLANK, 0)
        self.holds[s] = None
        return s

    def _stamped(self, s: int, step: int, attempt: str, layout: int, size: int) -> None:
        held = {"step": step, "attempt": attempt, "layout": layout, "size": size}
        os.pwrite(self._fd(s, "stamp"), json.dumps(held).encode().ljust(STAMP), 0)
        self.holds[s] = held

    def _resize(self, s: int, size: int) -> None:
        if self._size(s) != size:
            self._unmap(s)
            os.ftruncate(self._fd(s, "raw"), size)
            self.sizes[s] = size

    def _unmap(self, s: int) -> None:
        mm = self.maps.pop(s, None)
        if mm is not None:
            try:
                mm.close()
            except BufferError:  # a view of it held by an error's traceback: unmapped when that goes
                pass

    def _fd(self, slot: int, kind: str) -> int:
        fd = self.fds.get((slot, kind))
        if fd is None:
            os.makedirs(_slots_dir(self.root), exist_ok=True)
            path = raw_path(self.root, self.rank, slot) if kind == "raw" else _stamp_path(self.root, self.rank, slot)
            fd = self.fds[(slot, kind)] = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        return fd

    def _size(self, slot: int) -> int:
        """Bytes slot `slot`'s raw file holds: looked at once, then known (this object is its only
        writer); 0 while there is no file."""
        known = self.sizes[slot]
        if known is None:
            try:
                known = self.sizes[slot] = os.path.getsize(raw_path(self.root, self.rank, slot))
            except OSError:
                return 0
        return known

    def size_of(self, step: int) -> int:
        """Bytes the slot a write of `step` would go over holds now."""
        return self._size(self._next(step))

    def size(self) -> int:
        """Bytes its slots hold now: what a new snapshot in them replaces rather than adds."""
        return sum(self._size(s) for s in range(SLOTS))

    def close(self) -> None:
        for s in list(self.maps):
            self._unmap(s)
        fds, self.fds = self.fds, {}
        for fd in fds.values():
            os.close(fd)


def _load(path: str) -> Any:
    if os.path.getsize(path) > _MAX_JSON:
        raise ValueError(f"{os.path.basename(path)} is over {_MAX_JSON} bytes")
    with open(path, "rb") as f:
        return json.loads(f.read())


def _names(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) and len(x) < 256 for x in v)


def _stamp(path: str) -> Optional[dict]:
    """A slot's stamp: None when blank or absent (the slot holds no step). Raises ValueError on one
    that is not a whole step, layout and size (a held slot's came from the buddy)."""
    try:
        with open(path, "rb") as f:
            text = f.read(STAMP + 1)
    except FileNotFoundError:
        return None
    if not text.strip():
        return None
    st = json.loads(text) if len(text) <= STAMP else None
    if not isinstance(st, dict) or not all(whole(st.get(k)) for k in ("step", "layout", "size")):
        raise ValueError(f"slot stamp {os.path.basename(path)}: not whole step, layout and size")
    return st


def _stamp_or_none(path: str) -> Optional[dict]:
    try:
        return _stamp(path)
    except ValueError:  # a slot that holds no step worth keeping: the next write goes over it
        return None


def stamped_steps(part_root: str) -> set[int]:
    """The steps some rank's slot under `part_root` holds, by their stamps."""
    sd = _slots_dir(part_root)
    names = [n for n in os.listdir(sd) if n.endswith(".stamp")] if os.path.isdir(sd) else []
    return {st["step"] for n in names if (st := _stamp_or_none(os.path.join(sd, n)))}


def materialize(part_root: str, step: int, attempt: str) -> Optional[str]:
    """The node part of `step` under `part_root` in a sharded save's form (step-N): as it is when a
    full save left it there, else made from every rank's slot of `step` stamped with this attempt,
    checked against its layout's template. None when no rank's slot makes a whole node (a rank's
    slot moved on, or its stamp is missing: the step is not here). Raises ValueError on a template
    or stamp that does not hold together (hostile input)."""
    final = os.path.join(part_root, name_for(step))
    if os.path.isdir(final):
        return final
    sd = _slots_dir(part_root)
    stamps: dict[int, tuple[int, dict]] = {}  # rank: (its slot of `step`, the stamp)
    for n in os.listdir(sd) if os.path.isdir(sd) else []:
        m = re.match(rf"^__(\d{{1,7}})\.s([0-{SLOTS - 1}])\.stamp\Z", n, re.ASCII)
        st = _stamp(os.path.join(sd, n)) if m else None  # None: blank, this slot was being written
        if m and st and st["step"] == step and st.get("attempt") == attempt:
            stamps[int(m.group(1))] = (int(m.group(2)), st)
    if not stamps:
        return None
    tmp = shards.tmp_dir(part_root, step, attempt)
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(os.path.join(tmp, shards.MARKERS))
    done = None
    for rank, (slot, st) in sorted(stamps.items()):
        tdir = layout_dir(part_root, st["layout"])
        mark_path = os.path.join(tdir, f"__{rank}.mark.json")
        raw = raw_path(part_root, rank, slot)
        meta = os.path.join(tdir, shards.METADATA)
        if (not os.path.isfile(mark_path) or not os.path.isfile(raw) or os.path.getsize(raw) != st["size"]
                or (rank == 0 and not os.path.isfile(meta))):
            return None  # the layout's template is gone or the bytes are not the stamp's: not this step
        mark = _load(mark_path)
        if (not isinstance(mark, dict) or mark.get("rank") != rank or mark.get("layout") != st["layout"]
                or not all(whole(mark.get(k)) for k in ("node_rank", "local_world_size", "world_size"))
                or not _names(mark.get("reads")) or ("expect" in mark and not _names(mark["expect"]))):
            raise ValueError(f"the template of rank {rank}'s layout {st['layout']} does not hold together")
        os.replace(raw, os.path.join(tmp, memory_raw.raw_name(rank)))
        shutil.copyfile(os.path.join(tdir, memory_raw.layout_name(rank)), os.path.join(tmp, memory_raw.layout_name(rank)))
        if rank == 0:
            shutil.copyfile(meta, os.path.join(tmp, shards.METADATA))
        done = shards.finish_rank(part_root, step, attempt, rank=rank, node_rank=mark["node_rank"],
                                  local_world_size=mark["local_world_size"], world_size=mark["world_size"],
                                  reads=mark["reads"], expect=mark.get("expect"), guard_uploads=False, sync=False)
    return done
