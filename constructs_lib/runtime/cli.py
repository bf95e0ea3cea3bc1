"""python -m constructs_lib.runtime: checkpoint push|pull|list, watch, resume.

Bucket and prefix come from --bucket/--prefix, DL_CHECKPOINT_BUCKET/DL_CHECKPOINT_PREFIX, or the
instance's tags on a dl-launcher node; the local directory from --dir, DL_CHECKPOINT_DIR or
/scratch/checkpoints. Mistakes exit 2 with one line.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Optional

from .errors import RuntimeUserError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        raise RuntimeUserError(f"{self.prog}: {message} (see --help)")


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
    push.add_argument("--step", type=int, help="step number (default: from the directory name step-N)")
    pull = cks.add_parser("pull", help="restore the newest complete checkpoint into --dir")
    _common(pull)
    pull.add_argument("--step", type=int)
    ls = cks.add_parser("list", help="every step in S3 and whether it is complete")
    _common(ls)
    ls.add_argument("--json", action="store_true")
    w = sub.add_parser("watch", help="watch IMDS for spot/rebalance notices (run by systemd)")
    _common(w)
    w.add_argument("--poll", type=float, default=5.0, help="seconds between IMDS polls [5]")
    w.add_argument("--grace", type=float, default=30.0, help="seconds to wait for the job's own save [30]")
    w.add_argument("--pidfile", default=os.environ.get("DL_JOB_PIDFILE"),
                   help="also signal this pid (processes using Checkpointer register themselves)")
    w.add_argument("--ignore-rebalance", action="store_true")
    r = sub.add_parser("resume", help="at boot: restore the newest complete checkpoint, write resume.env")
    _common(r)
    rz = sub.add_parser("rendezvous", help="find the cluster's nodes; write rank 0, hostfile and torchrun settings")
    rz.add_argument("--cluster", help="cluster id (default: the instance's dl-launcher:cluster tag)")
    rz.add_argument("--nodes", type=int, help="how many nodes (default: the dl-launcher:nodes tag)")
    rz.add_argument("--nproc-per-node", type=int, default=int(os.environ.get("DL_PROCS_PER_NODE", "1")))
    rz.add_argument("--port", type=int, default=29500)
    rz.add_argument("--timeout", type=float, default=900.0)
    rz.add_argument("--env-file", default="/etc/dl-launcher/rendezvous.env")
    rz.add_argument("--hostfile", default="/etc/dl-launcher/hostfile")
    rz.add_argument("--region")
    return p


def main(argv: Optional[list[str]] = None) -> int:
    try:
        a = parser().parse_args(argv)
        if a.command == "rendezvous":
            return _rendezvous(a)
        from .config import resolve_config
        from .store import CheckpointStore

        cfg = resolve_config(a.bucket, a.prefix, a.local_dir, a.region)
        store = CheckpointStore(cfg.bucket, cfg.prefix, region=cfg.region)
        if a.command == "checkpoint" and a.action == "push":
            return _push(a, store, cfg.local_dir)
        if a.command == "checkpoint" and a.action == "pull":
            got = store.pull(cfg.local_dir, a.step)
            print(f"restored step {got[0]} to {got[1]}" if got else "no complete checkpoint in S3 yet")
            return 0
        if a.command == "checkpoint":
            rows = store.list()
            if a.json:
                print(json.dumps([{"name": n, "step": c.step if c else None, "complete": c is not None,
                                   "bytes": c.total_bytes if c else None} for n, c in rows], indent=1))
            else:
                for n, c in rows:
                    print(f"{n}  {'complete' if c else 'INCOMPLETE (no manifest)'}"
                          + (f"  {len(c.manifest['files'])} files, {c.total_bytes:,} bytes" if c else ""))
            return 0
        if a.command == "watch":
            from .watcher import Watcher
            w = Watcher(store, cfg.local_dir, poll_seconds=a.poll, save_grace=a.grace, pidfile=a.pidfile,
                        on_rebalance="ignore" if a.ignore_rebalance else "notify",
                        log=lambda m: print(f"dl-watch: {m}", flush=True))
            result = w.run()
            print(f"dl-watch: done ({result.kind} notice; pushed step {result.pushed_step})" if result else "dl-watch: stopped")
            return 0
        from .resume import restore
        got = restore(store, cfg.local_dir)
        print(f"resume from step {got[0]}: {got[1]}" if got else "no checkpoint yet: the job starts from scratch")
        return 0
    except RuntimeUserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # boto's own, for problems of setup rather than code
        name = type(e).__name__
        if name == "NoCredentialsError":
            print("error: no AWS credentials: on a node the instance role provides them; elsewhere set AWS_PROFILE",
                  file=sys.stderr)
            return 2
        if name in ("EndpointConnectionError", "ConnectTimeoutError"):
            print(f"error: cannot reach S3 ({e})", file=sys.stderr)
            return 2
        raise


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


def _rendezvous(a: argparse.Namespace) -> int:
    import boto3

    from .imds import Imds
    from .rendezvous import TAG_CLUSTER, TAG_NODES, discover, write

    imds = Imds()
    cluster = a.cluster or imds.tag(TAG_CLUSTER)
    nodes = a.nodes or int(imds.tag(TAG_NODES) or 0)
    if not cluster or nodes < 1:
        raise RuntimeUserError(f"rendezvous needs --cluster and --nodes (or the instance tags {TAG_CLUSTER}, {TAG_NODES})")
    my_ip = imds.get("meta-data/local-ipv4")
    region = a.region or os.environ.get("AWS_REGION") or imds.get("meta-data/placement/region")
    r = discover(boto3.client("ec2", region_name=region), cluster, my_ip, nodes, a.nproc_per_node, port=a.port,
                 timeout=a.timeout, log=lambda m: print(f"dl-rendezvous: {m}", flush=True))
    write(r, a.env_file, a.hostfile)
    print(f"dl-rendezvous: node {r.node_rank} of {r.nnodes}; master {r.master_addr}:{r.port}")
    return 0
