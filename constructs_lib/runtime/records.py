"""Reading the job's records from S3: one way for all of them (plans, joins, end records, parts,
manifests).

Everything under the job's prefix is written by the nodes, and any process on any node may write
there (the user's code included): a record is data, never trusted to have the shape the code
expects. read() fetches at most a byte limit, parses JSON without NaN/Infinity, and asks the
record's own check (`problem`) why it cannot be used. A record that fails is *set aside*: the
caller gets None as if it were absent, the store's log gets one line per key and reason (not one
per poll), and store.set_aside keeps the reason for `runtime status`. Nothing is deleted or
rewritten: a record set aside by one node may be another node's evidence.

The limits bound what parsing may cost; each number that sizes an allocation or a loop is bounded
by the record's check before it is used (a world size, a member list, a step).
"""
from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Optional

from dl_core.aws import error_code

KiB, MiB = 1024, 1024 * 1024
# Per kind of record, the most bytes read. A plan of 10,000 members is ~600 KiB; a sharded part
# lists one node's files and its ranks' read sets; a manifest, every file of a step.
MAX_CLUSTER_RECORD = 1 * MiB
MAX_PART = 16 * MiB
MAX_MANIFEST = 64 * MiB
MAX_SET_ASIDE = 256  # reasons kept for status; the oldest go first

# An EC2 instance id on a node; simulated nodes in tests use short ids like i-0a. No '/', '_'
# (the join key's separator), space or control character: a node id goes into keys, logs, env files.
_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]{0,63}\Z", re.ASCII)


class Unreadable(ValueError):
    """The bytes are not a JSON value this runtime reads."""


def _no_constants(name: str) -> Any:
    raise Unreadable(f"{name} is not a number JSON allows")


def parse(data: bytes) -> Any:
    try:
        return json.loads(data, parse_constant=_no_constants)
    except Unreadable:
        raise
    except (ValueError, RecursionError) as e:  # not JSON, not UTF-8, digits past Python's limit, too deep
        raise Unreadable(f"not JSON ({type(e).__name__})") from None


@dataclass(frozen=True)
class Got:
    value: Any = None          # the checked record; None when absent or set aside
    problem: Optional[str] = None  # why it was set aside


def read(store: Any, key: str, *, limit: int, problem: Callable[[Any], Optional[str]]) -> Got:
    """The record at `key` (full key in store.bucket): Got(value) when it passes `problem`,
    Got(problem=why) when set aside, Got() when there is none. S3 errors other than a missing
    key propagate (the callers ride out or report those)."""
    try:
        r = store._call(store.client.get_object, Bucket=store.bucket, Key=key)
    except Exception as e:
        if error_code(e) in ("NoSuchKey", "404"):
            store.set_aside.pop(key, None)
            return Got()
        raise
    body = r["Body"]
    try:
        size = r.get("ContentLength")
        data = b"" if isinstance(size, int) and size > limit else body.read(limit + 1)
    finally:
        body.close()
    why = None
    if (isinstance(size, int) and size > limit) or len(data) > limit:
        why = f"more than {limit:,} bytes"
    else:
        try:
            value = parse(data)
            why = problem(value)
        except Unreadable as e:
            why = str(e)
    if why is None:
        store.set_aside.pop(key, None)
        return Got(value)
    note(store, key, why)
    return Got(problem=why)


def note(store: Any, key: str, why: str) -> None:
    """Log a record set aside, once per key and reason."""
    if store.set_aside.get(key) == why:
        return
    store.set_aside.pop(key, None)
    store.set_aside[key] = why
    while len(store.set_aside) > MAX_SET_ASIDE:
        store.set_aside.pop(next(iter(store.set_aside)))
    store.log(f"set aside s3://{store.bucket}/{key}: {why}")


# ---- checks shared by the records' schemas -----------------------------------------------------------
def whole(v: Any, lo: int = 0, hi: int = 10**12) -> bool:
    """A JSON integer (not a bool, not a float) with lo <= v < hi."""
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v < hi


def number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) < 1e15


def texts(v: Any, most: int = 1000, width: int = 4096) -> bool:
    return isinstance(v, list) and len(v) <= most and all(isinstance(x, str) and len(x) <= width for x in v)


def node_problem(node: Any) -> Optional[str]:
    if not isinstance(node, str) or not _NODE.match(node):
        return f"node {node!r} is not an instance id"
    return None


def addr_problem(addr: Any) -> Optional[str]:
    try:
        ipaddress.ip_address(addr if isinstance(addr, str) else "")
    except ValueError:
        return f"address {addr!r} is not an IP address"
    return None


def printable(text: Any, limit: int = 500) -> str:
    """Text from a record as one printable line: no escape from a record reaches a terminal."""
    if isinstance(text, (list, dict)):  # never the repr of a whole record-sized value
        s = f"{'a list' if isinstance(text, list) else 'an object'} of {len(text)}"
    else:
        s = text if isinstance(text, str) else repr(text)
    return "".join(c if c.isprintable() else "?" for c in s)[:limit]
