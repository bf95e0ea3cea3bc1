"""Selector speed, measured side by side on this machine (noisy machines: compare ratios, not ms).

1. In-process: median time to rank the full catalog for each profile (goal: worst profile <= 0.5 ms, issue 25).
2. Cold CLI: `python -m dl_selector recommend --profile multi-node-training --json` wall time vs
   `python -c pass`, interleaved run by run (goal: ratio <= 2.5, issue 25).
"""
from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def in_process(repeats: int = 200) -> dict[str, float]:
    from dl_selector.catalog import load_catalog
    from dl_selector.profiles import builtin_profiles
    from dl_selector.recommend import recommend

    load_catalog()  # the CLI loads it once per run; ranking is what is timed here
    profiles = builtin_profiles()
    times: dict[str, list[float]] = {name: [] for name in profiles}
    for _ in range(repeats):  # round-robin, so a noisy second spreads over every profile
        for name, profile in profiles.items():
            t = time.perf_counter()
            recommend(profile)
            times[name].append(time.perf_counter() - t)
    return {name: statistics.median(ts) * 1000 for name, ts in times.items()}


def cold(runs: int = 30) -> tuple[float, float]:
    cli = [sys.executable, "-m", "dl_selector", "recommend", "--profile", "multi-node-training", "--json"]
    base = [sys.executable, "-c", "pass"]
    a, b = [], []
    for _ in range(runs):
        for cmd, acc in ((base, a), (cli, b)):
            t = time.perf_counter()
            subprocess.run(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, check=True)
            acc.append(time.perf_counter() - t)
    return statistics.median(a) * 1000, statistics.median(b) * 1000


if __name__ == "__main__":
    import argparse
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    ranks = in_process()
    worst = max(ranks, key=ranks.get)
    print(f"rank full catalog, median per profile: max {ranks[worst]:.3f} ms ({worst}), "
          f"mean {statistics.mean(ranks.values()):.3f} ms  [goal <= 0.5 ms]")
    base, cli = cold()
    print(f"cold CLI: python -c pass {base:.1f} ms, recommend --json {cli:.1f} ms, ratio {cli / base:.2f}x  [goal <= 2.5x]")
