"""The job's state as `dl-launcher status` shows it first: running (generation, newest complete
step), restoring, finished at step N, failed after K attempts with the last lines of its output,
or no command at all (a cluster that waits for you never ends by itself).

Read from the controller's state (where the job's records are, whether and how it acted on the
end), the nodes' records in S3 (generation plans, checkpoints, the end records: untrusted, so
nothing here lets a malformed one stop `status`) and the node monitor's Restoring metric.
"""
from __future__ import annotations

import datetime as dt
from typing import Any, Optional, Sequence

from ..runtime import contract
from .job_end import RECORDS, JobEnd, JobEndWatch, clean, read
from .state import ControllerState

RECENT = 300.0  # seconds: a node that said "restoring" this recently is restoring now


def restoring(cw: Any, cluster: str, now: float) -> Optional[bool]:
    """Whether any node's newest Restoring datum (the node monitor's, one a minute) says so; None
    without the metric (observability off, or no node has reported yet)."""
    seen, kw = [], {"Namespace": contract.NS_JOB, "MetricName": contract.M_RESTORING,
                    "Dimensions": [{"Name": contract.DIM_JOB, "Value": cluster}]}
    while True:
        page = cw.list_metrics(**kw)
        for m in page.get("Metrics", []):
            dims = [(d["Name"], d["Value"]) for d in m.get("Dimensions", [])]  # as listed (moto matches in order)
            if sorted(dims) not in [sorted(x) for x in seen]:  # one entry per series (moto lists one per datum)
                seen.append(dims)
        if not page.get("NextToken") or len(seen) >= 500:
            break
        kw["NextToken"] = page["NextToken"]
    if not seen:
        return None
    queries = [{"Id": f"r{i}", "ReturnData": True, "MetricStat": {"Metric": {
        "Namespace": contract.NS_JOB, "MetricName": contract.M_RESTORING,
        "Dimensions": [{"Name": k, "Value": v} for k, v in dims]}, "Period": contract.METRIC_PERIOD, "Stat": "Maximum"}}
        for i, dims in enumerate(seen[:500])]
    page = cw.get_metric_data(MetricDataQueries=queries, ScanBy="TimestampDescending",
                              StartTime=dt.datetime.fromtimestamp(now - RECENT, dt.timezone.utc),
                              EndTime=dt.datetime.fromtimestamp(now + 60, dt.timezone.utc))
    newest = [r["Values"][0] for r in page.get("MetricDataResults", []) if r.get("Values")]
    return any(v >= 1 for v in newest) if newest else None


def describe(state: ControllerState, s3: Any, cw: Any, nodes: Sequence[Any], now: float) -> tuple[list[str], dict]:
    """The lines status prints first, and the same as JSON."""
    if state.job is None:
        return ["job: none (no command): the nodes wait for you and never end by themselves; `dl-launcher destroy` "
                "or the idle guard ends the bill"], {"state": "no-command"}
    try:
        watch = JobEndWatch(**state.job)
    except (TypeError, ValueError) as e:
        return [f"job: unknown ({clean(e, 200)})"], {"state": "unknown"}
    where = f"s3://{watch.bucket}/{watch.prefix}/"
    end, acted = None, state.ended is not None
    if acted:
        end = JobEnd.from_dict(str(state.ended.get("kind")), state.ended)
    else:
        try:
            end, _problems = read(s3, watch)
        except Exception:  # noqa: BLE001 - status shows what it can; the controller logs the cause
            end = None
    if end is not None:
        return _ended(end, watch, acted, len(nodes), where)
    return _running(watch, s3, cw, state.cluster, now)


def _ended(end: JobEnd, watch: JobEndWatch, acted: bool, running: int, where: str) -> tuple[list[str], dict]:
    lines = [f"job: {end.line()}"]
    record = watch.key(dict(RECORDS)[end.kind])
    if not acted:
        nodes = "the controller acts on it at its next run (within a minute)"
    elif watch.on_end == "keep":
        nodes = (f"{running} node(s) kept for debugging (on_end=keep): nothing is replaced; `dl-launcher destroy` "
                 "ends the bill")
    elif running:
        nodes = f"on_end=stop: terminating the {running} node(s) still running (the controller retries every minute)"
    else:
        nodes = "on_end=stop: the nodes are terminated"
    lines.append(f"  {nodes}; checkpoints stay in {where}")
    if end.kind == "failed" and end.last_lines:
        lines.append("  last lines of the job's output:")
        lines += [f"  | {line}" for line in end.last_lines]
    lines.append(f"  to run it again: delete s3://{watch.bucket}/{record} (the nodes read it too), then run the "
                 "stack's ResumeCommand")
    body = {"state": end.kind, **end.to_dict(), "on_end": watch.on_end, "acted": acted, "running": running}
    return lines, body


def _running(watch: JobEndWatch, s3: Any, cw: Any, cluster: str, now: float) -> tuple[list[str], dict]:
    from ..runtime.cluster import ClusterState
    from ..runtime.store import CheckpointStore

    try:
        store = CheckpointStore(watch.bucket, watch.prefix, client=s3, log=lambda line: None)
        nodes_state = ClusterState(store)
        g = nodes_state.newest_generation()
        plan = nodes_state.plan(g)
        if nodes_state.bad_plan(g):  # set aside by the records' check: shown with its reason below
            raise ValueError(f"generation {g}'s plan set aside: {nodes_state.bad_plan(g)}")
        latest = store.latest()
    except Exception as e:  # noqa: BLE001 - a malformed plan or an S3 error is shown, never a traceback
        return [f"job: running; its records in s3://{watch.bucket}/{watch.prefix}/ could not be read "
                f"({clean(' '.join(str(e).split()), 200)})"], {"state": "unknown"}
    step = latest.step if latest else None
    newest = f"newest complete step {step}" if step is not None else "no complete checkpoint yet"
    try:
        busy = restoring(cw, cluster, now) if cw is not None else None
    except Exception:  # noqa: BLE001 - the metric is a hint; without it the S3 records speak
        busy = None
    if g == 0:
        return [f"job: starting (no generation formed yet); {newest}"], {"state": "starting", "step": step}
    hangs = _hangs(nodes_state, g - 1)
    if plan is None:
        return [f"job: forming generation {g} (nodes joining); {newest}", *hangs], {
            "state": "forming", "generation": g, "step": step}
    if busy and plan.resume_step is not None:
        return [f"job: restoring step {plan.resume_step} (generation {g}, {len(plan.members)} node(s))", *hangs], {
            "state": "restoring", "generation": g, "step": plan.resume_step}
    return [f"job: running (generation {g}, {len(plan.members)} node(s)); {newest}", *hangs], {
        "state": "running", "generation": g, "step": step}


def _hangs(nodes_state: Any, g: int) -> list[str]:
    """A line per node whose command hung in generation g (its failure record: runtime/stall.py), so
    that status says why the generation before this one ended; none when it did not hang."""
    if g < 1:
        return []
    try:
        records = nodes_state.failure_records(g)
    except Exception:  # noqa: BLE001 - a hint beside the job's state, never a reason for status to fail
        return []
    return [f"  generation {g} ended on {n}: {clean(str(r.get('detail')), 200)}" for n, r in sorted(records.items())
            if str(r.get("detail", "")).startswith(contract.HUNG_PREFIX)]
