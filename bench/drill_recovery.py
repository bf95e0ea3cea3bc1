"""Recovery of a two-node DDP job on spot, in the test suite's drill (real torchrun, gloo on CPU,
the project's node bundle, moto_server and a fake IMDS per node on 127.0.0.x).

Measured side by side in one run, for the same job:
- cold start: both nodes booted at once -> every rank training (the floor: supervisor, agent,
  rendezvous in S3, torchrun and torch start-up);
- recovery after a node is killed (SIGKILL of its whole process tree, its instance terminated):
  kill -> every rank training again on a full cluster, the replacement booted at the moment of
  the kill, so EC2's launch time is excluded; and the steps lost (done before the kill, redone);
- recovery after a termination notice: notice -> every rank training again, the replacement
  booted when the noticed node has left; steps lost (goal: 0 on every node).
Prints the ratio recovery / cold start: what a loss costs beyond starting the job again.

    python bench/drill_recovery.py [--kills 4] [--notices 2]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import os  # noqa: E402

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
# moto_server's stand-in credentials (never real ones: everything goes to 127.0.0.1).
for _k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
    os.environ.setdefault(_k, "testing")
from tests.runtime.drill import Drill, generations, start_moto_server  # noqa: E402

STEPS, EVERY, SLEEP = 100_000, 10, 0.04


def all_training(d: Drill, after: int) -> bool:
    g = d.current_gen()
    return g is not None and int(g) > after and d.running(g, 0)


def first_step_time(d: Drill, g: str) -> float:
    steps = [e["t"] for e in d.read_events() if e["event"] == "step" and e["gen"] == g]
    return min(steps)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=4)
    ap.add_argument("--notices", type=int, default=2)
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="dl-drill-bench-"))
    server, endpoint = start_moto_server(root / "moto.log")
    (root / "run").mkdir()
    d = Drill(root / "run", endpoint, steps=STEPS, every=EVERY, sleep=SLEEP)
    addr = iter(range(2, 250))
    kills, notices = [], []
    try:
        t0 = time.time()
        d.add_node(f"127.0.0.{next(addr)}")
        d.add_node(f"127.0.0.{next(addr)}")
        d.wait("the cluster to train", lambda: all_training(d, 0), timeout=120)
        cold = first_step_time(d, d.current_gen()) - t0
        for i in range(a.kills):
            g = d.current_gen()
            start = min(generations(d.read_events())[g]["starts"].values())
            d.wait("progress", lambda: d.running(g, start + 25) and d.newest_in_s3() >= start + 19, timeout=120)
            victim = d.node_with_rank0(g) if i % 2 == 0 else next(n for n in d.live() if n is not d.node_with_rank0(g))
            victim.kill()
            done = max(d.steps_seen(g))
            d.add_node(f"127.0.0.{next(addr)}")
            d.wait("recovery", lambda: all_training(d, int(g)), timeout=120)
            g2 = d.current_gen()
            resumed = min(generations(d.read_events())[g2]["starts"].values())
            kills.append((first_step_time(d, g2) - victim.killed_at, done + 1 - resumed,
                          "rank-0 node" if i % 2 == 0 else "other node"))
        for i in range(a.notices):
            g = d.current_gen()
            start = min(generations(d.read_events())[g]["starts"].values())
            d.wait("progress", lambda: d.running(g, start + 15), timeout=120)
            victim = d.node_with_rank0(g) if i % 2 == 0 else next(n for n in d.live() if n is not d.node_with_rank0(g))
            noticed = time.time()
            victim.imds.interrupt(seconds=120)
            d.wait("the noticed node to leave", lambda: "left the cluster" in victim.log_text(), timeout=60)
            victim.kill()
            left = time.time()
            d.add_node(f"127.0.0.{next(addr)}")
            d.wait("recovery", lambda: all_training(d, int(g)), timeout=120)
            g2 = d.current_gen()
            done = max(d.steps_seen(g))
            resumed = min(generations(d.read_events())[g2]["starts"].values())
            notices.append((first_step_time(d, g2) - left, left - noticed, done + 1 - resumed,
                            "rank-0 node" if i % 2 == 0 else "other node"))
    finally:
        d.stop()
        server.terminate()
    print(f"cold start (2 nodes x 2 ranks, boot -> every rank training): {cold:.1f} s")
    for secs, lost, who in kills:
        print(f"kill of the {who}: training again on a full cluster after {secs:.1f} s "
              f"({secs / cold:.2f}x cold start); steps lost {lost}")
    for secs, stop_to_leave, lost, who in notices:
        print(f"termination notice on the {who}: stopped, saved, uploaded and left in {stop_to_leave:.1f} s; "
              f"training again {secs:.1f} s after it left ({secs / cold:.2f}x cold start); steps lost {lost}")
    if kills:
        med = statistics.median(s for s, _, _ in kills)
        print(f"median recovery after a kill: {med:.1f} s = {med / cold:.2f}x cold start; "
              f"steps lost median {statistics.median(x for _, x, _ in kills)} (checkpoint every {EVERY} steps)")
    if notices:
        print(f"steps lost after a termination notice: {[lost for _, _, lost, _ in notices]} (goal: 0 each)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
