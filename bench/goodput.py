"""Goodput of a two-node job under a fault schedule: DDP with and without the survivors' kept
step, or (--fsdp) FSDP2 with and without the memory tier (save_to_memory every step).

The test suite's drill (2 nodes x 2 ranks, real torchrun on gloo, the node bundle, moto_server and
a fake IMDS per node on 127.0.0.x) runs the same job twice, side by side in one run of this script:
once with `Checkpointer.keep_on_failure` (issue 37) and once without (the periodic checkpoint
only). Each run: a cold start, then hard kills (SIGKILL of a node's whole process tree, its
instance terminated; the rank-0 node and the other in turn) every `--interval` seconds of
training. The replacement boots at the kill, so EC2's launch time is excluded. (A termination
notice costs no step either way: bench/drill_recovery.py.) Reported:
- goodput: the wall time spent on steps that were kept (not done again later), over the wall time
  from the first step to the last;
- steps done again, per kill and in all;
- recovery per kill, split into phases from the records the nodes write in S3 (their own clocks):
    detection   kill -> the gone record (the asker's EC2 check, or the heartbeat)
    kept+sent   -> the survivor's join of the next generation (it promotes and pushes the kept
                   step first; without keep_on_failure, only the last save's push)
    rendezvous  -> the next plan
    restart     -> the first step of the next generation (restore, torchrun, torch start-up)
- the step time with and without the survivors' bookkeeping (median of every step on rank 0);
- an extrapolation to a 512-node job at Llama 3's published failure rate.

    python bench/goodput.py [--kills 4] [--interval 8] [--every 10] [--node-periods]
    python bench/goodput.py --inprocess          DDP with keep_on_failure both times: torchrun's restart
                                                 against -c restart=in-process (ranks.py: the survivors'
                                                 ranks keep their processes, every node's ranks start
                                                 before their plan)
    python bench/goodput.py --fsdp [--width 256]   the FSDP2 job: the memory tier (save_to_memory
                                                   every step) against S3-only async saves
    python bench/goodput.py --fsdp --inprocess     the FSDP2 job with the memory tier both times:
                                                   torchrun's restart against -c restart=in-process
    python bench/goodput.py --overhead 5 [--sleep 1.0] [--against DIR]
        the memory tier's step-time overhead alone: bench/memory_step.py (the same FSDP2 job, its
        4 ranks only, no drill around them) without and with the tier, interleaved, 5 rounds;
        --against DIR also runs the tier of the code in DIR each round (before against after);
        --alternate B: each run turns the tier on and off in blocks of B steps, the ratio within it;
        --memory-every K: a snapshot every K steps; --stub PART: that part of the tier left out;
        --ranks-per-node 1: 2 nodes x 1 rank (no more ranks than a 2-core machine's cores)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
for _k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):  # moto_server's stand-ins: everything goes to 127.0.0.1
    os.environ.setdefault(_k, "testing")
from tests.runtime.drill import PROJECT, Drill, generations, start_moto_server  # noqa: E402

SLEEP = 0.04
# Llama 3 (Meta, 2024): 419 unexpected interruptions in 54 days on 16,384 GPUs.
LLAMA3_PER_GPU_DAY = 419 / 54 / 16384


def _training(d: Drill, after: int) -> bool:
    g = d.current_gen()
    return g is not None and int(g) > after and d.running(g, 0)


def _record(d: Drill, key: str) -> dict:
    body = d.s3.get_object(Bucket=d.bucket, Key=f"{d.prefix}/_cluster/{key}")["Body"].read()
    return json.loads(body)


def _phases(d: Drill, victim, g: str, g2: str) -> dict[str, float]:
    """Seconds per recovery phase after `victim` was killed in generation g (g2: the next one)."""
    events = d.read_events()
    first = min(e["t"] for e in events if e["event"] == "step" and e["gen"] == g2)
    plan = d.plan(g2)
    listing = d.s3.list_objects_v2(Bucket=d.bucket, Prefix=f"{d.prefix}/_cluster/gen-{int(g2):06d}/join/")
    survivors = {n.id for n in d.live()} & {m["node"] for m in d.plan(g)["members"]}
    joins = [int(o["Key"].rsplit("_", 1)[1][:-5]) / 1000 for o in listing.get("Contents", [])
             if o["Key"].rsplit("/", 1)[1].split("_")[0] in survivors]
    try:
        detected = _record(d, f"gone/{victim.id}.json")["at"]
    except d.s3.exceptions.NoSuchKey:
        detected = min(joins)
    rejoined = max(joins) if joins else detected
    # restart=in-process: when the replacement's ranks (started before the plan) had torch and the
    # script loaded, from the plan (negative: before it); the rest of "restart" is the group's init and restore.
    newcomer = {m["node"] for m in plan["members"]} - {m["node"] for m in d.plan(g)["members"]}
    imported = [e["t"] for e in events if e["event"] == "imported" and e["node"] in newcomer]
    return {"detection": detected - victim.killed_at, "kept+sent": max(0.0, rejoined - detected),
            "rendezvous": max(0.0, plan["created"] - rejoined), "restart": first - plan["created"],
            "total": first - victim.killed_at,
            **({"newcomer imported": max(imported) - plan["created"]} if imported else {})}


def _goodput(d: Drill) -> tuple[float, int, float]:
    """(kept step time / wall time, steps done again, median step seconds) from rank 0's events."""
    events = [e for e in d.read_events() if e["event"] == "step" and e["rank"] == 0]
    gens = generations(d.read_events())
    order = sorted((g for g in gens if gens[g]["starts"]), key=int)  # a generation that failed before training: none
    starts = {g: min(gens[g]["starts"].values()) for g in order}
    kept_s, times, done = 0.0, [], 0
    for i, g in enumerate(order):
        steps = sorted((e["step"], e["t"]) for e in events if e["gen"] == g)
        redo_from = min((starts[h] for h in order[i + 1:]), default=None)
        for (s0, t0), (s1, t1) in zip(steps, steps[1:]):
            times.append(t1 - t0)
            if redo_from is None or s1 < redo_from:
                kept_s += t1 - t0
        done += len(steps)
    wall = max(e["t"] for e in events) - min(e["t"] for e in events)
    distinct = len({e["step"] for e in events})
    return kept_s / wall, done - distinct, statistics.median(times)


