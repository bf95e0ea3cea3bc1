"""Selector speed, measured side by side on this machine (noisy machines: compare ratios, not ms).

1. In-process: median time to rank the full catalog for each profile (goal: worst profile <= 0.5 ms, issue 25).
2. Cold CLI: `python -m dl_selector recommend --profile multi-node-training --json` wall time vs
   `python -c pass`, interleaved run by run (goal: ratio <= 2.0, issue 39 item 7; it was 2.5 under issue 25).
"""
from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
# --root DIR ranks another checkout's selector in this process (what --against runs for the in-process half)
_root = sys.argv[sys.argv.index("--root") + 1] if "--root" in sys.argv[:-1] else str(ROOT)
sys.path.insert(0, _root)


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


def cold(runs: int = 30, against: Optional[Path] = None) -> tuple[float, float, Optional[float]]:
    """Medians (ms) of `python -c pass`, the CLI here and, with `against`, the CLI in that checkout
    (another commit's worktree: before/after side by side), interleaved run by run."""
    cli = [sys.executable, "-m", "dl_selector", "recommend", "--profile", "multi-node-training", "--json"]
    base = [sys.executable, "-c", "pass"]
    cmds = [(base, ROOT, []), (cli, ROOT, [])] + ([(cli, against, [])] if against else [])
    for _ in range(runs):
        for cmd, cwd, acc in cmds:
            t = time.perf_counter()
            subprocess.run(cmd, cwd=cwd, stdout=subprocess.DEVNULL, check=True)
            acc.append(time.perf_counter() - t)
    medians = [statistics.median(acc) * 1000 for _, _, acc in cmds]
    return medians[0], medians[1], (medians[2] if against else None)


def _line(ranks: dict[str, float], where: str) -> str:
    worst = max(ranks, key=ranks.get)
    return (f"{where}rank full catalog, median per profile: max {ranks[worst]:.3f} ms ({worst}), "
            f"mean {statistics.mean(ranks.values()):.3f} ms  [goal <= 0.5 ms]")


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", type=Path, help="another checkout (e.g. a worktree of the previous commit): its "
                                                 "ranking and cold CLI run alternately with this one's")
    ap.add_argument("--cold-only", action="store_true", help="skip the in-process ranking")
    ap.add_argument("--in-process-only", action="store_true", help="skip the cold CLI")
    ap.add_argument("--root", help="rank this checkout's selector (used by --against)")
    ap.add_argument("--rounds", type=int, default=1, help="with --against: in-process rounds, alternating")
    a = ap.parse_args()
    if not a.cold_only:
        for _ in range(a.rounds if a.against else 1):
            print(_line(in_process(), f"{a.root}: " if a.root else ""), flush=True)
            if a.against:
                subprocess.run([sys.executable, __file__, "--in-process-only", "--root", str(a.against.resolve())],
                               cwd=a.against, check=True)
    if not a.in_process_only:
        base, here, there = cold(against=a.against)
        print(f"cold CLI: python -c pass {base:.1f} ms, recommend --json {here:.1f} ms, ratio {here / base:.2f}x  [goal <= 2.0x]")
        if there is not None:
            print(f"          {a.against}: recommend --json {there:.1f} ms, ratio {there / base:.2f}x")
