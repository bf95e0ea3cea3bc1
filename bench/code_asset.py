"""What `-c code=DIR` costs, for a 50 MB project (40 MB in 40 binary files, 10 MB of source text in
1,000 files): `cdk synth` of multi-node-training with the code against the same synth without it
(the real CDK CLI, interleaved, medians), and on the node the unpack the supervisor does (unzip,
refuse members outside the directory, check the tree digest) against a plain `unzip -q` of the
same archive, side by side. The archive is made from the cloud assembly's staged copy, as the CLI
zips it at publish time.
"""
from __future__ import annotations

import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CDK = str(ROOT / "node_modules" / ".bin" / "cdk")


def make_project(root: Path) -> int:
    rng = random.Random(0)
    for i in range(40):
        p = root / "assets" / f"blob-{i:02d}.bin"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(rng.randbytes(1024 * 1024))
    line = "def step(batch, model, optimizer):  # a line of ordinary training code\n"
    for i in range(1000):
        p = root / "src" / f"pkg{i // 100}" / f"module_{i:04d}.py"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(line * (10 * 1024 // len(line)))
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


def synth(args: list[str], env: dict) -> float:
    t = time.perf_counter()
    r = subprocess.run([CDK, "synth", *args, "--quiet"], cwd=ROOT, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"cdk synth failed:\n{r.stderr[-2000:]}")
    return time.perf_counter() - t


def main() -> None:
    from constructs_lib.runtime.codetree import digest_tree, unpack

    runs = int(os.environ.get("RUNS", "3"))
    work = Path(tempfile.mkdtemp(prefix="dl-code-bench-"))
    project = work / "project"
    size = make_project(project)
    env = {**os.environ, "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20", "NODE_NO_WARNINGS": "1",
           "PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}"}
    base = ["-c", "profile=multi-node-training", "-c", "command=dl-torchrun train.py", "-c", "approve_hourly=1000"]
    with_code = [*base, "-c", f"code={project}"]
    without, withc = [], []
    synth([*with_code, "-o", str(work / "warm")], env)
    for i in range(runs):
        order = [(base, without), (with_code, withc)]
        for args, acc in (order if i % 2 == 0 else order[::-1]):
            out = work / f"out-{i}-{len(acc)}-{id(acc)}"
            acc.append(synth([*args, "-o", str(out)], env))
            shutil.rmtree(out)
    a, b = statistics.median(without), statistics.median(withc)
    print(f"cdk synth multi-node-training, medians of {runs}: without code {a:.2f} s, with a {size / 1e6:.0f} MB "
          f"code directory {b:.2f} s: +{b - a:.2f} s, ratio {b / a:.2f}")

    staged = next(p for p in (work / "warm").glob("asset.*") if (p / "src").is_dir())
    archive = work / "code.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
        for p in sorted(staged.rglob("*")):
            if p.is_file():
                z.write(p, p.relative_to(staged).as_posix())
    ours, plain = [], []
    for i in range(runs):
        for which in ((0, 1) if i % 2 == 0 else (1, 0)):
            dest = work / f"unpacked-{i}-{which}"
            t = time.perf_counter()
            if which == 0:
                unpack(str(archive), str(dest))
                digest_tree(str(dest))
                ours.append(time.perf_counter() - t)
            else:
                subprocess.run(["unzip", "-q", str(archive), "-d", str(dest)], check=True)
                plain.append(time.perf_counter() - t)
            shutil.rmtree(dest)
    o, u = statistics.median(ours), statistics.median(plain)
    print(f"node-side unpack of the {archive.stat().st_size / 1e6:.0f} MB archive (1,040 files), medians of {runs}: "
          f"unpack + digest check {o:.2f} s, plain unzip -q {u:.2f} s: ratio {o / u:.2f}")
    shutil.rmtree(work)


if __name__ == "__main__":
    import argparse
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
