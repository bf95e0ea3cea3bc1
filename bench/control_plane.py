"""The control plane at scale: N node supervisors (the real `Supervisor.rendezvous`, `ClusterState`
and `Liveness`; threads, no torch) against one moto_server on 127.0.0.1, every request recorded
with its time, node, operation and key, in four phases:

1. form: generation 1, every node starting at once;
2. steady: every node watches the cluster as a running generation does (the next generation's
   activity, liveness) and beats, for STEADY_POLLS polls;
3. reform: one node's instance is terminated and its supervisor (and heartbeat) stops without a
   word; the survivors' runs hang, as NCCL's do by default, so only the control plane can find the
   loss (a stale heartbeat, confirmed by one node's DescribeInstances); a replacement waits as a
   spare; everyone forms generation 2. The time from the loss to each survivor's stop is the
   hung-peer detection time;
4. boot: a second cluster forms generation 1 while its fleet boots, the nodes arriving evenly
   over 60 s (scaled), as an Auto Scaling launch of many nodes does.

Every period runs SCALE times faster than on a node (poll 2 s -> 0.4 s, liveness 10 s -> 2 s, the
stale limit 30 s -> 6 s, the boot spread 60 s -> 12 s); control_plane_report.py says how the
busiest second at production periods is taken from the recorded times, and extrapolates it to
512 and 1,000 nodes against S3's 5,500 reads/s and 3,500 writes/s per prefix.

    python bench/control_plane.py                       # N = 8, 16, 32, 64
    python bench/control_plane.py --nodes 8 16          # quicker
    python bench/control_plane.py --nodes 32 64 --scale 2   # slower periods where 2 cores cannot keep up
    python bench/control_plane.py --code /path/to/checkout   # the same bench on another revision's code
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROD_POLL, PROD_LIVENESS, PROD_GRACE, PROD_BOOT = 2.0, 10.0, 600.0, 60.0  # SupervisorConfig's defaults


def set_scale(scale: float) -> None:
    """Every period divided by `scale` (--scale): one ratio for all, so times scale back exactly."""
    global SCALE, POLL, LIVENESS, GRACE, BOOT, STALE
    SCALE = scale
    POLL, LIVENESS, GRACE, BOOT = PROD_POLL / scale, PROD_LIVENESS / scale, PROD_GRACE / scale, PROD_BOOT / scale
    STALE = 3 * LIVENESS  # what runtime/cli.py gives Liveness: three liveness periods


set_scale(5.0)
STEADY_POLLS = 15
JOB = "jobs/bench"


class Node:
    """One simulated node: its own clients (every call recorded), store, cluster state, liveness and
    supervisor."""

    def __init__(self, endpoint: str, bucket: str, instance: str, addr: str, nodes: int, log: list) -> None:
        import boto3
        from botocore.config import Config

        from constructs_lib.runtime.cluster import ClusterState, Liveness
        from constructs_lib.runtime.store import CheckpointStore
        from constructs_lib.runtime.supervisor import Supervisor, SupervisorConfig

        self.instance, self.log = instance, log
        cfg = Config(retries={"mode": "standard", "max_attempts": 10}, max_pool_connections=4)
        s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=endpoint, config=cfg)
        ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=endpoint, config=cfg)
        for client in (s3, ec2):
            client.meta.events.register("before-parameter-build", self._record)
        store = CheckpointStore(bucket, JOB, client=s3, concurrency=4)
        self.cluster = ClusterState(store)
        self.liveness = Liveness(ec2, self.cluster, me=instance, stale=STALE)
        self.sup = Supervisor(SupervisorConfig(cluster="bench", nodes=nodes, nproc_per_node=1, node=instance, addr=addr,
                                               poll=POLL, liveness_poll=LIVENESS, member_grace=GRACE),
                              store, self.cluster, self.liveness, log=lambda line: None)
        # The supervisor's liveness with its cache: Membership.gone since the supervisor's split (issue 36).
        self.gone = self.sup.membership.gone if hasattr(self.sup, "membership") else self.sup._gone
        self.plan = None
        self.started = self.formed = self.found = 0.0
        self.found_by = ""

    def _record(self, params, model, **_kw) -> None:
        from control_plane_report import Request
        key = params.get("Key", params.get("Prefix", "")) if isinstance(params, dict) else ""
        self.log.append(Request(time.monotonic(), self.instance, model.service_model.service_name, model.name, key,
                                threading.get_ident()))

    def form(self) -> None:
        self.started = time.monotonic()
        self.plan = self.sup.rendezvous()
        self.formed = time.monotonic()

    def watch(self, polls: int) -> None:
        """What a running generation's supervisor does each poll (Supervisor._execute's loop)."""
        others = [n for n in self.plan.nodes() if n != self.instance]
        for _ in range(polls):
            self.cluster.activity(self.plan.generation + 1)
            self.gone(others)
            time.sleep(POLL)

    def survive(self) -> None:
        """A survivor whose run hangs: the watch loop until the loss shows, then what Supervisor.run
        does after a peer-lost run (the agreed outcome, the end records) and the next rendezvous."""
        g = self.plan.generation
        others = [n for n in self.plan.nodes() if n != self.instance]
        while True:
            if self.cluster.activity(g + 1):
                self.found_by = "a join or leave in the next generation"
                break
            if self.gone(others):
                self.found_by = "liveness"
                break
            time.sleep(POLL)
        self.found = time.monotonic()
        self.sup._agreed_outcome(g, "peer-lost", self.found_by)
        self.sup.state.last_ran = g
        ended = getattr(getattr(self.sup, "membership", None), "ended", None) or self.sup._end
        ended()  # what Supervisor.run reads before the next rendezvous
        self.form()


def _run_all(targets, delays=None) -> None:
    def later(fn, delay):
        time.sleep(delay)
        fn()

    threads = [threading.Thread(target=later, args=(t, (delays or {}).get(i, 0.0)), daemon=True)
               for i, t in enumerate(targets)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=900)
        if t.is_alive():
            raise RuntimeError("a simulated supervisor did not finish in 15 minutes")


def _phase(log: list, t0: float, t1: float) -> list:
    return [r for r in log if t0 <= r.t < t1]


def _cluster(endpoint: str, n: int, log: list, tag: str):
    import boto3
    s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=endpoint)
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=endpoint)
    bucket = f"bench-{tag}-{n}-{int(time.time() * 1000)}"
    s3.create_bucket(Bucket=bucket)
    ids = [i["InstanceId"] for i in ec2.run_instances(ImageId="ami-12c6146b", MinCount=n + 1, MaxCount=n + 1)["Instances"]]
    nodes = [Node(endpoint, bucket, ids[i], f"10.0.{i // 250}.{i % 250 + 1}", n, log) for i in range(n + 1)]
    return ec2, nodes[:n], nodes[n]


def _to_form(log: list, nodes) -> float:
    """Requests per node from its start to its plan (its heartbeats included)."""
    return statistics.mean(sum(1 for r in log if r.node == x.instance and x.started <= r.t <= x.formed)
                           for x in nodes)


def measure(n: int, endpoint: str) -> dict:
    log: list = []
    ec2, nodes, spare = _cluster(endpoint, n, log, "a")
    phases = {}

    t0 = time.monotonic()
    _run_all([x.form for x in nodes])
    t1 = time.monotonic()
    assert all(x.plan is not None and not isinstance(x.plan, int) and x.plan.generation == 1 for x in nodes)
    phases["form"] = {"requests": _phase(log, t0, t1), "t0": t0, "seconds": t1 - t0, "per_node": _to_form(log, nodes)}

    t0 = time.monotonic()
    _run_all([lambda x=x: x.watch(STEADY_POLLS) for x in nodes])
    t1 = time.monotonic()
    phases["steady"] = {"requests": _phase(log, t0, t1), "t0": t0, "seconds": t1 - t0}

    lost = nodes[-1]
    lost.sup.stop_beats()
    ec2.terminate_instances(InstanceIds=[lost.instance])
    t0 = time.monotonic()
    last_beat = max((r.t for r in log if r.node == lost.instance and r.op == "PutObject" and "/beat/" in r.key),
                    default=t0)
    survivors = nodes[:-1]
    _run_all([x.survive for x in survivors] + [spare.form])
    t1 = time.monotonic()
    assert all(x.plan.generation == 2 for x in survivors + [spare]), [x.plan for x in survivors + [spare]]
    phases["reform"] = {"requests": _phase(log, t0, t1), "t0": t0, "seconds": t1 - t0,
                        "found": sorted(x.found - t0 for x in survivors), "since_beat": t0 - last_beat,
                        "by_liveness": sum(x.found_by == "liveness" for x in survivors)}
    for x in nodes + [spare]:
        x.sup.stop_beats()

    # A second cluster, forming while its fleet boots.
    boot_log: list = []
    _, booting, extra = _cluster(endpoint, n, boot_log, "b")
    t0 = time.monotonic()
    _run_all([x.form for x in booting], {i: BOOT * i / max(1, n - 1) for i in range(n)})
    t1 = time.monotonic()
    assert all(x.plan.generation == 1 for x in booting), [x.plan for x in booting]
    phases["boot"] = {"requests": _phase(boot_log, t0, t1), "t0": t0, "seconds": t1 - t0, "per_node": _to_form(boot_log, booting)}
    for x in booting + [extra]:
        x.sup.stop_beats()
    return {"n": n, "job": JOB, "phases": phases}


def detection(rows: list, out=print) -> None:
    out(f"\n== a peer lost while the survivors' runs hang (seconds at production periods; x{SCALE:g}) ==")
    out(f"{'N':>4} {'first stop':>11} {'median':>7} {'last':>6} {'last beat before loss':>22} {'found by liveness':>18}")
    for row in rows:
        ph = row["phases"]["reform"]
        f = [s * SCALE for s in ph["found"]]
        out(f"{row['n']:>4} {f[0]:>11.1f} {statistics.median(f):>7.1f} {f[-1]:>6.1f} {ph['since_beat'] * SCALE:>22.1f} "
            f"{ph['by_liveness']:>12} of {len(f)}")
    out("\n== requests per node to form generation 1 ==")
    for row in rows:
        ph = row["phases"]
        out(f"{row['n']:>4}  all at once {ph['form']['per_node']:.1f}   while booting over {PROD_BOOT:g} s "
            f"{ph['boot']['per_node']:.1f}   ({ph['boot']['per_node'] / ph['form']['per_node']:.1f}x)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, nargs="+", default=[8, 16, 32, 64])
    p.add_argument("--scale", type=float, default=5.0,
                   help="how many times faster than on a node every period runs [5]; lower it where the machine "
                        "cannot keep up with N nodes (their formation takes many polls longer than at N=8)")
    p.add_argument("--code", type=Path, default=ROOT,
                   help="the checkout whose constructs_lib is measured [this one]: a 'before' column")
    a = p.parse_args()
    set_scale(a.scale)
    sys.path[:0] = [str(a.code.resolve()), str(Path(__file__).resolve().parent), str(ROOT)]
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    tmp = Path(tempfile.mkdtemp(prefix="dl-bench-cp-"))
    for var in ("DL_ETC_DIR", "DL_RUN_DIR", "DL_SCRATCH", "DL_LOG_DIR"):
        os.environ[var] = str(tmp / var.lower())
    import constructs_lib
    from control_plane_report import report
    from tests.runtime.drill import start_moto_server

    print(f"code: {Path(constructs_lib.__file__).parent}; periods / {SCALE:g}: poll {POLL} s, liveness {LIVENESS} s, "
          f"stale {STALE} s, boot spread {BOOT} s", flush=True)
    server, endpoint = start_moto_server(tmp / "moto.log")
    try:
        rows = []
        for n in sorted(a.nodes):
            rows.append(measure(n, endpoint))
            ph = rows[-1]["phases"]
            print(f"N={n}: formed in {ph['form']['seconds']:.1f} s, re-formed in {ph['reform']['seconds']:.1f} s, "
                  f"formed while booting in {ph['boot']['seconds']:.1f} s (measured)", flush=True)
        report(rows, SCALE, 0.5 * 0.75 * POLL)
        detection(rows)
    finally:
        server.terminate()
        server.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
