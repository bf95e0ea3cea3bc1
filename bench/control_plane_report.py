"""What bench/control_plane.py prints: every request it recorded, counted per S3 prefix, with the
busiest second of each phase at production periods, and that second extrapolated to 512 and
1,000 nodes (the most the product accepts) against S3's per-prefix rates.

Prefixes, three ways (S3 serves "at least 3,500 PUT/COPY/POST/DELETE or 5,500 GET/HEAD requests
per second per partitioned prefix", and partitions a prefix only after sustained load on it:
https://docs.aws.amazon.com/AmazonS3/latest/userguide/optimizing-performance.html):
- fine: `_cluster/gen-NNNNNN/`, `_cluster/beat/`, `_cluster/gone/`, `_cluster/` itself (the end
  records and the generation LIST), and the checkpoints outside `_cluster/`. What S3 could give
  if it had already split every one of these; a generation's prefix is new at each re-formation,
  so it never has: this column is an optimist's;
- `_cluster/`: the whole cluster prefix as one partition;
- job: every key of the job (`_cluster/` and the checkpoints) as one partition, which is what a
  fresh bucket is. The verdict is on this one, the most conservative.
A LIST counts as a read against the prefix it lists.

Time-scaling: the bench runs every period divided by SCALE (poll, liveness, staleness, the boot
spread and the grace: one ratio for all). A request recorded at t seconds into a phase is put at
SCALE * t at production periods, and the busiest second is the most requests in any 1 s sliding
window of those scaled times (1/SCALE s of measured time). Scaling stretches the request
latencies too, so a chain of requests made back to back is spread over SCALE times its measured
duration; `chain` below reports the most requests any node made with no sleep between them (each
started within `gap`, less than the shortest sleep, of the one before), which is the floor of what
one node can put in one second whatever the latency.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Iterable, NamedTuple, Sequence

S3_READS, S3_WRITES, EC2_REFILL = 5500.0, 3500.0, 20.0
WRITES = frozenset({"PutObject", "DeleteObject", "CopyObject", "CompleteMultipartUpload", "UploadPart",
                    "CreateMultipartUpload", "AbortMultipartUpload"})
TARGETS = (512, 1000)
GRANULARITIES = ("fine", "_cluster/", "job")


class Request(NamedTuple):
    t: float       # time.monotonic() when the call was made
    node: str
    service: str   # s3 | ec2
    op: str
    key: str       # the Key, or the Prefix a LIST asks for, relative to the bucket; "" for EC2
    thread: int = 0


def production_times(requests: Sequence[Request], t0: float, scale: float, gap: float) -> dict[str, list[float]]:
    """Each request's time at production periods, two ways: "plain", every measured second
    times `scale`; "sleeps", only the pauses between one thread's requests (a gap longer than
    `gap`: a sleep or a poll) times `scale`, requests made back to back kept at their measured
    spacing, as S3's latency does not grow with the periods."""
    plain = [(r.t - t0) * scale for r in requests]
    sleeps = [0.0] * len(requests)
    by_thread: dict[tuple[str, int], list[int]] = defaultdict(list)
    for i, r in enumerate(requests):
        by_thread[(r.node, r.thread)].append(i)
    for idx in by_thread.values():
        idx.sort(key=lambda i: requests[i].t)
        at = (requests[idx[0]].t - t0) * scale
        sleeps[idx[0]] = at
        for a, b in zip(idx, idx[1:]):
            d = requests[b].t - requests[a].t
            at += d * scale if d > gap else d
            sleeps[b] = at
    return {"plain": plain, "sleeps": sleeps}


def prefix_of(key: str, job: str, granularity: str) -> str:
    rel = key[len(job) + 1:] if key.startswith(job + "/") else key
    if not rel.startswith("_cluster/"):
        return "job" if granularity == "job" else "checkpoints"
    if granularity != "fine":
        return "job" if granularity == "job" else "_cluster/"
    rest = rel[len("_cluster/"):]
    head = rest.split("/", 1)[0]
    if "/" in rest and (head.startswith("gen-") or head in ("beat", "gone")):
        return f"_cluster/{head}/"
    return "_cluster/ (top)"


def busiest(times: Sequence[float], window: float) -> int:
    """The most of `times` (sorted) in any half-open window of `window` seconds."""
    best, lo = 0, 0
    for hi, t in enumerate(times):
        while t - times[lo] >= window:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def chain(requests: Iterable[Request], gap: float) -> int:
    """The most requests one node made back to back (each within `gap` s of the one before)."""
    by_node: dict[str, list[float]] = defaultdict(list)
    for r in requests:
        by_node[r.node].append(r.t)
    best = 0
    for times in by_node.values():
        times.sort()
        run = 1
        for a, b in zip(times, times[1:]):
            run = run + 1 if b - a <= gap else 1
            best = max(best, run)
        best = max(best, 1 if times else 0)
    return best