# A node's own periods (SupervisorConfig's defaults), in place of the drill's short ones.
NODE_PERIODS = {"DL_POLL_SECONDS": "2", "DL_LIVENESS_POLL_SECONDS": "10", "DL_AGENT_POLL_SECONDS": "2",
                "DL_STOP_TIMEOUT_SECONDS": "20", "DL_RETRY_BASE_SECONDS": "1"}


def _drill(root: Path, endpoint: str, keep: bool, every: int, fsdp: Optional[int], sleep: float,
           inprocess: bool = False) -> Drill:
    if inprocess:  # a train() per generation (Checkpointer.run_generations), deployed with the key: the same
        # DDP job, or (fsdp) the FSDP2 job with the memory tier
        job = "inproc_train.py" if fsdp is None else f"fsdp_train.py --width {fsdp} --memory"
        command = (f"python {job} --steps 100000 --every {every} --sleep {sleep} "
                   f"--events {root / 'events.jsonl'} --final {root / 'final.pt'}")
        return Drill(root, endpoint, steps=100_000, every=every, job_command=command, context={"restart": "in-process"})
    if fsdp is None:
        args = "--pad-mb 0" + ("" if keep else " --no-keep")
        return Drill(root, endpoint, steps=100_000, every=every, sleep=sleep, args=args)
    # The sharded drill's job, written as a job file (no CDK synth): async DCP saves every `every`
    # steps, and with `keep` the memory tier every step.
    command = (f"dl-torchrun {PROJECT / 'fsdp_train.py'} --steps 100000 --every {every} --sleep {sleep} "
               f"--width {fsdp}{' --memory' if keep else ''} --events {root / 'events.jsonl'} --final {root / 'final.pt'}")
    return Drill(root, endpoint, steps=100_000, every=every, command=command, job="goodput-fsdp")


