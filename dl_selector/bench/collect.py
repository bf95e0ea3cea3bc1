"""`bench collect`: the nodes' result objects in S3 -> the throughput file `recommend --throughput`
and `bench report` read.

Every planned candidate ends in exactly one of two lists. `measurements` holds the median of its
timed windows (a window hit by a page-cache miss or a noisy neighbour moves a mean, not a median)
with the spread kept; `failed` holds the reason, in words a user can act on: never a zero, never
silently dropped. A broken dl-bench line fails the candidate rather than being skipped: a figure
from a program whose output we only half understand is not a measurement.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Optional

from dl_core.aws import error_code
from dl_core.benchline import Window, parse_output

from ..errors import UserError
from ..validate import clean, parse_json, read_text
from .contract import COLLECTED_VERSION, Plan, Result, result_key, started_key

# Fewer timed windows than this and the spread says nothing; the figure is kept, with a note.
MIN_WINDOWS_FOR_SPREAD = 3


@dataclass(frozen=True)
class Outcome:
    instance_type: str
    measurement: Optional[dict[str, Any]] = None
    reason: str = ""
    note: str = ""
    running: bool = False  # started and still inside its limit: no verdict yet


def load_plan(path: str) -> Plan:
    text = read_text(path, "bench plan")
    data = parse_json(text, path, "bench plan")
    try:
        return Plan.from_dict(data)
    except ValueError as e:
        raise UserError(f"bench plan file {clean(path)}: {clean(str(e))} (write one with 'python -m dl_selector bench plan')") from None


def judge(instance_type: str, minutes: int, result_text: Optional[str], started_text: Optional[str],
          where: str, now: Optional[datetime] = None) -> Outcome:
    """One candidate's outcome from its result object's text (None: no object) and its started
    marker's (None: the node never reported in); `now` tells a run still inside its limit from
    one that stopped without a result."""
    if result_text is None:
        if started_text is None:
            return Outcome(instance_type, reason=(
                "never reported in: no instance started the benchmark (no spot capacity, a launch error, or the "
                "deployment is still booting; see the stack's events and the instance's console output)"))
        began = _started_time(started_text)
        left = None if began is None else minutes - ((now or datetime.now(timezone.utc)) - began).total_seconds() / 60
        if left is not None and left > 0:
            return Outcome(instance_type, reason=(
                f"still running: started {_started_at(started_text)}, {left:.0f} of its {minutes}-minute limit left; "
                "collect again once it has written its result"), running=True)
        return Outcome(instance_type, reason=(
            f"started ({_started_at(started_text)}) but wrote no result within its {minutes}-minute limit: the node "
            "hung or was stopped before its upload (its console output has the rest)"))
    try:
        raw = json.loads(result_text)
        result = Result(**{k: raw[k] for k in Result.__dataclass_fields__ if k in raw})
    except (ValueError, TypeError) as e:
        return Outcome(instance_type, reason=f"result object {where} is not a result: {clean(str(e))[:160]}")
    if result.instance_type != instance_type:
        return Outcome(instance_type, reason=f"result object {where} names {clean(str(result.instance_type))[:60]}")
    tail = result.output_tail if isinstance(result.output_tail, str) else ""
    last = _last_line(tail)
    if result.reason:
        return Outcome(instance_type, reason=f"the runner failed: {clean(result.reason)[:300]}")
    if result.timed_out:
        return Outcome(instance_type, reason=f"ran past the {minutes}-minute limit and was killed; last output: {last}")
    if result.exit_code != 0:
        return Outcome(instance_type, reason=f"the command exited {result.exit_code}; last output: {last}")
    windows, problems = parse_output(tail)
    if problems:
        return Outcome(instance_type, reason=f"a dl-bench line does not follow the format ({clean(problems[0])[:200]})"
                                             f"{f' and {len(problems) - 1} more' if len(problems) > 1 else ''}")
    if not windows:
        return Outcome(instance_type, reason=("the command exited 0 but printed no dl-bench line "
                                              f"(README: Measured selection); last output: {last}"))
    return Outcome(instance_type, measurement=_summary(instance_type, windows, where),
                   note="" if len(windows) >= MIN_WINDOWS_FOR_SPREAD else
                   f"{len(windows)} window(s) only: no spread to judge the figure by")


def _summary(instance_type: str, windows: list[Window], where: str) -> dict[str, Any]:
    sps = [w.samples_per_second for w in windows]
    median = statistics.median(sps)
    labels: dict[str, str] = {}
    for w in windows:
        for k, v in w.labels.items():
            labels.setdefault(k, v)
    return {"instance_type": instance_type, "samples_per_second": round(median, 3), "min": min(sps),
            "max": max(sps), "windows": len(sps), "spread": round((max(sps) - min(sps)) / median, 4),
            "labels": labels, "result": where}


def _started_at(text: str) -> str:
    try:
        data = json.loads(text)
        return "at " + clean(str(data.get("started", "?")))[:40]
    except (ValueError, AttributeError):
        return "marker unreadable"


def _started_time(text: str) -> Optional[datetime]:
    try:
        when = datetime.fromisoformat(str(json.loads(text).get("started", "")).replace("Z", "+00:00"))
    except (ValueError, AttributeError, TypeError):
        return None
    return when if when.tzinfo is not None else None


def _last_line(tail: str) -> str:
    lines = [x.strip() for x in tail.splitlines() if x.strip()]
    return clean(lines[-1])[:200] if lines else "(none)"


Fetch = Callable[[str], Optional[str]]  # S3 key -> the object's text, None where it does not exist


def collect(plan: Plan, fetch: Fetch, *, source: str, prefix: Optional[str] = None,
            now: Optional[datetime] = None) -> tuple[dict[str, Any], list[Outcome]]:
    prefix = prefix or plan.prefix
    outcomes = []
    for c in plan.candidates:
        key = result_key(prefix, c.instance_type)
        result_text = fetch(key)
        started_text = fetch(started_key(prefix, c.instance_type)) if result_text is None else None
        outcomes.append(judge(c.instance_type, plan.minutes, result_text, started_text, f"{source}{key}", now))
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y-%m-%dT%H:%MZ")
    plan_dict = json.loads(plan.to_json())
    doc = {"version": COLLECTED_VERSION, "collected": stamp, "source": f"{source}{prefix.rstrip('/')}/",
           "plan": plan_dict,
           "measurements": [o.measurement for o in outcomes if o.measurement],
           "failed": [{"instance_type": o.instance_type, "reason": o.reason} for o in outcomes if not o.measurement]}
    return doc, outcomes


def s3_fetch(client, bucket: str) -> Fetch:
    """Reads keys from `bucket`; a missing key is None, any other S3 error propagates (the CLI turns
    it into one line: a wrong bucket or missing permission must not read as 'no result')."""
    import botocore.exceptions as bx

    def fetch(key: str) -> Optional[str]:
        try:
            body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        except bx.ClientError as e:
            if error_code(e) in ("NoSuchKey", "404"):
                return None
            raise
        return body.decode("utf-8", errors="replace")
    return fetch


def outcome_text(doc: dict[str, Any], outcomes: list[Outcome], out: str) -> str:
    lines = [f"collected {len(outcomes)} candidate(s) of plan {doc['plan']['name']} from {doc['source']}"]
    for o in outcomes:
        if o.measurement:
            m = o.measurement
            lines.append(f"  {o.instance_type:<18} {m['samples_per_second']:>12,.1f} samples/s "
                         f"(median of {m['windows']}, spread {m['spread']:.1%})" + (f"; {o.note}" if o.note else ""))
        elif o.running:
            lines.append(f"  {o.instance_type:<18} RUNNING: {o.reason}")
        else:
            lines.append(f"  {o.instance_type:<18} FAILED: {o.reason}")
    running = sum(o.running for o in outcomes)
    if running:
        lines.append(f"{running} candidate(s) still inside their limit: run bench collect again once they are done "
                     "(they are listed as failed in the file until then)")
    lines.append(f"written to {out}; next: python -m dl_selector bench report --results {out}  "
                 f"(or recommend --profile {doc['plan']['profile']} --throughput {out})")
    return "\n".join(lines)
