"""Sharded checkpoints in S3: every node uploads its part, and the step is complete when a
MANIFEST.json lists the parts of every node.

    <prefix>/step-N/data-<attempt>/<file>              each node's shard files (and rank 0's .metadata)
    <prefix>/step-N/parts-<attempt>/node-<k>.json      node k's part: its files with their S3 SHA-256,
                                                        the files each of its ranks reads back,
                                                        and (rank 0's node) every file the save wrote
    <prefix>/step-N/MANIFEST.json                      written last, by whichever node finds every part there

Each node, after its part is in S3, lists the step's parts once; S3 is strongly consistent, so
the last node to write its part always sees every part and commits. That is one LIST per node
per checkpoint and one read per part by the committer, never a poll. A killed node (or a save
killed on any node) leaves a part missing, so the step never gets a manifest. The attempt
keeps a step saved again after a restore from ever mixing files with an earlier, killed attempt.
"""
from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any, Optional

from . import records
from .errors import RuntimeUserError
from .layout import FORMAT, name_for, step_of
from .manifest import file_problem, manifest_problem
from .records import printable, texts, whole
from .shards import MARKERS, attempt_problem, rank_of, ranks_are, world_problem
from .store import CheckpointStore, RemoteCheckpoint


_PART_KEY = re.compile(r"^node-(\d{1,7})\.json\Z", re.ASCII)


def _data(attempt: str) -> str:
    return f"data-{attempt}"


def _parts(attempt: str) -> str:
    return f"parts-{attempt}"


def push_part(store: CheckpointStore, local_dir: str, step: int, part: dict) -> int:
    """Upload this node's files of a complete local sharded save, then its part record. Returns bytes sent."""
    attempt = part["attempt"]
    if attempt_problem(attempt):
        raise RuntimeUserError(f"local save {local_dir!r}: {attempt_problem(attempt)}")
    name = name_for(step)
    files = [(rel, full) for rel, full in store._local_files(local_dir) if not rel.startswith(MARKERS + "/")]
    entries = store.upload_files(files, lambda rel: store._key(name, f"{_data(attempt)}/{rel}"))
    body = {"format": FORMAT, "step": step, **part, "files": entries}
    store._call(store.client.put_object, Bucket=store.bucket,
                Key=store._key(name, f"{_parts(attempt)}/node-{part['node_rank']}.json"),
                Body=json.dumps(body).encode(), ContentType="application/json")
    return sum(e["size"] for e in entries)


def part_problem(p: Any) -> Optional[str]:
    """Why a node's part record cannot be merged, or None. Every number that sizes a loop or a
    set (the world size, the ranks) is bounded here, before merge() uses it."""
    if not isinstance(p, dict):
        return "not a JSON object"
    if p.get("format", FORMAT) != FORMAT or not whole(p.get("step")):
        return f"format {printable(p.get('format'), 40)} or step {printable(p.get('step'), 40)}"
    why = attempt_problem(p.get("attempt")) or world_problem(p.get("world_size"))
    if why:
        return why
    if not whole(p.get("node_rank"), 0, p["world_size"]):
        return f"node_rank {printable(p.get('node_rank'), 40)}"
    reads = p.get("reads")
    if not isinstance(reads, dict) or not reads or len(reads) > p["world_size"]:
        return "no object of ranks to the files each reads"
    for rank, files in reads.items():
        if rank_of(rank, p["world_size"]) is None:
            return f"rank {printable(rank, 20)} is not one of the world's"
        if not texts(files, most=1_000_000, width=1024):
            return f"rank {rank} reads {printable(files, 40)}, not a list of file names"
    if "expect" in p and not texts(p["expect"], most=1_000_000, width=1024):
        return "expect is not a list of file names"
    files = p.get("files")
    if not isinstance(files, list):
        return "no list of files"
    for f in files:
        why = file_problem(f)
        if why:
            return why
    return None


