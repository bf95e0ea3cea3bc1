"""`cdk synth -c profile=multi-node-training` vs a minimal hand-written CDK app that declares the
same resources as raw L1s (bench/minimal_app.py), both through the real CDK CLI, interleaved,
medians. Goal: ratio <= 1.2 (both pay the same jsii and CLI start-up).

Our synth also runs cdk-nag (AwsSolutions) on every resource; the minimal app runs no checks.
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CDK = str(ROOT / "node_modules" / ".bin" / "cdk")


def run(args: list[str], env: dict, check: bool = True) -> float:
    t = time.perf_counter()
    r = subprocess.run([CDK, *args], cwd=ROOT, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - t
    if check and r.returncode != 0:
        raise SystemExit(f"cdk {' '.join(args)} failed:\n{r.stderr[-2000:]}")
    return elapsed


def main() -> None:
    runs = int(os.environ.get("RUNS", "5"))
    env = {**os.environ, "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20", "NODE_NO_WARNINGS": "1",
           "PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}"}
    work = Path(tempfile.mkdtemp(prefix="dl-synth-bench-"))
    ours_out, minimal_out = work / "ours", work / "minimal"
    ours = ["synth", "-c", "profile=multi-node-training", "-c", "approve_hourly=1000", "--quiet", "-o", str(ours_out)]
    run(ours, env)  # warm-up, and the template the minimal app declares
    template = ours_out / "dl-multi-node-training.template.json"
    frozen = work / "template.json"
    shutil.copy(template, frozen)
    minimal = ["synth", "--app", f"{ROOT / '.venv' / 'bin' / 'python'} {ROOT / 'bench' / 'minimal_app.py'}",
               "--quiet", "-o", str(minimal_out)]
    plain = {**env, "BENCH_TEMPLATE": str(frozen)}
    nagged = {**plain, "BENCH_NAG": "1"}
    a, b, c = [], [], []
    sides = [(ours, env, a), (minimal, nagged, b), (minimal, plain, c)]
    for i in range(runs):
        for args, e, acc in (sides if i % 2 == 0 else sides[::-1]):
            acc.append(run(args, e, check=e is env))
    resources = len(json.loads(frozen.read_text())["Resources"])
    ma, mb, mc = statistics.median(a), statistics.median(b), statistics.median(c)
    print(f"cdk synth multi-node-training ({resources} resources, {frozen.stat().st_size // 1024} KiB), medians of {runs}:")
    print(f"  dl-launcher {ma:.2f} s; minimal L1 app with cdk-nag {mb:.2f} s: ratio {ma / mb:.2f}  [goal <= 1.2]")
    print(f"  minimal L1 app without cdk-nag {mc:.2f} s: ratio {ma / mc:.2f} (our cdk-nag run included)")
    shutil.rmtree(work)


if __name__ == "__main__":
    import argparse
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
