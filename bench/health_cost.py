"""What node health costs a job (issue 38, item 4), measured on this machine, which has no GPU:

  gate   the boot health gate's wall time (health_gate.HealthGate.run) on a p5-like node (8 GPUs,
         4 EFA devices, a RAID), every tool a stand-in replaying tests/runtime/data/health's
         recordings, as the drills run it; with each check's own time. Off: no check runs.
  start  a cold start's critical path, gate on and off, in the supervisor's order (gate.start(),
         the job's preparation, gate.wait()), with a stand-in preparation of P seconds (a sleep:
         staging and image pulls wait on I/O). What the gate adds is the difference.
  probe  the pre-generation all-reduce (allreduce_probe, one process per member, gloo over
         127.0.0.1, the arguments collective_check passes): a probe's end-to-end seconds (what a
         re-formation waits, torch's import included) and one all-reduce's own time, at 2 nodes
         (the 2 x 2 drills: gloo runs one rank per node) and 3 (the collective drill), from the
         drill's 1 MiB to the default 256 MiB. Off: no probe runs.

Rounds alternate the configurations; medians are printed. DCGM on a GPU and NCCL over EFA are not
measurable here: BENCHMARKS.md quotes NVIDIA's documented DCGM durations, labelled as documented.

    python bench/health_cost.py [--rounds 3] [--prep 0,2,10] [--sizes 1,64,256] [--nodes 2,3]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from constructs_lib.runtime.health_checks import Expect  # noqa: E402
from constructs_lib.runtime.health_gate import HealthGate, checks_for  # noqa: E402
from tests.runtime.test_health_gate import node_tools  # noqa: E402 - the drills' stand-ins


def p5_like(tmp: Path) -> tuple[Expect, object]:
    os.makedirs(tmp / "scratch", exist_ok=True)
    return Expect(gpus=8, efa=4, scratch_gb=1, level="quick", scratch=str(tmp / "scratch")), node_tools(tmp)


def gate_once(expect: Expect, tools) -> tuple[float, dict[str, float], bool]:
    """(the gate's seconds, each check's, passed) for one run."""
    each: dict[str, float] = {}
    checks = []
    for check in checks_for(expect, "cuda"):
        def timed(e, t, check=check):
            started = time.perf_counter()
            f = check(e, t)
            each[f.check] = time.perf_counter() - started
            return f
        timed.__name__ = check.__name__
        checks.append(timed)
    gate = HealthGate(expect, checks=checks, tools=tools, log=lambda line: None, health=lambda *a: None)
    started = time.perf_counter()
    gate.run()
    return time.perf_counter() - started, each, not gate.failed()


def cold_start(expect: Expect, tools, prep: float, on: bool) -> float:
    """Seconds from the supervisor's start to the node being free to join (the preparation a sleep)."""
    started = time.perf_counter()
    gate = HealthGate(expect, checks=checks_for(expect, "cuda") if on else (), tools=tools,
                      log=lambda line: None, health=lambda *a: None)
    gate.start()  # off: no checks, so nothing runs
    time.sleep(prep)
    assert gate.wait()
    return time.perf_counter() - started


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def probe_once(nodes: int, size_mib: int) -> tuple[float, float, float]:
    """(end-to-end seconds, one all-reduce's seconds, busBW GB/s) of one probe across `nodes` processes."""
    port = free_port()
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    started = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-m", "constructs_lib.runtime.allreduce_probe", "--master", "127.0.0.1",
                               "--port", str(port), "--nodes", str(nodes), "--node-rank", str(r), "--size-mib",
                               str(size_mib), "--iters", "5", "--backend", "gloo"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(nodes)]
    outs = [p.communicate(timeout=600) for p in procs]
    took = time.perf_counter() - started
    if any(p.returncode for p in procs):
        raise RuntimeError(f"probe failed: {outs[0][1][-500:]}")
    v = json.loads(next(ln for ln in outs[0][0].splitlines() if ln.startswith("{")))
    n = v["ranks"]
    one = v["size_bytes"] * 2 * (n - 1) / n / (v["busbw"] * 1e9) if v["busbw"] else float("nan")
    return took, one, v["busbw"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prep", default="0,2,10", help="stand-in preparation times, seconds")
    ap.add_argument("--sizes", default="1,64,256", help="MiB per rank")
    ap.add_argument("--nodes", default="2,3")
    a = ap.parse_args()
    preps = [float(x) for x in a.prep.split(",")]
    sizes, counts = [int(x) for x in a.sizes.split(",")], [int(x) for x in a.nodes.split(",")]
    with tempfile.TemporaryDirectory() as d:
        os.environ.setdefault("DL_RUN_DIR", str(Path(d) / "run"))
        os.environ.setdefault("DL_SCRATCH", str(Path(d) / "scratch"))
        expect, tools = p5_like(Path(d))
        gates, each_runs = [], []
        starts: dict[tuple[float, bool], list[float]] = {}
        probes: dict[tuple[int, int], list[tuple[float, float, float]]] = {}
        imports: list[float] = []
        for _ in range(a.rounds):
            started = time.perf_counter()  # the part of a probe's start every member pays, however small the all-reduce
            subprocess.run([sys.executable, "-c", "import torch, torch.distributed"], check=True)
            imports.append(time.perf_counter() - started)
            took, each, passed = gate_once(expect, tools)
            assert passed, "the stand-ins replay a healthy node"
            gates.append(took)
            each_runs.append(each)
            for prep in preps:
                for on in (False, True):
                    starts.setdefault((prep, on), []).append(cold_start(expect, tools, prep, on))
            for n in counts:
                for s in sizes:
                    probes.setdefault((n, s), []).append(probe_once(n, s))
    med = statistics.median
    print(f"machine: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f} at the end; {a.rounds} rounds, medians")
    print("\nboot health gate (p5-like: 8 GPUs, 4 EFA, RAID; stand-in tools, DCGM level 1 replayed):")
    print(f"  on   {med(gates):6.2f} s   ({len(each_runs[0])} checks)")
    print("  off    0.00 s   (no check)")
    for name in each_runs[0]:
        print(f"    {name:14} {med(r[name] for r in each_runs):6.3f} s")
    print("\ncold start, supervisor start to free to join (preparation a sleep of P s):")
    print("  P (s)   gate off   gate on   the gate adds")
    for prep in preps:
        off, on = med(starts[(prep, False)]), med(starts[(prep, True)])
        print(f"  {prep:5.0f}   {off:8.2f}   {on:7.2f}   {on - off:+.2f} s")
    print("\npre-generation all-reduce probe (gloo, 127.0.0.1, one process per node, 1 warm-up + 5 all-reduces):")
    print(f"  python -c 'import torch, torch.distributed' alone: {med(imports):.2f} s")
    print("  nodes  size      probe end to end   one all-reduce   busBW        (off: 0 s)")
    for (n, s), runs in sorted(probes.items()):
        print(f"  {n:5}  {s:4} MiB  {med(r[0] for r in runs):12.2f} s   {med(r[1] for r in runs) * 1e3:10.1f} ms"
              f"   {med(r[2] for r in runs):6.2f} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
