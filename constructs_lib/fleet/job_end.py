"""How a job ended, read from the records its nodes write, for the controller and `dl-launcher status`.

A job with a command ends once: the nodes' supervisor writes one of

    <prefix>/_cluster/finished.json   {"at", "generation", "node", "step"}   the command exited 0
    <prefix>/_cluster/failed.json     {"at", "generation", "node", "reason", "attempts", "last_lines"}
                                                                             failed for good

(runtime/cluster.py ClusterState.mark_finished/mark_failed) and from then on runs nothing. The
controller, told where to look by JOB_END_ENV (a job without a command has none: it never ends),
then stops the cluster (on_end "stop", the default) or keeps its nodes for debugging ("keep"),
and launches nothing more in either case: a replacement would only find the job over.

These records are untrusted input: any process on a node (the user's code included) may write
them. A forged one can end its own job early (the controller terminates this cluster's nodes,
which carry its cluster and stack tags, and launches none) and put its own text into `status`.
It cannot touch another cluster, make anything launch, or reach the controller's state
(contract.CONTROL_DIR, denied to the nodes). So a record counts only if it is a JSON object with
a finite `at` (what the supervisor always writes); every other field is checked, cut to size and
stripped of control characters (no terminal escapes reach a user's screen), and a record that is
too big or malformed is set aside with a reason, never a crash.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from typing import Any, Optional

from dl_core.aws import error_code

from ..runtime.contract import CLUSTER_DIR, S3_BUCKET
from ..runtime.layout import prefix_problem

JOB_END_ENV = "DL_JOB_END"
ON_END = ("stop", "keep")
RECORDS = (("finished", "finished.json"), ("failed", "failed.json"))  # the order the supervisor checks them in
MAX_RECORD = 64 * 1024   # bytes: the supervisor writes well under 10 KiB
MAX_LINES = 20           # last lines of the command's output a failure record carries
MAX_LINE = 300           # characters per line kept
MAX_REASON = 500


def clean(text: Any, limit: int) -> str:
    """Printable text only (a forged record's escapes never reach a terminal), at most `limit` characters."""
    s = "".join(ch if ch.isprintable() else " " for ch in str(text))
    return s if len(s) <= limit else s[:limit - 1] + "…"


@dataclass(frozen=True)
class JobEndWatch:
    """Where the controller looks for the job's end, and what it does then (JOB_END_ENV, JSON)."""
    bucket: str
    prefix: str       # the job's checkpoint prefix (the nodes' TAG_CHECKPOINT_PREFIX)
    on_end: str = "stop"

    def __post_init__(self) -> None:
        if self.on_end not in ON_END:
            raise ValueError(f"on_end {self.on_end!r}: allowed {', '.join(ON_END)}")
        if not isinstance(self.bucket, str) or not S3_BUCKET.match(self.bucket):
            raise ValueError(f"job end bucket {self.bucket!r} is not an S3 bucket name")
        if not isinstance(self.prefix, str) or self.prefix.startswith("/") or prefix_problem(self.prefix):
            raise ValueError(f"job end prefix {self.prefix!r} is not a checkpoint prefix")

    def key(self, name: str) -> str:
        return f"{self.prefix.rstrip('/')}/{CLUSTER_DIR}/{name}"

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "JobEndWatch":
        try:
            data = json.loads(text)
        except ValueError as e:
            raise ValueError(f"{JOB_END_ENV} is not JSON: {e}") from None
        if not isinstance(data, dict) or set(data) - {"bucket", "prefix", "on_end"}:
            raise ValueError(f"{JOB_END_ENV} must be an object with bucket, prefix and on_end")
        return cls(**data)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _count(v: Any) -> Optional[int]:
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 10 ** 12 else None


@dataclass(frozen=True)
class JobEnd:
    kind: str                      # finished | failed
    at: float
    generation: Optional[int] = None
    step: Optional[int] = None     # the job's final complete checkpoint (finished)
    attempts: Optional[int] = None  # failed runs in a row before the job was failed
    reason: str = ""
    last_lines: tuple[str, ...] = ()

    def line(self) -> str:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.at))
        gen = f"generation {self.generation}, " if self.generation is not None else ""
        if self.kind == "finished":
            at = f"at step {self.step}" if self.step is not None else "with no checkpoint in S3"
            return f"finished {at} ({gen}{when})"
        tries = f" after {self.attempts} attempt{'s' if self.attempts != 1 else ''}" if self.attempts else ""
        return f"failed{tries} ({gen}{when})" + (f": {self.reason}" if self.reason else "")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["last_lines"] = list(self.last_lines)
        return d

    @classmethod
    def from_dict(cls, kind: str, d: Any) -> Optional["JobEnd"]:
        """The record as a JobEnd; None unless it is an object with a finite `at`."""
        if not isinstance(d, dict) or not _number(d.get("at")):
            return None
        lines = d.get("last_lines")
        lines = lines[-MAX_LINES:] if isinstance(lines, list) else []
        return cls(kind=kind, at=float(d["at"]), generation=_count(d.get("generation")), step=_count(d.get("step")),
                   attempts=_count(d.get("attempts")),
                   reason=clean(d["reason"], MAX_REASON) if isinstance(d.get("reason"), str) else "",
                   last_lines=tuple(clean(x, MAX_LINE) for x in lines if isinstance(x, str)))


def parse(kind: str, body: bytes) -> tuple[Optional[JobEnd], Optional[str]]:
    """(the end, None), or (None, why the record was set aside)."""
    if len(body) > MAX_RECORD:
        return None, f"{len(body)} bytes, more than the {MAX_RECORD} any supervisor writes"
    try:
        data = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        return None, f"not JSON ({clean(e, 80)})"
    end = JobEnd.from_dict(kind, data)
    return (end, None) if end else (None, "not an object with a time `at`")


def read(s3: Any, watch: JobEndWatch) -> tuple[Optional[JobEnd], list[str]]:
    """The job's end (finished before failed, as the nodes look), and what was set aside.
    AWS errors other than "no such record" propagate: the caller decides what a failed look means."""
    problems = []
    for kind, name in RECORDS:
        key = watch.key(name)
        try:
            r = s3.get_object(Bucket=watch.bucket, Key=key, Range=f"bytes=0-{MAX_RECORD}")
        except Exception as e:
            if error_code(e) in ("NoSuchKey", "404"):
                continue
            raise
        end, problem = parse(kind, r["Body"].read(MAX_RECORD + 1))
        if end is not None:
            return end, problems
        problems.append(f"s3://{watch.bucket}/{key} set aside: {problem}")
    return None, problems
