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
from typing import Optional

from .errors import RuntimeUserError
from .layout import FORMAT, MANIFEST, name_for
from .shards import MARKERS, attempt_problem
from .store import CheckpointStore, RemoteCheckpoint, manifest_problem


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


def _read_parts(store: CheckpointStore, step: int, attempt: str) -> list[dict]:
    name = name_for(step)
    base = store._key(name, f"{_parts(attempt)}/")
    pages = store.client.get_paginator("list_objects_v2").paginate(Bucket=store.bucket, Prefix=base)
    keys = [o["Key"] for page in store._call(lambda: list(pages)) for o in page.get("Contents", [])]
    parts = []
    for key in sorted(keys):
        try:
            parts.append(json.loads(store._call(store.client.get_object, Bucket=store.bucket, Key=key)["Body"].read()))
        except ValueError:
            continue  # not JSON: not a part this protocol wrote
    return parts


def merge(parts: list[dict], step: int, attempt: str) -> Optional[dict]:
    """The manifest the parts make, or None while a part is missing (or they disagree)."""
    files: dict[str, dict] = {}
    reads: dict[str, list[str]] = {}
    expect, world = None, None
    for p in parts:
        if not isinstance(p, dict) or p.get("step") != step or p.get("attempt") != attempt:
            continue
        if world is None:
            world = p.get("world_size")
        if p.get("world_size") != world:
            return None
        for f in p.get("files") or []:
            if f.get("path") in files and files[f["path"]] != f:
                return None  # two nodes claim one file with different bytes
            files[f.get("path")] = f
        reads.update(p.get("reads") or {})
        if "expect" in p:
            expect = p["expect"]
    if expect is None or not isinstance(world, int) or world < 1:
        return None
    if not set(expect) <= set(files) or set(reads) != {str(r) for r in range(world)}:
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
    name = name_for(step)
    store._call(store.client.put_object, Bucket=store.bucket, Key=store._key(name, MANIFEST),
                Body=json.dumps(m, indent=1).encode(), ContentType="application/json")
    return RemoteCheckpoint(step, name, m)