def _read_parts(store: CheckpointStore, step: int, attempt: str) -> list[dict]:
    name = name_for(step)
    base = store._key(name, f"{_parts(attempt)}/")
    pages = store.client.get_paginator("list_objects_v2").paginate(Bucket=store.bucket, Prefix=base)
    keys = [o["Key"] for page in store._call(lambda: list(pages)) for o in page.get("Contents", [])]
    parts = []
    for key in sorted(keys):
        m = _PART_KEY.match(key.rsplit("/", 1)[-1])
        if not m:
            continue
        part = records.read(store, key, limit=records.MAX_PART, problem=part_problem).value
        if part is not None:
            parts.append({**part, "_key_node": int(m.group(1))})
    return parts


def merge(parts: list[dict], step: int, attempt: str) -> Optional[dict]:
    """The manifest the parts make, or None while a part is missing (or they disagree: two parts
    claiming one rank or one file with different bytes, a part not under its own node's name)."""
    files: dict[str, dict] = {}
    reads: dict[str, list[str]] = {}
    expect, world = None, None
    for p in parts:
        if part_problem(p):
            return None  # _read_parts sets such a part aside (and says so); merge() trusts no input either
        if p["step"] != step or p["attempt"] != attempt:
            continue
        if p.get("_key_node") != p.get("node_rank"):
            return None
        if world is None:
            world = p.get("world_size")
        if p.get("world_size") != world:
            return None
        for f in p["files"]:
            if f["path"] in files and files[f["path"]] != f:
                return None
            files[f["path"]] = f
        mine = p["reads"]
        if set(mine) & set(reads):
            return None  # one rank in two nodes' parts: two nodes think they are the same node
        reads.update(mine)
        if "0" in mine:
            expect = p.get("expect")
    if not isinstance(expect, list) or not isinstance(world, int) or world < 1:
        return None
    if not set(expect) <= set(files) or not ranks_are(reads, world):
        return None
    name = name_for(step)
    m = {"format": FORMAT, "step": step, "name": name, "files": [files[k] for k in sorted(files)],
         "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "dir": _data(attempt),
         "shards": {"attempt": attempt, "world_size": world, "reads": {k: reads[k] for k in sorted(reads, key=int)}}}
    return None if manifest_problem(m, name) else m


def commit(store: CheckpointStore, step: int, attempt: str) -> Optional[RemoteCheckpoint]:
    """Write the step's manifest if every node's part is in S3; None if some part is still missing."""
    m = merge(_read_parts(store, step, attempt), step, attempt)
    if m is None:
        return None
    store.put_manifest(m)
    return RemoteCheckpoint(step, m["name"], m)



def started(store: CheckpointStore, step: int, attempt: str) -> bool:
    """Whether some node has sent its part of this attempt of `step` (one LIST)."""
    r = store._call(store.client.list_objects_v2, Bucket=store.bucket,
                    Prefix=store._key(name_for(step), f"{_parts(attempt)}/"), MaxKeys=1)
    return r.get("KeyCount", 0) > 0


def _attempts(store: CheckpointStore, name: str) -> list[str]:
    r = store._call(store.client.list_objects_v2, Bucket=store.bucket, Prefix=store._key(name), Delimiter="/")
    out = []
    for cp in r.get("CommonPrefixes", []):
        seg = cp["Prefix"].rstrip("/").rsplit("/", 1)[-1]
        if seg.startswith("parts-") and not attempt_problem(seg[6:]):
            out.append(seg[6:])
    return out


def newest_complete(store: CheckpointStore, *, tries: int = 3) -> Optional[RemoteCheckpoint]:
    """The newest complete step, as store.latest(), after first completing any of the `tries`
    newest incomplete steps whose every part is in S3: its last node died between sending its part
    and writing the manifest (the others had looked too early). Asked once per plan, not polled."""
    for n in reversed(store._step_names()):
        m = store._manifest(n)
        if m:
            return RemoteCheckpoint(step_of(n), n, m)
        if tries > 0:
            tries -= 1
            for attempt in _attempts(store, n):
                cp = commit(store, step_of(n), attempt)
                if cp:
                    return cp
    return None
