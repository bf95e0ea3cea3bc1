"""python -m constructs_lib.runtime: checkpoint push|pull|list, agent, job, monitor, cwagent-config, status.

Bucket and prefix come from --bucket/--prefix, DL_CHECKPOINT_BUCKET/DL_CHECKPOINT_PREFIX, or the
instance's tags on a dl-launcher node; the local directory from --dir, DL_CHECKPOINT_DIR or
<scratch>/checkpoints. Mistakes exit 2 with one line.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from typing import Optional

from dl_core.argv import OneLineParser

from . import contract
from .errors import ImdsUnavailable, RuntimeUserError


MAX_STEP = 10**12
MAX_POLL_SECONDS = 60.0  # a spot notice gives two minutes; a slower poll would miss most of them
_DIGITS = re.compile(r"^[0-9]{1,12}\Z")


def step_arg(text: str) -> int:
    """--step: a whole number 0 <= N < 10**12, in ASCII digits (no sign, exponent, nan or inf)."""
    t = text.strip()
    if not _DIGITS.match(t):
        raise argparse.ArgumentTypeError(f"{text!r} is not a step: a whole number 0 <= N < {MAX_STEP:,}")
    return int(t)


def poll_arg(text: str, what: str = "--poll") -> float:
    """Seconds between IMDS polls: finite, more than 0, at most MAX_POLL_SECONDS."""
    try:
        v = float(text)
    except (TypeError, ValueError):
        v = math.nan
    if not math.isfinite(v) or not 0 < v <= MAX_POLL_SECONDS:
        raise argparse.ArgumentTypeError(f"{what} {text!r}: seconds between IMDS polls, more than 0 and at most "
                                         f"{MAX_POLL_SECONDS:g}")
    return v


class _Parser(OneLineParser):
    error_class = RuntimeUserError


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bucket")
    p.add_argument("--prefix")
    p.add_argument("--dir", dest="local_dir", help="local checkpoint directory")
    p.add_argument("--region")


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m constructs_lib.runtime", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    ck = sub.add_parser("checkpoint", help="push, pull or list checkpoints")
    cks = ck.add_subparsers(dest="action", required=True, parser_class=_Parser)
    push = cks.add_parser("push", help="upload a checkpoint directory (manifest last)")
    _common(push)
    push.add_argument("path", nargs="?", help="a step-N directory (default: the newest complete one in --dir)")
    push.add_argument("--step", type=step_arg, help="step number (default: from the directory name step-N)")
    pull = cks.add_parser("pull", help="restore the newest complete checkpoint into --dir")
    _common(pull)
    pull.add_argument("--step", type=step_arg)
    ls = cks.add_parser("list", help="every step in S3 and whether it is complete")
    _common(ls)
    ls.add_argument("--json", action="store_true")
    ag = sub.add_parser("agent", help="the node agent: spot notices from IMDS, checkpoint uploads (run by systemd)")
    _common(ag)
    ag.add_argument("--poll", type=poll_arg, default=None,
                    help="seconds between IMDS polls [$DL_AGENT_POLL_SECONDS or 2]")
    jb = sub.add_parser("job", help="the job supervisor: rendezvous, restore, run the command (run by systemd)")
    _common(jb)
    cw = sub.add_parser("cwagent-config", help="write this node's CloudWatch agent configuration (from node.env)")
    cw.add_argument("--out", default=None, help="[the contract's cwagent_config path]")
    sub.add_parser("monitor", help="the node monitor: throughput, progress and GPU health to CloudWatch (run by systemd)")
    st = sub.add_parser("status", help="the cluster's generations, members, resume step and this node's health")
    _common(st)
    st.add_argument("--json", action="store_true")
    return p


# Settings the node's units pass through the environment (node.env), checked like the flags.
_ENV_SETTINGS = ("DL_CHECKPOINT_BUCKET", "DL_CHECKPOINT_PREFIX", "DL_CHECKPOINT_DIR", "DL_CLUSTER",
                 "DL_AGENT_POLL_SECONDS")


def _refuse_control_characters(a: argparse.Namespace) -> None:
    """A line break or escape in a bucket, prefix, directory or region is a paste gone wrong: a
    directory named with one would be created, and a newline would pass a `$`-anchored check."""
    given = [(f"--{k.replace('_', '-')}" if k != "local_dir" else "--dir", v) for k, v in vars(a).items()]
    given += [(k, os.environ[k]) for k in _ENV_SETTINGS if k in os.environ]
    for what, v in given:
        if isinstance(v, str) and not v.isprintable():
            shown = "".join(c for c in v if c.isprintable()).strip()
            raise RuntimeUserError(f"{what} {v!r} has a control character: not allowed; closest: {shown!r}")


_NODE_TRANSIENT = ("NoCredentialsError", "EndpointConnectionError", "ConnectTimeoutError")


def main(argv: Optional[list[str]] = None) -> int:
    a: Optional[argparse.Namespace] = None
    try:
        a = parser().parse_args(argv)
        _refuse_control_characters(a)
        if a.command == "agent" and a.poll is None:
            try:
                a.poll = poll_arg(os.environ.get("DL_AGENT_POLL_SECONDS", "2"), "DL_AGENT_POLL_SECONDS")
            except argparse.ArgumentTypeError as e:
                raise RuntimeUserError(str(e)) from None
        if a.command == "cwagent-config":
            from .cwagent_config import write_for_node
            try:
                write_for_node(a.out or contract.path("cwagent_config"))
            except ValueError as e:
                raise RuntimeUserError(str(e)) from None
            return 0
        if a.command == "monitor":
            from .monitor import run
            period = float(os.environ.get("DL_MONITOR_PERIOD", contract.METRIC_PERIOD))  # tests shorten it
            return run(period=period, log=_logger("dl-monitor"))
        from .config import resolve_config
        from .store import CheckpointStore

        # The node's units (job, agent) wait out a slow IMDS; a person's command does not.
        cfg = resolve_config(a.bucket, a.prefix, a.local_dir, a.region, on_node=a.command in ("job", "agent"))
        store = CheckpointStore(cfg.bucket, cfg.prefix, region=cfg.region)
        if a.command == "checkpoint":
            return _checkpoint(a, store, cfg.local_dir)
        if a.command == "agent":
            from .agent import NodeAgent
            store.log = _logger("dl-agent")
            NodeAgent(store, cfg.local_dir, poll_seconds=a.poll, log=store.log).run()
            return 0
        if a.command == "job":
            return _job(store, cfg.local_dir)
        return _status(store, a.json)
    except RuntimeUserError as e:
        print(f"error: {_one_line(e)}", file=sys.stderr)
        return contract.EXIT_USAGE
    except ImdsUnavailable as e:  # busy or throttled, not misconfigured: exit 1 lets systemd try again
        print(f"error: {_one_line(e)}; the unit starts again shortly", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # boto's own, for problems of setup rather than code
        name = type(e).__name__
        if a is not None and a.command == "job" and name in _NODE_TRANSIENT:
            # the job unit runs only on a node, whose role and endpoints come from its template:
            # missing credentials or an unreachable endpoint there is a slow boot or a network blip
            print(f"error: {name}: {_one_line(e)}; the unit starts again shortly", file=sys.stderr)
            return 1
        if name == "NoCredentialsError":
            print("error: no AWS credentials: on a node the instance role provides them; elsewhere set AWS_PROFILE",
                  file=sys.stderr)
            return contract.EXIT_USAGE
        if name in ("EndpointConnectionError", "ConnectTimeoutError"):
            print(f"error: cannot reach AWS ({_one_line(e)})", file=sys.stderr)
            return contract.EXIT_USAGE
        raise


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


def _logger(name: str):
    return lambda m: print(f"{name}: {m}", flush=True)


def _checkpoint(a: argparse.Namespace, store, local_dir: str) -> int:
    if a.action == "push":
        return _push(a, store, local_dir)
    if a.action == "pull":
        got = store.pull(local_dir, a.step)
        print(f"restored step {got[0]} to {got[1]}" if got else "no complete checkpoint in S3 yet")
        return 0
    rows = store.list()
    if a.json:
        print(json.dumps([{"name": n, "step": c.step if c else None, "complete": c is not None,
                           "bytes": c.total_bytes if c else None} for n, c in rows], indent=1))
    else:
        for n, c in rows:
            print(f"{n}  {'complete' if c else 'INCOMPLETE (no manifest)'}"
                  + (f"  {len(c.manifest['files'])} files, {c.total_bytes:,} bytes" if c else ""))
    return 0


def _push(a: argparse.Namespace, store, local_dir: str) -> int:
    from .layout import newest_local, step_of

    path = a.path
    if path is None:
        newest = newest_local(local_dir)
        if not newest:
            raise RuntimeUserError(f"no complete checkpoint (step-N directory) in {local_dir}")
        step, path = newest
    else:
        step = a.step if a.step is not None else step_of(os.path.basename(os.path.normpath(path)))
        if step is None:
            raise RuntimeUserError(f"cannot tell the step of {path!r}: name it step-000000000042 or pass --step")
    cp = store.push(path, step)
    print(f"pushed step {step}: {len(cp.manifest['files'])} files, {cp.total_bytes:,} bytes, manifest last")
    return 0


def _job(store, local_dir: str) -> int:
    import boto3

    from .agent import write_health
    from .cluster import ClusterState, Liveness
    from .config import node_identity
    from .rundir import set_phase
    from .supervisor import Supervisor, SupervisorConfig

    me = node_identity()
    os.environ.setdefault("DL_FAILURE_DOMAIN", me.failure_domain)  # the runs inherit it: memory_ring.ring
    cfg = SupervisorConfig.from_env(cluster=me.cluster, nodes=me.nodes, nproc_per_node=me.nproc_per_node,
                                    node=me.node, addr=me.addr)
    from .jobdef import NodeJob
    from .joblog import JobLog

    # Few retries: a liveness check that EC2 refuses is simply asked again next period, and a
    # call retried for a minute would hold the supervisor's watch loop that long.
    from botocore.config import Config

    from dl_core.aws import retries
    ec2 = boto3.client("ec2", region_name=me.region, config=Config(retries=retries("standard", 3)))
    joblog = JobLog()
    log = joblog.supervisor()
    store.log = log  # a record set aside is said in the job's log
    job = NodeJob(log=log, region=me.region, cluster=me.cluster, retry_base=cfg.retry_base, on_phase=set_phase,
                  health=write_health)
    cluster = ClusterState(store)
    liveness = Liveness(ec2, cluster, me=cfg.node, stale=3 * cfg.liveness_poll, log=log)
    return Supervisor(cfg, store, cluster, liveness, local_dir=local_dir, log=log, job=job, joblog=joblog).run()


def _status(store, as_json: bool) -> int:
    from .cluster import ClusterState
    from .records import printable
    from .rundir import health as _health
    from .supervisor_state import State as _State

    store.log = lambda line: None  # the report lists what was set aside
    cluster = ClusterState(store)
    g = cluster.newest_generation()
    plan = cluster.plan(g)
    latest = store.latest()
    report = {
        "generation": g, "plan": plan.to_json() if plan else None,
        "joined": sorted(cluster.joins(g)) if g else [], "left": sorted(cluster.leaves(g)) if g else [],
        "newest_complete_step": latest.step if latest else None,
        "finished": cluster.finished(), "failed": cluster.failed(),
        "this_node": {"health": _health(), "history": _State.load().history},
        "set_aside": dict(store.set_aside),
    }
    if as_json:
        print(json.dumps(report, indent=1))
        return 0
    print(f"s3://{store.bucket}/{store.prefix}/: newest complete step {report['newest_complete_step']}")
    if report["finished"]:
        print(f"job finished (generation {report['finished'].get('generation')})")
    if report["failed"]:
        print(f"job FAILED: {printable(report['failed'].get('reason'))}")
    if plan:
        ranks = ", ".join(f"{i}={m.node}@{m.addr}" for i, m in enumerate(plan.members))
        print(f"generation {g}: ranks {ranks}; master {plan.master_addr}:{plan.port}; resumed from {plan.resume_step}")
    elif cluster.bad_plan(g):
        print(f"generation {g}: its plan was set aside; the cluster forms the next generation")
    elif g:
        print(f"generation {g} forming: joined {', '.join(report['joined']) or 'none'}")
    for key, why in report["set_aside"].items():
        print(f"set aside s3://{store.bucket}/{printable(key, 300)}: {printable(why, 300)}")
    for component, line in sorted(report["this_node"]["health"].items()):
        print(f"health {component}: {printable(line)}")
    for h in report["this_node"]["history"][-5:]:
        print(f"generation {h['generation']}: {h['outcome']} {h.get('detail') or ''}".rstrip())
    return 0
