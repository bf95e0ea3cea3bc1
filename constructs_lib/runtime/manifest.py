"""A checkpoint's MANIFEST.json: what S3 reports as a file's SHA-256, and whether a manifest read
back from S3 (or a sharded part's file list) can be trusted. A manifest that fails is treated
like a missing one: the step is incomplete, never restored.
"""
from __future__ import annotations

import base64
import hashlib
from typing import Any, Optional

from .layout import FORMAT, MANIFEST, step_of
from .records import printable
from .shards import manifest_shards_problem

MiB = 1024 * 1024


def _b64sha256(data: bytes) -> str:
    return base64.b64encode(hashlib.sha256(data).digest()).decode()


def local_checksum(path: str, checksum_type: str, part_size: int) -> str:
    """What S3 reports as ChecksumSHA256 for this file: SHA-256 of the bytes (FULL_OBJECT), or,
    for a multipart upload (COMPOSITE), SHA-256 over the concatenated SHA-256 of each part."""
    with open(path, "rb") as f:
        if checksum_type != "COMPOSITE":
            h = hashlib.sha256()
            for block in iter(lambda: f.read(4 * MiB), b""):
                h.update(block)
            return base64.b64encode(h.digest()).decode()
        digests = b"".join(hashlib.sha256(part).digest() for part in iter(lambda: f.read(part_size), b""))
    return _b64sha256(digests)


_CHECKSUM_TYPES = ("FULL_OBJECT", "COMPOSITE")
_MAX_PART = 5 * 1024 * MiB  # S3's largest part


def whole_number(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _path_problem(path: Any) -> Optional[str]:
    if not isinstance(path, str) or not path or len(path) > 1024:
        return "not a non-empty string"
    if path.startswith("/") or "\\" in path or "\x00" in path:
        return "absolute, or with a backslash or NUL"
    if any(seg in ("", ".", "..") for seg in path.split("/")):
        return "with an empty, '.' or '..' segment"
    if path == MANIFEST:
        return f"named {MANIFEST}"
    return None


def file_problem(f: Any) -> Optional[str]:
    """Why one file entry of a manifest (or of a sharded part) cannot be trusted, or None."""
    if not isinstance(f, dict):
        return "a file entry that is not an object"
    why = _path_problem(f.get("path"))
    if why:
        return f"file path {printable(f.get('path'), 80)} {why}"
    size, part = f.get("size"), f.get("part_size")
    if not whole_number(size) or size < 0:
        return f"{f['path']}: size {printable(size, 40)} is not a whole number >= 0"
    if not isinstance(f.get("sha256"), str) or not f["sha256"] or len(f["sha256"]) > 128:
        return f"{f['path']}: no sha256"
    kind = f.get("checksum_type", "FULL_OBJECT")
    if kind not in _CHECKSUM_TYPES:
        return f"{f['path']}: checksum_type {printable(kind, 40)}"
    if part is not None and (not whole_number(part) or part < 0 or part > _MAX_PART):
        return f"{f['path']}: part_size {printable(part, 40)}"
    if kind == "COMPOSITE" and not part:
        return f"{f['path']}: a COMPOSITE checksum without a part_size"
    return None


def manifest_problem(m: Any, name: str) -> Optional[str]:
    """Why the parsed MANIFEST.json of checkpoint `name` cannot be trusted, or None. A manifest
    that fails is treated like a missing one: the step is incomplete, never restored."""
    if not isinstance(m, dict):
        return "not a JSON object"
    if m.get("format") != FORMAT:
        return f"format {printable(m.get('format'), 40)}, expected {FORMAT}"
    if not whole_number(m.get("step")) or m["step"] != step_of(name):
        return f"step {printable(m.get('step'), 40)} does not match {name}"
    files = m.get("files")
    if not isinstance(files, list) or not files:
        return "no list of files"
    paths: set[str] = set()
    for f in files:
        why = file_problem(f)
        if why:
            return why
        paths.add(f["path"])
    if len(paths) != len(files):
        return "a file listed twice"
    for p in paths:  # a file cannot also be a directory of another
        segs = p.split("/")
        if any("/".join(segs[:i]) in paths for i in range(1, len(segs))):
            return f"file path {p!r} lies under another file"
    return manifest_shards_problem(m, paths)
