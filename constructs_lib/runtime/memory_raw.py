"""The memory tier's fast snapshot: after one full torch.distributed.checkpoint (DCP) save has fixed
where each of a rank's items lies in its files, later snapshots write the rank's bytes raw, in that
order, with no DCP planning collectives and no torch.save per tensor (about 40 ms of Python per
rank per snapshot, held under the GIL the training thread needs). Only when a node dies does the
supervisor turn a raw part back into DCP's own files (to_dcp), at the offsets and lengths DCP wrote,
so the step resumes through the ordinary sharded restore.

A raw part holds, per rank: `__R.raw` (the items' bytes back to back), `__R.layout.json` (where each
item goes in which DCP file, and its dtype, shape and stride), the rank's shard marker, and on global
rank 0 DCP's `.metadata` of the full save (offsets do not change while every item's size stays the
same; a snapshot whose sizes changed is a full save again, agreed by every rank).
"""
from __future__ import annotations

import io
import json
import math
import os
import re
import shutil
from typing import Any, Optional

from .records import whole

_RAW = re.compile(r"^__(\d{1,7})\.raw\Z", re.ASCII)
_LAYOUT = re.compile(r"^__(\d{1,7})\.layout\.json\Z", re.ASCII)
# A DCP shard file of one rank (FileSystemWriter: __<rank>_<n>.distcp); memory_store names files by it too.
DISTCP = re.compile(r"^__(\d{1,7})_\d{1,4}\.distcp\Z", re.ASCII)
_DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
           "float8_e4m3fn", "float8_e5m2", "complex64")
MAX_ITEMS = 1_000_000


def raw_name(rank: int) -> str:
    return f"__{rank}.raw"


def layout_name(rank: int) -> str:
    return f"__{rank}.layout.json"


def is_fast_file(name: str, rank: Optional[int] = None) -> bool:
    m = _RAW.match(name) or _LAYOUT.match(name)
    return bool(m) and (rank is None or int(m.group(1)) == rank)


def _key(index: Any) -> tuple:
    return index.fqn, None if index.offset is None else tuple(index.offset)


def _as_written(data: Any) -> Any:
    """What DCP's FileSystemWriter writes for a resolved item: the BytesIO's buffer, or the tensor
    with minimal storage (a view is cloned, as filesystem._SerialCpuLoader does)."""
    if isinstance(data, io.BytesIO):
        return data.getbuffer()
    t = data.detach()
    if t.untyped_storage().nbytes() != t.nbytes:
        t = t.clone()
    return t


def layout_of(planner: Any, storage_data: dict, rank: int) -> Optional[dict]:
    """This rank's items after a full save by `planner` (its finished plan), in plan order, with
    where DCP put each; None when some item is not in storage_data (nothing fast then)."""
    where = {_key(k): v for k, v in storage_data.items()}
    items = []
    raw = 0
    for wi in planner.plan.items:
        info = where.get(_key(wi.index))
        m = DISTCP.match(info.relative_path) if info is not None else None
        if m is None or int(m.group(1)) != rank:
            return None
        data = _as_written(planner.resolve_data(wi))
        if isinstance(data, memoryview):
            it = {"kind": "bytes", "n": data.nbytes}
        else:
            it = {"kind": "tensor", "n": data.untyped_storage().nbytes(), "dtype": str(data.dtype).removeprefix("torch."),
                  "shape": list(data.shape), "stride": list(data.stride()), "at": data.storage_offset()}
        items.append({**it, "file": info.relative_path, "off": info.offset, "len": info.length, "raw": raw})
        raw += it["n"]
    return {"rank": rank, "items": items, "size": raw}