def peaks(requests: Sequence[Request], times: Sequence[float], job: str) -> dict:
    """{granularity: {prefix: (busiest second of reads, of writes, total reads, total writes)}},
    plus "ec2": (busiest second, total); `times`: each request's time at production periods."""
    out: dict = {}
    for g in GRANULARITIES:
        groups: dict[tuple[str, bool], list[float]] = defaultdict(list)
        for r, t in zip(requests, times):
            if r.service == "s3":
                groups[(prefix_of(r.key, job, g), r.op in WRITES)].append(t)
        table = {}
        for prefix in sorted({p for p, _ in groups}):
            reads, writes = sorted(groups[(prefix, False)]), sorted(groups[(prefix, True)])
            table[prefix] = (busiest(reads, 1.0), busiest(writes, 1.0), len(reads), len(writes))
        out[g] = table
    ec2 = sorted(t for r, t in zip(requests, times) if r.service == "ec2")
    out["ec2"] = (busiest(ec2, 1.0), len(ec2))
    return out


def _worst(table: dict, n: int) -> tuple[str, float, float]:
    """The prefix with the highest busiest-second share, its reads and writes per node."""
    prefix, (r, w, _, _) = max(table.items(), key=lambda kv: max(kv[1][0] / S3_READS, kv[1][1] / S3_WRITES))
    return prefix, r / n, w / n


def report(rows: Sequence[dict], scale: float, gap: float, out=print) -> None:
    """rows: one per N, each {"n", "job", "phases": {phase: {"requests", "t0", "seconds", ...}}}."""
    phases = [p for p in ("form", "boot", "steady", "reform") if p in rows[0]["phases"]]
    names = {"form": "forming generation 1, all nodes at once",
             "boot": "forming generation 1 while the fleet boots (arrivals spread over 60 s)",
             "steady": "steady state (a running generation's watch and the heartbeat)",
             "reform": "re-forming after a loss (survivors and a replacement)"}
    for phase in phases:
        out(f"\n== {names[phase]} ==")
        out(f"{'N':>4} {'requests':>9} {'per node':>9} {'prod s':>7} {'avg S3 r/s/node':>16} {'chain':>6}   "
            "busiest second at production periods (sleeps scaled | all scaled): S3 reads/writes; EC2")
        for row in rows:
            ph = row["phases"][phase]
            reqs, n = ph["requests"], row["n"]
            times = production_times(reqs, ph["t0"], scale, gap)
            ph["peaks"] = {way: peaks(reqs, t, row["job"]) for way, t in times.items()}
            s3_reads = sum(1 for r in reqs if r.service == "s3" and r.op not in WRITES)
            avg = s3_reads / n / (ph["seconds"] * scale) if ph["seconds"] else 0.0

            def two(g: str, prefix: str) -> str:
                a, b = (ph["peaks"][w][g].get(prefix, (0, 0)) for w in ("sleeps", "plain"))
                return f"{a[0]}/{a[1]} | {b[0]}/{b[1]}"
            fine = ", ".join(f"{k} {v[0]}/{v[1]}" for k, v in ph["peaks"]["sleeps"]["fine"].items())
            out(f"{n:>4} {len(reqs):>9} {len(reqs) / n:>9.1f} {ph['seconds'] * scale:>7.1f} {avg:>16.3f} "
                f"{chain(reqs, gap):>6}   job {two('job', 'job')}; _cluster/ {two('_cluster/', '_cluster/')}; "
                f"EC2 {ph['peaks']['sleeps']['ec2'][0]} | {ph['peaks']['plain']['ec2'][0]}")
            out(f"{'':>4} by prefix, sleeps scaled: {fine}")
        extrapolate(rows, phase, out)


def extrapolate(rows: Sequence[dict], phase: str, out=print) -> None:
    """The busiest second per node at each measured N, and the largest of them times 512 and
    1,000: the cluster's busiest second if every node's burst lines up as closely as it did at
    the N where they lined up most (on 2 cores, more threads spread a burst out, so the largest
    per-node share is the conservative one to carry)."""
    for g in ("job", "_cluster/"):
        per_node = []
        for row in rows:
            for way in ("sleeps", "plain"):  # the larger of the two ways of scaling time
                table = row["phases"][phase]["peaks"][way][g]
                if table:
                    prefix, r, w = _worst(table, row["n"])
                    per_node.append((row["n"], r, w))
        per_node = [max((x for x in per_node if x[0] == n), key=lambda x: x[1]) for n in sorted({x[0] for x in per_node})]
        if not per_node:
            continue
        r_max = max(r for _, r, _ in per_node)
        w_max = max(w for _, _, w in per_node)
        shares = ", ".join(f"N={n}: {r:.2f}/{w:.2f}" for n, r, w in per_node)
        out(f"  {g:<10} busiest second per node, reads/writes: {shares}")
        for m in TARGETS:
            reads, writes = m * r_max, m * w_max
            verdict = "fits" if reads <= S3_READS and writes <= S3_WRITES else "OVER"
            out(f"  {g:<10} at {m:>5,} nodes: {reads:>7,.0f} reads/s ({reads / S3_READS:.0%} of {S3_READS:,.0f}), "
                f"{writes:>6,.0f} writes/s ({writes / S3_WRITES:.0%} of {S3_WRITES:,.0f}): {verdict}")
