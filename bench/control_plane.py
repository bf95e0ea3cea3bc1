"""The control plane at scale: N node supervisors (the real `Supervisor.rendezvous`, `ClusterState`
and `Liveness`; threads, no torch) against one moto_server on 127.0.0.1, every request counted per
node, in three phases:

1. forming generation 1 (every node joins, one proposes, all run the plan);
2. steady state: every node watches the cluster as a running generation does (the next
   generation's activity, liveness) and beats, for a fixed number of polls;
3. re-forming after a loss: one node's instance is terminated and its supervisor stops; a
   replacement joins; the survivors find the loss (a stale heartbeat, confirmed by one node's
   DescribeInstances) and form generation 2.

Periods are scaled down (poll 0.5 s, liveness 2 s) so that minutes of cluster time fit in seconds;
requests are reported per node per poll and converted to per-second rates at the production
periods (poll 2 s, liveness 10 s), then extrapolated to 256 and 512 nodes and to an account of 10
clusters, next to AWS's published limits:
- S3: 5,500 GET/HEAD and 3,500 PUT/COPY/POST/DELETE requests per second per prefix
  (https://docs.aws.amazon.com/AmazonS3/latest/userguide/optimizing-performance.html); LIST is
  counted with the GETs here;
- EC2: non-mutating actions (DescribeInstances) refill at 20 per second per account and region,
  bucket 100 (https://docs.aws.amazon.com/ec2/latest/devguide/ec2-api-throttling.html).

    python bench/control_plane.py                 # N = 8, 16, 32, 64
    python bench/control_plane.py --nodes 8 16    # quicker
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

POLL, LIVENESS = 0.5, 2.0          # scaled-down periods used here
PROD_POLL, PROD_LIVENESS = 2.0, 10.0  # SupervisorConfig's defaults on a node
S3_GET_PER_PREFIX, S3_PUT_PER_PREFIX, EC2_REFILL = 5500.0, 3500.0, 20.0
STEADY_POLLS = 12
WRITES = {"PutObject", "DeleteObject", "CopyObject"}


def _before_classes():
    """The control plane as it was before issue 27, for the side-by-side figures: every join read
    with its own GET, and liveness by a DescribeInstances of every member from every node."""
    from constructs_lib.runtime.cluster import ClusterState, Liveness

    class BeforeCluster(ClusterState):
        def joins(self, g):
            out = {}
            for name, _ in self._listed(f"gen-{g:06d}/join/"):
                d = self._get(f"gen-{g:06d}/join/{name}")
                if d and d.get("node") and d.get("addr"):
                    out[d["node"]] = d
            return out

    class BeforeLiveness(Liveness):
        def gone(self, nodes, stale=None):
            return self.confirm(nodes)

    return BeforeCluster, BeforeLiveness


class Node:
    """One simulated node: its own clients (counted), store, cluster state, liveness, supervisor."""

    def __init__(self, endpoint: str, bucket: str, instance: str, addr: str, nodes: int, before: bool = False) -> None:
        import boto3
        from botocore.config import Config

        from constructs_lib.runtime.cluster import ClusterState, Liveness
        from constructs_lib.runtime.store import CheckpointStore
        from constructs_lib.runtime.supervisor import Supervisor, SupervisorConfig

        self.instance = instance
        self.calls: Counter = Counter()
        self.lock = threading.Lock()
        cfg = Config(retries={"mode": "standard", "max_attempts": 10}, max_pool_connections=4)
        s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=endpoint, config=cfg)
        ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=endpoint, config=cfg)
        for client in (s3, ec2):
            client.meta.events.register("before-call", self._count)
        store = CheckpointStore(bucket, "jobs/bench", client=s3, concurrency=4)
        cluster_class, liveness_class = _before_classes() if before else (ClusterState, Liveness)
        self.cluster = cluster_class(store)
        self.liveness = liveness_class(ec2, self.cluster, me=instance, stale=3 * LIVENESS)
        self.sup = Supervisor(SupervisorConfig(cluster="bench", nodes=nodes, nproc_per_node=1, node=instance, addr=addr,
                                               poll=POLL, liveness_poll=LIVENESS, member_grace=30.0),
                              store, self.cluster, self.liveness, log=lambda line: None)
        if before:  # no heartbeats then
            self.sup.membership._beating = threading.Event()
        self.plan = None

    def _count(self, model, **_kw) -> None:
        with self.lock:
            self.calls[f"{model.service_model.service_name}:{model.name}"] += 1

    def snapshot(self) -> Counter:
        with self.lock:
            return Counter(self.calls)

    def form(self) -> None:
        self.plan = self.sup.rendezvous()

    def watch(self, polls: int) -> None:
        """What a running generation's supervisor does each poll (Supervisor._execute's loop)."""
        others = [n for n in self.plan.nodes() if n != self.instance]
        for _ in range(polls):
            self.cluster.activity(self.plan.generation + 1)
            self.sup.membership.gone(others)
            time.sleep(POLL)


def _run_all(targets) -> None:
    threads = [threading.Thread(target=t, daemon=True) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
        if t.is_alive():
            raise RuntimeError("a simulated supervisor did not finish in 10 minutes")


def _delta(nodes, before) -> Counter:
    total: Counter = Counter()
    for n in nodes:
        total += n.snapshot() - before.get(n.instance, Counter())
    return total


def _split(c: Counter) -> tuple[int, int, int]:
    """(S3 reads incl. LIST, S3 writes, EC2 calls)."""
    reads = sum(v for k, v in c.items() if k.startswith("s3:") and k.split(":")[1] not in WRITES)
    writes = sum(v for k, v in c.items() if k.startswith("s3:") and k.split(":")[1] in WRITES)
    ec2 = sum(v for k, v in c.items() if k.startswith("ec2:"))
    return reads, writes, ec2


def measure(n: int, endpoint: str, before: bool = False) -> dict:
    import boto3

    s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=endpoint)
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=endpoint)
    bucket = f"bench-{n}-{int(time.time())}"
    s3.create_bucket(Bucket=bucket)
    ids = [i["InstanceId"] for i in ec2.run_instances(ImageId="ami-12c6146b", MinCount=n + 1, MaxCount=n + 1)["Instances"]]
    nodes = [Node(endpoint, bucket, ids[i], f"10.0.{i // 250}.{i % 250 + 1}", n, before) for i in range(n)]

    t0 = time.monotonic()
    _run_all([x.form for x in nodes])
    formed = _delta(nodes, {})
    form_s = time.monotonic() - t0
    assert all(x.plan is not None and not isinstance(x.plan, int) and x.plan.generation == 1 for x in nodes)

    base = {x.instance: x.snapshot() for x in nodes}
    _run_all([lambda x=x: x.watch(STEADY_POLLS) for x in nodes])
    steady = _delta(nodes, base)

    # A loss: the last node's instance ends and its supervisor (and heartbeat) with it; a spare joins.
    lost = nodes[-1]
    lost.sup.stop_beats()
    ec2.terminate_instances(InstanceIds=[lost.instance])
    survivors = nodes[:-1]
    spare = Node(endpoint, bucket, ids[n], "10.0.9.9", n, before)
    everyone = survivors + [spare]
    base = {x.instance: x.snapshot() for x in everyone}
    t0 = time.monotonic()

    def survive(x: Node) -> None:
        others = [m for m in x.plan.nodes() if m != x.instance]
        while not (x.cluster.activity(x.plan.generation + 1) or x.sup.membership.gone(others)):
            time.sleep(POLL)
        x.sup.state.last_ran = x.plan.generation
        x.form()

    _run_all([lambda x=x: survive(x) for x in survivors] + [spare.form])
    reform = _delta(everyone, base)
    reform_s = time.monotonic() - t0
    assert all(x.plan.generation == 2 for x in everyone), [x.plan for x in everyone]
    for x in nodes + [spare]:
        x.sup.stop_beats()
    return {"n": n, "before": before, "form": formed, "form_s": form_s, "steady": steady, "reform": reform, "reform_s": reform_s}


def _label(r: dict) -> str:
    return f"{'before' if r['before'] else 'now':>6} {r['n']:>4}"


def report(rows: list[dict]) -> None:
    for phase, title in (("form", "forming generation 1 (all nodes)"),
                         ("reform", "re-forming after one loss (survivors + a replacement)")):
        print(f"\n{title}, requests:")
        print(f"{'':>6} {'N':>4} {'S3 reads':>9} {'S3 writes':>9} {'EC2':>6} {'per node':>9} {'seconds':>8}")
        for r in rows:
            reads, writes, ec2 = _split(r[phase])
            print(f"{_label(r)} {reads:>9} {writes:>9} {ec2:>6} {(reads + writes + ec2) / r['n']:>9.1f} "
                  f"{r[phase + '_s']:>8.1f}")
    print(f"\nsteady state ({STEADY_POLLS} polls of {POLL} s, liveness every {LIVENESS} s), per node per poll:")
    for r in rows:
        reads, writes, ec2 = _split(r["steady"])
        k = r["n"] * STEADY_POLLS
        print(f"{_label(r)} S3 reads {reads / k:.2f}, S3 writes {writes / k:.2f}, EC2 {ec2 / k:.3f}"
              f"   ({', '.join(f'{op} {v}' for op, v in sorted(r['steady'].items()))})")
    now = [r for r in rows if not r["before"]]
    if not now:
        return
    big = now[-1]
    for phase in ("steady", "reform"):
        reads, writes, ec2 = _split(big[phase])
        if phase == "steady":
            span = STEADY_POLLS * POLL
        else:
            span = big["reform_s"]
        # Per node per second at the scaled periods, then at production periods (polls are 4x and
        # liveness 5x slower there: take the slower, 4x, for the S3 rates; EC2 by liveness, 5x).
        scale_s3, scale_ec2 = PROD_POLL / POLL, PROD_LIVENESS / LIVENESS
        r_node = reads / big["n"] / span / scale_s3
        w_node = writes / big["n"] / span / scale_s3
        e_cluster = ec2 / span / scale_ec2
        print(f"\n{phase} at production periods, from N={big['n']}: per node {r_node:.3f} S3 reads/s, "
              f"{w_node:.3f} S3 writes/s; per cluster {e_cluster:.3f} EC2 calls/s")
        for n in (256, 512):
            print(f"  {n} nodes: S3 reads {n * r_node:,.0f}/s ({n * r_node / S3_GET_PER_PREFIX:.1%} of {S3_GET_PER_PREFIX:,.0f} "
                  f"per prefix), writes {n * w_node:,.0f}/s ({n * w_node / S3_PUT_PER_PREFIX:.1%} of "
                  f"{S3_PUT_PER_PREFIX:,.0f}); EC2 {e_cluster:.2f}/s per cluster ({e_cluster / EC2_REFILL:.1%} of "
                  f"{EC2_REFILL:g}/s), 10 clusters {10 * e_cluster:.2f}/s ({10 * e_cluster / EC2_REFILL:.1%})")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, nargs="+", default=[8, 16, 32, 64])
    p.add_argument("--before", type=int, nargs="*", default=[8, 16, 32],
                   help="also run the pre-issue-27 control plane at these sizes, side by side [8 16 32]")
    a = p.parse_args()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    tmp = Path(tempfile.mkdtemp(prefix="dl-bench-cp-"))
    for var in ("DL_ETC_DIR", "DL_RUN_DIR", "DL_SCRATCH", "DL_LOG_DIR"):
        os.environ[var] = str(tmp / var.lower())
    from tests.runtime.drill import start_moto_server

    server, endpoint = start_moto_server(tmp / "moto.log")
    try:
        rows = []
        for n, before in sorted({(n, False) for n in a.nodes} | {(n, True) for n in a.before}):
            r = measure(n, endpoint, before)
            rows.append(r)
            print(f"{'before' if before else 'now'} N={n}: formed in {r['form_s']:.1f} s, re-formed in "
                  f"{r['reform_s']:.1f} s", flush=True)
        report(rows)
    finally:
        server.terminate()
        server.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
