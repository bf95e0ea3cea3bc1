"""Sharded checkpoints on the node: torch.distributed.checkpoint (DCP) state written by every rank.

A sharded save of step N goes to `.tmp-step-N-<attempt>` in the checkpoint directory of each
node (every rank writes its own shard there; global rank 0 also writes DCP's `.metadata`, which
DCP writes only after every rank's shard is written). When a rank's part is written it leaves a
marker in `.dl-shards/` with the files its rank must read back to resume (DCP's own load planner
says which), and the last rank of the node to finish renames the directory to `step-N`: complete
on this node. The node agent uploads each node's part; the step is complete in S3 only when the
parts of every node are there (sharded_store.py).

The attempt is one id agreed by every rank for this save, so a step saved again after a restore
never mixes its files with a killed earlier attempt's, locally or in S3.
"""
from __future__ import annotations

import json
import os
import re
import secrets
from typing import Any, Optional

from .layout import flocked, make_final, name_for, step_of, write_atomic

MARKERS = ".dl-shards"
RESTORED = ".dl-restored-subset"  # in a step restored from a sharded manifest: some nodes' files only
METADATA = ".metadata"  # DCP's FileSystemWriter writes it last, on the coordinator (global rank 0)
# Ranks of one save, every node's together: more than any cluster dl-launcher launches, few
# enough that a list of them costs little memory.
MAX_WORLD_SIZE = 131_072
_RANK = re.compile(r"^(0|[1-9][0-9]{0,6})\Z", re.ASCII)
_ATTEMPT = re.compile(r"^g\d{1,9}-[0-9a-f]{8}\Z", re.ASCII)


def attempt_problem(attempt: Any) -> Optional[str]:
    if not isinstance(attempt, str) or not _ATTEMPT.match(attempt):
        return f"attempt {attempt!r} is not like g12-0a1b2c3d"
    return None


def new_attempt(generation: Optional[str], pick: Optional[int] = None) -> str:
    # not `random`: a job's random.seed() must not repeat it. 31 bits: the top one marks a memory
    # snapshot's attempt (memory_tier.attempt_for), so no periodic save ever shares one.
    n = secrets.randbits(31) if pick is None else pick
    g = int(generation) if generation and generation.isdigit() else 0
    return f"g{g}-{n:08x}"


def tmp_dir(root: str, step: int, attempt: str) -> str:
    return os.path.join(root, f".tmp-{name_for(step)}-{attempt}")


def is_sharded(path: str) -> bool:
    return os.path.isdir(os.path.join(path, MARKERS))


def read_markers(path: str) -> list[dict]:
    out = []
    d = os.path.join(path, MARKERS)
    for n in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        if n.startswith("rank-") and n.endswith(".json"):
            try:
                with open(os.path.join(d, n)) as f:
                    out.append(json.load(f))
            except (OSError, ValueError):
                continue
    return out


def node_part(path: str) -> Optional[dict]:
    """What this node's markers say about its part of a complete local sharded save, or None when
    they do not make a whole node (a directory someone else assembled)."""
    marks = read_markers(path)
    if not marks:
        return None
    first = marks[0]
    keys = ("attempt", "node_rank", "local_world_size", "world_size")
    if any(any(m.get(k) != first.get(k) for k in keys) for m in marks):
        return None
    if len({m.get("rank") for m in marks}) != first.get("local_world_size"):
        return None
    reads = {str(m["rank"]): sorted(m.get("reads") or []) for m in marks}
    expect = next((m["expect"] for m in marks if m.get("rank") == 0 and "expect" in m), None)
    return {"attempt": first["attempt"], "node_rank": first["node_rank"], "world_size": first["world_size"],
            "reads": reads, **({"expect": sorted(expect)} if expect is not None else {})}


def read_set(state_dict: dict, metadata: Any) -> tuple[list[str], list[str]]:
    """(files this rank reads to load `state_dict` back from this save, every file the save wrote).
    Asked of DCP's own DefaultLoadPlanner, so it is what dcp.load will open with the same sharding."""
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    storage = metadata.storage_data or {}
    written = {info.relative_path for info in storage.values()}
    def key(index: Any) -> tuple:
        # By (fqn, offset): MetadataIndex's own lookup has missed on torch 2.11 with CUDA tensors.
        return index.fqn, None if index.offset is None else tuple(index.offset)

    where = {key(k): info.relative_path for k, info in storage.items()}
    try:
        planner = DefaultLoadPlanner()
        planner.set_up_planner(state_dict, metadata, is_coordinator=False)
        reads = {where[key(i.storage_index)] for i in planner.create_local_plan().items}
    except Exception:  # a state this planner cannot place: the node then restores every file
        reads = written
    return sorted(reads | {METADATA}), sorted(written | {METADATA})


