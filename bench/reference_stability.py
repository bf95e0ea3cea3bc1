"""The reference benchmark's own noise: do its timed windows agree, within a run and run to run?

Runs `python -m dl_selector.bench.reference` on this machine's CPU at one fixed small size, RUNS
times, and prints side by side for each run: the median window, the window spread
((max - min) / median) and the ratio of its median to the first run's. The goal (BENCHMARKS.md):
windows within 5% of each other, and medians within 5% run to run. Threads are pinned to one so
the figure measures the benchmark, not the scheduler of a shared 2-core machine.

    .venv/bin/python bench/reference_stability.py [--runs 3] [--windows 7]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from dl_core.benchline import parse_output

SIZE = ["--device", "cpu", "--model", "resnet50", "--width-div", "8", "--image-size", "96", "--batch", "8",
        "--precision", "fp32", "--warmup-steps", "10", "--steps-per-window", "25", "--threads", "1"]


def one_run(windows: int) -> list[float]:
    r = subprocess.run([sys.executable, "-m", "dl_selector.bench.reference", *SIZE, "--windows", str(windows)],
                       capture_output=True, text=True, check=True)
    found, problems = parse_output(r.stdout)
    assert not problems and len(found) == windows, (problems, r.stdout)
    return [w.samples_per_second for w in found]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--windows", type=int, default=7)
    a = p.parse_args()
    print(f"reference benchmark, fixed size: {' '.join(SIZE)}")
    print(f"{'run':>3}  {'median samples/s':>16}  {'window spread':>13}  {'vs run 1':>8}  seconds")
    first = None
    spreads, ratios = [], []
    for i in range(1, a.runs + 1):
        t0 = time.perf_counter()
        sps = one_run(a.windows)
        med = statistics.median(sps)
        spread = (max(sps) - min(sps)) / med
        first = first or med
        spreads.append(spread)
        ratios.append(med / first)
        print(f"{i:>3}  {med:>16.1f}  {spread:>12.1%}  {med / first:>8.3f}  {time.perf_counter() - t0:.1f}")
    worst_ratio = max(abs(r - 1) for r in ratios)
    print(f"worst window spread {max(spreads):.1%}; worst run-to-run difference of medians {worst_ratio:.1%} "
          f"(goal: both within 5%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