class Sources:
    """Where each of a rank's items comes from in the staged state, worked out once at the full
    save: a tensor DCP writes as it is is the staging buffer itself, refilled in place every step
    (memory_tier._stage, until its buffers are new), so only pickled values and tensors DCP
    would copy are looked up again, by their path in the nested state; a pickled value that is
    a plain one (a number, a string, a tuple or list of them) equal to the last step's keeps its bytes
    (an optimizer's param_groups are dozens of such items a rank, each a torch.save: measured
    0.9 ms a snapshot of a 3-layer model's, more than writing its bytes)."""

    def __init__(self, planner: Any) -> None:
        mappings = getattr(planner, "mappings", None) or {}
        self.planner = planner
        self.items: list[tuple[Any, tuple, Any]] = []
        for wi in planner.plan.items:
            data = planner.resolve_data(wi)
            live = None
            if not isinstance(data, io.BytesIO):
                t = data.detach()
                live = t if t.untyped_storage().nbytes() == t.nbytes else None
            self.items.append((wi, tuple(mappings.get(wi.index.fqn, (wi.index.fqn,))), live))
        self.fixed: Optional[list] = None  # per item: a live buffer's bytes, checked once (chunks)
        self.dynamic: list[int] = []  # the items looked up again at each snapshot
        self.pickled: dict[int, tuple[Any, Any]] = {}  # item -> (its plain value, that value's bytes)

    def chunks(self, staged: dict, layout: dict) -> Optional[list]:
        """The rank's items' bytes in layout order, or None when one no longer fits the layout. A
        live buffer is checked and turned into bytes once (it stays the same tensor, refilled in
        place), so a step's Python work is only for the pickled values and copied tensors."""
        if self.fixed is None:
            fixed: list[Any] = []
            for (wi, where, live), it in zip(self.items, layout["items"]):
                data = _checked_item(_as_written(live), it) if live is not None else None
                if live is not None and data is None:
                    return None
                fixed.append(data)
            self.fixed = fixed
            self.dynamic = [i for i, d in enumerate(fixed) if d is None]
        out = list(self.fixed)
        for i in self.dynamic:
            wi, where, live = self.items[i]
            it = layout["items"][i]
            try:
                data = self._pickled(i, staged, where) if it["kind"] == "bytes" else None
                if data is None:
                    data = _checked_item(_as_written(self.resolve(staged, wi, where, live)), it)
            except (KeyError, IndexError, TypeError, ValueError):
                return None  # the state's structure changed: a full save fixes a new layout
            if data is None:
                return None
            if it["kind"] == "bytes" and i not in self.pickled:
                value = _walk(staged, where)
                if _plain(value):
                    self.pickled[i] = (_frozen(value), data)
            out[i] = data
        return out

    def _pickled(self, i: int, staged: dict, where: tuple) -> Any:
        """The last bytes of item i if its value is still the same plain value, else None."""
        hit = self.pickled.get(i)
        if hit is None:
            return None
        value = _walk(staged, where)
        if _plain(value) and same_value(_frozen(value), hit[0]):
            return hit[1]
        del self.pickled[i]
        return None

    def resolve(self, staged: dict, wi: Any, path: tuple, live: Any) -> Any:
        from torch.distributed.checkpoint.utils import find_state_dict_object

        if live is not None:
            return live
        return self.planner.transform_object(wi, find_state_dict_object({wi.index.fqn: _walk(staged, path)}, wi.index))


def written(views: list, n: int) -> None:
    """Drop the first `n` bytes from `views` (byte memoryviews), in place: what is left to write
    after a pwritev or sendmsg that wrote `n` of them."""
    while views and n >= views[0].nbytes:
        n -= views[0].nbytes
        views.pop(0)
    if views and n:
        views[0] = views[0][n:]


def _walk(staged: Any, path: tuple) -> Any:
    for key in path:
        staged = staged[key]
    return staged


def same_value(a: Any, b: Any) -> bool:
    """Plain values that pickle to the same bytes (0.0 and -0.0 are equal, not the same)."""
    if type(a) is not type(b):
        return False
    if type(a) is tuple:
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    return a == b and (type(a) is not float or math.copysign(1.0, a) == math.copysign(1.0, b))


def _plain(v: Any) -> bool:
    """A value whose equality means the same pickled bytes: numbers, strings, and tuples and lists
    of them (a param group's parameter names)."""
    if type(v) in (int, float, bool, str, bytes, type(None)):
        return True
    return type(v) in (tuple, list) and all(_plain(x) for x in v)


def _frozen(v: Any) -> Any:
    """A plain value as a copy no one can change, list and tuple told apart (they pickle apart)."""
    if type(v) in (tuple, list):
        return (type(v).__name__, tuple(_frozen(x) for x in v))
    return v


def _checked_item(data: Any, it: dict) -> Any:
    """The bytes to write for one item as written (_as_written), or None when it is not the layout's item."""
    if isinstance(data, memoryview):
        return data if it["kind"] == "bytes" and data.nbytes == it["n"] else None
    if (it["kind"] != "tensor" or list(data.shape) != it["shape"] or list(data.stride()) != it["stride"]
            or str(data.dtype).removeprefix("torch.") != it["dtype"] or data.untyped_storage().nbytes() != it["n"]):
        return None
    return _storage_bytes(data)