def finish_rank(root: str, step: int, attempt: str, *, rank: int, node_rank: int, local_world_size: int,
                world_size: int, reads: list[str], expect: Optional[list[str]] = None,
                guard_uploads: bool = True, sync: bool = True) -> Optional[str]:
    """This rank's part is written: leave its marker; the node's last rank makes the save complete.
    Returns the final path if this call completed it. guard_uploads: replace an existing step
    only under the node agent's upload lock (False outside a dl-launcher node: no agent)."""
    tmp = tmp_dir(root, step, attempt)
    mark = {"rank": rank, "node_rank": node_rank, "local_world_size": local_world_size, "world_size": world_size,
            "attempt": attempt, "step": step, "reads": reads}
    if expect is not None:
        mark["expect"] = expect
    write_atomic(os.path.join(tmp, MARKERS, f"rank-{rank}.json"), json.dumps(mark))
    return complete_if_whole(root, step, attempt, guard_uploads=guard_uploads, sync=sync)


def complete_if_whole(root: str, step: int, attempt: str, *, guard_uploads: bool,
                      sync: bool = True) -> Optional[str]:
    """Rename the attempt's directory to step-N once its markers make a whole node; the final path then."""
    tmp = tmp_dir(root, step, attempt)
    # The local ranks of a node finish in any order; the last one renames. flock, not a rename
    # race: a rank that saw the others' markers must not move a directory another rank just made final.
    with flocked(os.path.join(root, ".commit.lock")):
        if not os.path.isdir(tmp) or node_part(tmp) is None:
            return None
        final = os.path.join(root, name_for(step))
        make_final(tmp, final, guard_uploads=guard_uploads, sync=sync)
        return final


def stale_tmp(root: str) -> list[str]:
    """Unfinished saves (a kill mid-write): never resumed, never uploaded."""
    out = []
    for n in os.listdir(root) if os.path.isdir(root) else []:
        if n.startswith(".tmp-step-") and step_of(n[5:22]) is not None:
            out.append(os.path.join(root, n))
    return sorted(out)


def world_problem(world: Any) -> Optional[str]:
    """Why `world` cannot be a sharded save's world size (the ranks of every node), or None."""
    if not isinstance(world, int) or isinstance(world, bool) or not 1 <= world <= MAX_WORLD_SIZE:
        return f"world_size {world!r} is not a whole number 1 to {MAX_WORLD_SIZE:,}"
    return None


def ranks_are(reads: dict, world: int) -> bool:
    """Whether the keys of `reads` are exactly the ranks 0..world-1, as decimal text."""
    return len(reads) == world and all(rank_of(k, world) is not None for k in reads)


def rank_of(key: Any, world: int) -> Optional[int]:
    """The rank a read set's key names (decimal ASCII, no sign or leading zero), if below `world`."""
    if not isinstance(key, str) or not _RANK.match(key) or int(key) >= world:
        return None
    return int(key)


def manifest_shards_problem(m: dict, paths: set[str]) -> Optional[str]:
    """Why a manifest's sharded part (its "dir" and "shards") cannot be trusted, or None."""
    if "shards" not in m and "dir" not in m:
        return None
    sh = m.get("shards")
    if not isinstance(sh, dict):
        return "a 'dir' without 'shards'"
    why = attempt_problem(sh.get("attempt"))
    if why:
        return why
    if m.get("dir") != f"data-{sh['attempt']}":
        return f"dir {m.get('dir')!r} is not data-{sh['attempt']}"
    why = world_problem(sh.get("world_size"))
    if why:
        return why
    reads = sh.get("reads")
    # The count first: a world size is bounded, but a set of every rank is built only for one
    # that the record's own (byte-limited) list of ranks can match.
    if not isinstance(reads, dict) or len(reads) != sh["world_size"] or not ranks_are(reads, sh["world_size"]):
        return "reads that do not name every rank"
    for r, files in reads.items():
        if not isinstance(files, list) or not set(files) <= paths:
            return f"rank {r} reads a file the manifest does not list"
    if METADATA not in paths:
        return f"no {METADATA}"
    return None


def needed_files(manifest: dict, ranks: Optional[range], world_size: Optional[int]) -> list[dict]:
    """The manifest's files a node with these global ranks must have to resume: its ranks' read
    sets when the world is the one that saved, else every file (DCP reshards on load)."""
    sh = manifest.get("shards")
    if not sh or ranks is None or world_size != sh["world_size"]:
        return manifest["files"]
    want = {METADATA}
    for r in ranks:
        want.update(sh["reads"].get(str(r), []))
    return [f for f in manifest["files"] if f["path"] in want]
