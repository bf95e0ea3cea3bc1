"""python -m constructs_lib.fleet: status | reconcile | logs. Mistakes exit 2 with one line.

  status --bucket B --key K [--json] [--last N]   the current type, the running instances and
                                                   the last transitions with their reasons
  reconcile --spec FILE [--job-end JSON]           one reconcile of the cluster in a spec (JSON)
  logs (--job NAME | --cluster ID) [--since 1h] [--follow]
                                                   the job's output, setup's and the supervisor's
                                                   lines from every node, oldest first
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from typing import Any, Optional

from dl_core.argv import OneLineParser
from dl_core.aws import error_code


EXIT_USAGE = 2


class UsageError(Exception):
    pass


class _Parser(OneLineParser):
    error_class = UsageError


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m constructs_lib.fleet", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    st = sub.add_parser("status", help="the cluster as the controller last left it, and what runs now")
    st.add_argument("--bucket", required=True, help="the spec's state_bucket")
    st.add_argument("--key", required=True, help="the spec's state_key")
    st.add_argument("--json", action="store_true")
    st.add_argument("--stack", help="the stack's id (tag dl-launcher:stack): only that stack's nodes are listed")
    st.add_argument("--last", type=int, default=10, help="how many transitions to show [10]")
    st.add_argument("--region")
    rc = sub.add_parser("reconcile", help="run one reconcile (operators, the local moto demo)")
    rc.add_argument("--spec", required=True, help="a ClusterSpec as JSON (what DL_CLUSTER_SPEC holds)")
    rc.add_argument("--resume", action="store_true",
                    help="start a cluster that teardown or the idle guard stopped (it resumes from its newest checkpoint)")
    rc.add_argument("--job-end", help="where the job records its end and what to do then (what DL_JOB_END holds)")
    rc.add_argument("--region")
    lg = sub.add_parser("logs", help="the job's log: every node's output, setup and the supervisor's decisions")
    who = lg.add_mutually_exclusive_group(required=True)
    who.add_argument("--job", help="the -c job name the stack was deployed with (the cluster is dl-JOB)")
    who.add_argument("--cluster", help="the cluster id (a Service Catalog product's JobName, or dl-JOB)")
    lg.add_argument("--since", type=duration, default=3600.0, help="how far back, e.g. 30m, 6h, 2d [1h]")
    lg.add_argument("--follow", action="store_true", help="keep printing new lines (Ctrl-C ends)")
    lg.add_argument("--region")
    return p


def duration(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    t = text.strip().lower()
    if len(t) >= 2 and t[-1] in units and t[:-1].isdigit() and int(t[:-1]) > 0:
        return float(int(t[:-1]) * units[t[-1]])
    raise argparse.ArgumentTypeError(f"{text!r} is not a duration: a whole number and s, m, h or d, e.g. 30m")


def main(argv: Optional[list[str]] = None) -> int:
    try:
        a = parser().parse_args(argv)
        if a.command == "status" and a.last < 0:
            raise UsageError(f"--last must be 0 or more, got {a.last}")
        for flag in ("bucket", "key", "spec", "job", "cluster", "stack"):
            value = getattr(a, flag, None)
            if value is not None and not value.strip():
                raise UsageError(f"--{flag} is empty: give the value the stack's outputs name "
                                 "(CapacityStatusCommand has the bucket and key)")
        if a.command == "reconcile" and os.path.isdir(a.spec):
            raise UsageError(f"--spec {a.spec!r} is a directory: expected a ClusterSpec JSON file (what "
                             "DL_CLUSTER_SPEC holds)")
        import boto3

        if a.command == "logs":
            return _logs(a, boto3.client("logs", region_name=a.region))
        ec2, s3 = boto3.client("ec2", region_name=a.region), boto3.client("s3", region_name=a.region)
        if a.command == "status":
            return _status(a, ec2, s3, boto3.client("cloudwatch", region_name=a.region))
        return _reconcile(a, ec2, s3)
    except (UsageError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # AWS's answers and botocore's setup errors are the user's to fix
        name = type(e).__name__
        if name == "NoCredentialsError":
            print("error: no AWS credentials: set AWS_PROFILE (or the AWS_ACCESS_KEY_ID pair), or run where a role "
                  "provides them", file=sys.stderr)
            return EXIT_USAGE
        if name == "NoRegionError":
            print("error: no AWS region: pass --region (the stack's, e.g. us-east-1) or set AWS_REGION",
                  file=sys.stderr)
            return EXIT_USAGE
        if error_code(e) or name in ("EndpointConnectionError", "ParamValidationError"):
            print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
            return EXIT_USAGE
        raise


def _logs(a: argparse.Namespace, client: Any, *, poll: float = 2.0, rounds: Optional[int] = None) -> int:
    """Print the job's log group, one line per event: time, node (its stream), the line.
    FilterLogEvents is held to a few calls a second per account: one every `poll` seconds."""
    import time

    from ..runtime.contract import job_log_group

    cluster = a.cluster or f"dl-{a.job}"
    group = job_log_group(cluster)
    start = int((time.time() - a.since) * 1000)
    seen: set[str] = set()
    n = 0
    while True:
        kw: dict[str, Any] = {"logGroupName": group, "startTime": start}
        events = []
        try:
            while True:
                page = client.filter_log_events(**kw)
                events += page.get("events", [])
                if not page.get("nextToken"):
                    break
                kw["nextToken"] = page["nextToken"]
        except Exception as e:
            if error_code(e) == "ResourceNotFoundException":
                raise UsageError(f"no log group {group} in {client.meta.region_name}: is the stack of cluster "
                                 f"{cluster} deployed there with a command or code (its output JobLogGroup)?") from None
            raise
        for ev in sorted(events, key=lambda e: (e["timestamp"], e.get("eventId", ""))):
            if ev.get("eventId") in seen:
                continue
            seen.add(ev.get("eventId"))
            print(f"{_when(ev['timestamp'] / 1000)} {ev.get('logStreamName', '-')} {ev['message'].rstrip()}", flush=True)
            start = max(start, ev["timestamp"])
        n += 1
        if not a.follow or (rounds is not None and n >= rounds):
            return 0
        time.sleep(poll)


def _reconcile(a: argparse.Namespace, ec2: Any, s3: Any) -> int:
    from .controller import Controller
    from .spec import ClusterSpec
    from .state import StateStore

    with open(a.spec) as f:
        spec = ClusterSpec.from_json(f.read())
    from .job_end import JobEndWatch

    watch = JobEndWatch.from_json(a.job_end) if a.job_end else None
    Controller(ec2, spec, StateStore(s3, spec.state_bucket, spec.state_key), job_end=watch).reconcile(resume=a.resume)
    return 0


def _when(t: Optional[float]) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ") if t is not None else "-"


def _status(a: argparse.Namespace, ec2: Any, s3: Any, cw: Any = None) -> int:
    import dataclasses
    import time

    from ..runtime import contract
    from . import idle_notice, job_status, shortfall
    from .instances import list_cluster
    from .state import StateStore

    state = StateStore(s3, a.bucket, a.key).load()
    if state is None:
        raise UsageError(f"no controller state at s3://{a.bucket}/{a.key}: has the controller run yet?")
    nodes = sorted(list_cluster(ec2, state.cluster, a.stack), key=lambda n: (n.launched, n.id))
    last = state.history[-a.last:] if a.last else []
    guard = idle_notice.load(s3, a.bucket, contract.guard_state_key(state.cluster))
    job_lines, job = job_status.describe(state, s3, cw, nodes, time.time())
    if a.json:
        print(json.dumps({"job": job, "cluster": state.cluster, "instance_type": state.instance_type, "stopped": state.stopped,
                          "short_since": state.loss_since, "short": state.short, "updated_at": state.updated_at,
                          "instances": [n.__dict__ for n in nodes], "transitions": last,
                          "idle_guard": dataclasses.asdict(guard) if guard.checked_at else None}, indent=1))
        return 0
    for line in job_lines:
        print(line)
    what = ("torn down" if state.stopped else "stopped with the job" if state.ended and job.get("on_end") == "stop"
            else f"current type {state.instance_type or 'none (nothing launched)'}")
    print(f"cluster {state.cluster}: {what}; {len(nodes)} running; state of {_when(state.updated_at)}")
    if state.short is not None and not state.stopped:
        print(f"{shortfall.describe(state.short)} (since {_when(state.short['since'])})")
    if state.loss_since is not None:
        print(f"short of nodes since {_when(state.loss_since)}")
    for n in nodes:
        # The node's last health verdict (its boot gate's or the monitor's: contract.TAG_HEALTH) and why.
        print(f"  {n.id}  {n.instance_type}  {n.subnet}  launched {_when(n.launched)}"
              + (f"  health {n.health}" if n.health else ""))
    if guard.checked_at:
        print(guard.line())
    if last:
        print(f"last {len(last)} transitions:")
    for t in last:
        ids = f" [{', '.join(t['instances'])}]" if t["instances"] else ""
        print(f"  {_when(t['at'])}  {t['kind']:<16} {t['instance_type'] or '-'}: {t['reason']}{ids}")
    return 0