def run(keep: bool, kills: int, interval: float, every: int, node_periods: bool = False,
        fsdp: Optional[int] = None, sleep: float = SLEEP, inprocess: bool = False) -> dict:
    root = Path(tempfile.mkdtemp(prefix="dl-goodput-"))
    server, endpoint = start_moto_server(root / "moto.log")
    (root / "run").mkdir()
    d = _drill(root / "run", endpoint, keep, every, fsdp, sleep, inprocess)
    if node_periods:
        d.base_env.update(NODE_PERIODS)
    addr = iter(range(2, 250))
    out: dict = {"kills": []}
    try:
        d.add_node(f"127.0.0.{next(addr)}")
        d.add_node(f"127.0.0.{next(addr)}")
        d.wait("the cluster to train", lambda: _training(d, 0), timeout=180)
        for i in range(kills):
            g = d.current_gen()
            time.sleep(interval)
            rank0 = d.node_with_rank0(g)
            victim = rank0 if i % 2 == 0 else next(n for n in d.live() if n is not rank0)
            asker = min(n.id for n in d.live()) == victim.id
            victim.kill()
            d.add_node(f"127.0.0.{next(addr)}")
            d.wait("recovery", lambda: _training(d, int(g)), timeout=180)
            g2 = d.current_gen()
            lost = max(d.steps_seen(g)) + 1 - min(generations(d.read_events())[g2]["starts"].values())
            out["kills"].append({"who": ("rank-0 node" if i % 2 == 0 else "other node")
                                 + (", first in id order" if asker else ""),
                                 "lost": lost, **_phases(d, victim, g, g2)})
        time.sleep(interval)
        out["goodput"], out["redone"], out["step"] = _goodput(d)
    finally:
        d.stop()
        server.terminate()
    return out


def _standard_error(ratios: list[float]) -> str:
    """The mean's standard error, for reading one run against a goal: runs of 10-30 rounds on a
    shared 2-core machine scatter by about 2 points (BENCHMARKS.md)."""
    if len(ratios) < 2:
        return ""
    return f", standard error {statistics.stdev(ratios) / len(ratios) ** 0.5:.3f}"