def _storage_bytes(t: Any) -> Any:
    import torch

    return torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage()).numpy()


def to_dcp(part: str, dest: str) -> None:
    """Copy a node part to `dest` as DCP's own files: each rank's raw bytes become the DCP files its
    layout names, torch.save by torch.save, checked against the offsets and lengths DCP wrote.
    A part with no raw files is copied as it is. Raises ValueError on a layout or raw file that
    does not hold together (a part from a buddy is hostile input)."""
    os.makedirs(dest, exist_ok=True)
    for name in sorted(os.listdir(part)):
        src = os.path.join(part, name)
        if os.path.isdir(src):
            shutil.copytree(src, os.path.join(dest, name), dirs_exist_ok=True)
        elif _LAYOUT.match(name):
            rank = int(_LAYOUT.match(name).group(1))
            _rebuild(os.path.join(part, raw_name(rank)), src, dest, rank)
        elif not _RAW.match(name):
            shutil.copy2(src, os.path.join(dest, name))


def _rebuild(raw_path: str, layout_path: str, dest: str, rank: int) -> None:
    import torch

    with open(layout_path) as f:
        layout = json.load(f)
    raw_size = os.path.getsize(raw_path)
    items = _checked(layout, rank, raw_size)
    with open(raw_path, "rb") as f:
        raw = f.read()
    by_file: dict[str, list[dict]] = {}
    for it in items:
        by_file.setdefault(it["file"], []).append(it)
    for file, its in by_file.items():
        with open(os.path.join(dest, file), "wb") as out:
            for it in sorted(its, key=lambda i: i["off"]):
                if out.tell() != it["off"]:
                    raise ValueError(f"{file}: an item at {it['off']} follows bytes up to {out.tell()}")
                chunk = raw[it["raw"]:it["raw"] + it["n"]]
                if it["kind"] == "bytes":
                    out.write(chunk)
                else:
                    storage = torch.UntypedStorage.from_buffer(chunk, dtype=torch.uint8) if chunk else torch.UntypedStorage(0)
                    t = torch.empty(0, dtype=getattr(torch, it["dtype"])).set_(storage, it["at"], it["shape"], it["stride"])
                    torch.save(t, out)
                if out.tell() - it["off"] != it["len"]:
                    raise ValueError(f"{file}: an item of {it['len']} bytes came out as {out.tell() - it['off']}")


def _checked(layout: Any, rank: int, raw_size: int) -> list[dict]:
    """The layout's items, each field checked, or ValueError."""
    items = layout.get("items") if isinstance(layout, dict) else None
    if not isinstance(items, list) or len(items) > MAX_ITEMS or layout.get("rank") != rank:
        raise ValueError(f"layout of rank {rank}: not a list of items for this rank")

    for it in items:
        if not isinstance(it, dict) or not all(whole(it.get(k)) for k in ("n", "off", "len", "raw")):
            raise ValueError(f"layout of rank {rank}: an item without whole sizes and offsets")
        m = DISTCP.match(it.get("file") if isinstance(it.get("file"), str) else "")
        if not m or int(m.group(1)) != rank or it["raw"] + it["n"] > raw_size:
            raise ValueError(f"layout of rank {rank}: an item outside its raw bytes or not in this rank's file")
        if it.get("kind") == "tensor":
            dims = it.get("shape"), it.get("stride")
            if (it.get("dtype") not in _DTYPES or not whole(it.get("at"))
                    or not all(isinstance(d, list) and len(d) <= 64 and all(whole(x) for x in d) for d in dims)
                    or len(dims[0]) != len(dims[1])):
                raise ValueError(f"layout of rank {rank}: a tensor item with a bad dtype, shape or stride")
        elif it.get("kind") != "bytes":
            raise ValueError(f"layout of rank {rank}: an item of unknown kind")
    return items


def is_raw(part: str) -> bool:
    return any(_RAW.match(n) for n in os.listdir(part)) if os.path.isdir(part) else False


def dcp_copy(part: str) -> str:
    """`part` itself when it holds DCP's files, else a sibling copy converted to them (to_dcp)."""
    if not is_raw(part):
        return part
    dest = os.path.join(os.path.dirname(part), f".dcp-{os.path.basename(part)}")
    shutil.rmtree(dest, ignore_errors=True)
    to_dcp(part, dest)
    return dest