def overhead(pairs: int, sleep: float, width: int, against: Optional[str] = None, alternate: int = 0,
             every: int = 1, stub: Optional[str] = None, local: int = 2) -> int:
    """Interleaved runs of bench/memory_step.py without and with the memory tier; ratios of medians.
    With `against` (a copy of another commit's tree), each round also runs the tier of that code.
    With `alternate` B, each run turns the tier on and off in blocks of B steps and the ratio is
    its own on blocks against its off blocks (no separate run without the tier). `local`: ranks per
    node of the job's 2 nodes (2: 4 ranks on this machine's cores)."""
    import shutil
    import subprocess

    kinds = (["with"] if alternate else ["without", "with"]) + (["against"] if against else [])
    runs: dict[str, list[dict]] = {k: [] for k in kinds}
    extra = (["--alternate", str(alternate), "--steps", str(12 * alternate)] if alternate else []) + [
        "--memory-every", str(every)] + (["--stub", stub] if stub else [])
    left_out = 0
    for i in range(pairs):
        for kind in kinds:
            root = Path(tempfile.mkdtemp(prefix="dl-overhead-"))
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(2 * local),
                   str(ROOT / "bench" / "memory_step.py"), "--per-node", str(local), "--sleep", str(sleep),
                   "--width", str(width), "--root", str(root)]
            code = against if kind == "against" else str(ROOT)
            out = subprocess.run(cmd + (["--memory"] + extra if kind != "without" else []), capture_output=True,
                                 text=True, timeout=900, cwd=ROOT, env={**os.environ, "PYTHONPATH": code})
            for d in (root, *Path("/dev/shm").glob(f"{root.name}-*")):
                shutil.rmtree(d, ignore_errors=True)
            lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
            if out.returncode or not lines:
                print(out.stderr[-3000:], file=sys.stderr)
                return 1
            got = json.loads(lines[-1])
            if kind != "without" and "snapshot_cpu" not in got:  # the tier was off: this round measures nothing
                why = [ln for ln in out.stderr.splitlines() if "memory tier" in ln] or out.stderr.splitlines()[-3:]
                print(f"round {i + 1}: left out, the tier of the {kind!r} run took no snapshot: {' | '.join(why)}", flush=True)
                left_out += 1
                for k in kinds:
                    del runs[k][i - left_out + 1:]
                break
            runs[kind].append(got)
            print(f"round {i + 1} {kind}: {json.dumps(got)}", flush=True)
    print()
    if left_out:
        print(f"{left_out} of {pairs} rounds left out (the tier off in one of their runs)")
    for kind in [k for k in kinds if k != "without"]:
        rs = runs[kind]
        if alternate:
            off = statistics.median(r["step"] for r in rs)
            ratios = [r["step_on"] / r["step"] for r in rs]
        else:
            off = statistics.median(r["step"] for r in runs["without"])
            ratios = [b["step"] / a["step"] for a, b in zip(runs["without"], rs)]
        on = statistics.median(r["step_on" if alternate else "step"] for r in rs)
        ms = {k: statistics.median(r.get(k, 0.0) for r in rs) * 1000 for k in ("snapshot_cpu", "snapshot_wall", "state_dict", "save_call")}
        parts = "; ".join(f"{p} +{statistics.median(r[p + '_on'] - r[p] for r in rs) * 1000:.2f} ms"
                          for p in ("compute", "core_wait", "saves") if alternate and all(p in r for r in rs))
        if alternate:  # every thread's: the training thread's, the tier's, the link's reader's, gloo's
            parts += f"; the process's CPU a step +{statistics.median(r['cpu_on'] - r['cpu'] for r in rs) * 1000:.2f} ms"
        label = "the tier of " + against if kind == "against" else "the memory tier" + (f" (stub: {stub})" if stub else "")
        how = ("every step" if every == 1 else f"every {every} steps") + (
            f", in alternating blocks of {alternate} steps" if alternate else "")
        print(f"median step: {off * 1000:.1f} ms without, {on * 1000:.1f} ms with {label} ({how}): "
              f"median ratio {statistics.median(ratios):.3f}x (rounds {min(ratios):.3f}-{max(ratios):.3f}x; mean "
              f"{statistics.mean(ratios):.3f}x{_standard_error(ratios)}); "
              f"the tier's thread {ms['snapshot_cpu']:.1f} ms CPU, {ms['snapshot_wall']:.0f} ms wall per snapshot; "
              f"on the training thread the state dict {ms['state_dict']:.2f} ms, save_to_memory {ms['save_call']:.1f} ms"
              + (f"; the step's parts, on blocks against off (median of rounds): {parts}" if parts else ""))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=4)
    ap.add_argument("--interval", type=float, default=8.0, help="seconds of training between faults")
    ap.add_argument("--every", type=int, default=10, help="the periodic checkpoint, in steps")
    ap.add_argument("--save-minutes", type=float, default=30.0, help="extrapolation: a large job's save interval")
    ap.add_argument("--node-periods", action="store_true",
                    help="a node's own periods (poll 2 s, liveness 10 s: a heartbeat is stale after 30 s), not the drill's")
    ap.add_argument("--fsdp", type=int, metavar="WIDTH", nargs="?", const=256, default=None,
                    help="the FSDP2 job of this hidden width: the memory tier against S3-only async saves")
    ap.add_argument("--sleep", type=float, default=SLEEP,
                    help="seconds each step stands for the accelerator's work (the CPU is idle meanwhile)")
    ap.add_argument("--inprocess", action="store_true",
                    help="keep_on_failure (--fsdp: the memory tier) under torchrun's restart, then under -c restart=in-process")
    ap.add_argument("--overhead", type=int, metavar="PAIRS", default=0,
                    help="only the memory tier's step-time overhead: this many interleaved pairs of 4-rank runs")
    ap.add_argument("--alternate", type=int, default=0, metavar="B",
                    help="with --overhead: each run turns the tier on and off in blocks of B steps (ratio within one run)")
    ap.add_argument("--memory-every", type=int, default=1, metavar="K",
                    help="with --overhead: the tier snapshots every K steps (save_to_memory(..., every=K))")
    ap.add_argument("--ranks-per-node", type=int, default=2, choices=(1, 2),
                    help="with --overhead: ranks per node of the 2 (2: 4 ranks share this machine's cores; 1: a core each)")
    ap.add_argument("--stub", choices=("exchange", "thread", "snapshot", "vote"),
                    help="with --overhead: where the cost goes, a part of the tier left out (bench/memory_step.py --stub)")
    ap.add_argument("--against", metavar="DIR",
                    help="with --overhead: also the tier of the code in DIR (e.g. `git archive <commit> | tar -x -C DIR`)")
    a = ap.parse_args()
    if a.against and not (Path(a.against) / "constructs_lib").is_dir():
        ap.error(f"--against {a.against}: no constructs_lib/ there; give a copy of the project's tree")
    if a.alternate and a.alternate < 5:
        ap.error(f"--alternate {a.alternate}: blocks of at least 5 steps (the first two of each are not counted)")
    if a.overhead:
        return overhead(a.overhead, a.sleep, a.fsdp or 256, a.against, a.alternate, a.memory_every, a.stub, a.ranks_per_node)
    results = {}
    for keep in (False, True):  # --inprocess: keep_on_failure both times, in-process the second
        results[keep] = run(keep or a.inprocess, a.kills, a.interval, a.every, a.node_periods, a.fsdp, a.sleep,
                            inprocess=a.inprocess and keep)
    phases = ("detection", "kept+sent", "rendezvous", "restart", "total")
    phases += ("newcomer imported",) if a.inprocess else ()
    what = "keep_on_failure" if a.fsdp is None else "the memory tier"
    if a.inprocess:
        what = f"restart=in-process ({what} both times)"
    for keep, r in results.items():
        print(f"\n{'with' if keep else 'without'} {what}: goodput {r['goodput']:.1%}, "
              f"steps done again {r['redone']}, median step {r['step'] * 1000:.0f} ms")
        print("| kill | steps lost | " + " | ".join(phases) + " |")
        for k in r["kills"]:
            print(f"| {k['who']} | {k['lost']} | " + " | ".join(f"{k[p]:.1f}" if p in k else "-" for p in phases) + " |")
    off, on = results[False], results[True]
    print(f"\nstep time with / without {what}: {on['step'] / off['step']:.3f}x")
    per_day = LLAMA3_PER_GPU_DAY * 512 * 8
    rec = statistics.median(k["total"] for k in on["kills"])
    lost_off = a.save_minutes * 60 / 2  # a kill lands, on average, half a save interval after the last save
    print(f"512 nodes x 8 GPUs at Llama 3's rate: {per_day:.2f} interruptions a day (one per {24 / per_day:.1f} h)")
    for what, lost in (("newest checkpoint only", lost_off), ("survivors keep the step", on["step"])):
        wasted = per_day * (rec + lost)
        print(f"  {what}: about {wasted / 60:.1f} min a day lost to failures ({wasted / 864:.2f}% of wall time), "
              f"recovery {rec:.0f} s + {lost:.0f} s of work redone per failure (save every {a.save_minutes:g} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
