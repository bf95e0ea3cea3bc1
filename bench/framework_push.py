"""A framework's own checkpoint (-c checkpoint_dir=) pushed by the node against `aws s3 sync` of
the same files, from moto_server on loopback.

One Hugging Face-shaped `checkpoint-N/` (model, optimizer, scheduler, RNG states, trainer_state)
in a working directory; alternated run by run, medians compared:
  collect+push   what rank 0's node does: the Collector's two looks, hard links into `step-N`
                 and one rename, then CheckpointStore.push (the manifest protocol: every file,
                 then MANIFEST.json last), as the node agent runs it;
  sync           `aws s3 sync` of the directory to a prefix (.venv-awscli, the CLI v1 here), what
                 a hand-rolled "sync my output_dir" does, with no completeness rule and no manifest.
Also: bytes copied on the disk by the collection (hard links: none) and its time alone.
moto_server is one Python process, so MiB/s say nothing about S3; the ratios are the result.
"""
from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from checkpoint_push import reset, start_moto  # noqa: E402

AWS = ROOT / ".venv-awscli" / "bin" / "aws"
MiB = 2**20


def hf_checkpoint(root: Path, step: int, model_mib: int) -> int:
    d = root / f"checkpoint-{step}"
    d.mkdir(parents=True)
    sizes = {"model.safetensors": model_mib * MiB, "optimizer.pt": 2 * model_mib * MiB, "scheduler.pt": 1465,
             "rng_state_0.pth": 14_709, "rng_state_1.pth": 14_709, "training_args.bin": 5_713,
             "config.json": 912, "generation_config.json": 119, "trainer_state.json": 1_302}
    for name, size in sizes.items():
        (d / name).write_bytes(os.urandom(size))
    return sum(sizes.values())


def main(model_mib: int = 96, runs: int = 3) -> None:
    import boto3

    from constructs_lib.runtime.framework_checkpoints import Collector
    from constructs_lib.runtime.stream import stream
    from constructs_lib.runtime.store import CheckpointStore

    if not AWS.exists():
        raise SystemExit("needs .venv-awscli (bash scripts/test.sh installs it)")
    proc, url = start_moto()
    work = Path(tempfile.mkdtemp())
    os.environ.update({"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                       "AWS_DEFAULT_REGION": "us-east-1", "DL_RUN_DIR": str(work / "run")})
    try:
        outputs = work / "outputs"
        total = hf_checkpoint(outputs, 100, model_mib)
        times: dict[str, list[float]] = {"push": [], "sync": [], "collect": []}
        copied = []

        def ours() -> None:
            reset(url)
            s3 = boto3.client("s3", endpoint_url=url, region_name="us-east-1")
            s3.create_bucket(Bucket="bench")
            layout = work / "layout"
            shutil.rmtree(layout, ignore_errors=True)
            free = shutil.disk_usage(work).free
            t = time.perf_counter()
            c = Collector(str(outputs), str(layout), local_ranks=range(2), log=lambda m: None)
            c.poll()
            assert c.poll(exited=True) == [100]
            times["collect"].append(time.perf_counter() - t)
            copied.append(max(0, free - shutil.disk_usage(work).free))
            CheckpointStore("bench", "jobs/bench", client=s3).push(str(layout / "step-000000000100"), 100)
            times["push"].append(time.perf_counter() - t)

        def sync() -> None:
            reset(url)
            s3 = boto3.client("s3", endpoint_url=url, region_name="us-east-1")
            s3.create_bucket(Bucket="bench")
            t = time.perf_counter()
            code, _ = stream([str(AWS), "s3", "sync", str(outputs), "s3://bench/jobs/bench/outputs", "--no-progress",
                              "--only-show-errors"], emit=lambda line: None, timeout=600,
                             env={**os.environ, "AWS_CONFIG_FILE": os.devnull})
            assert code == 0
            times["sync"].append(time.perf_counter() - t)

        for i in range(runs):  # alternate the order so neither side always runs first
            for fn in ((ours, sync) if i % 2 == 0 else (sync, ours)):
                fn()
        med = {k: statistics.median(v) for k, v in times.items()}
        mib = total / MiB
        print(f"one HF checkpoint-N/, 9 files, {mib:.0f} MiB, {runs} runs each, medians:")
        print(f"  collect+push {med['push']:6.2f} s  {mib / med['push']:6.0f} MiB/s  (collection alone "
              f"{med['collect'] * 1000:.1f} ms, {max(copied) / MiB:.0f} MiB copied on disk)")
        print(f"  aws s3 sync  {med['sync']:6.2f} s  {mib / med['sync']:6.0f} MiB/s")
        print(f"ratio collect+push / sync: {med['push'] / med['sync']:.2f}")
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    import argparse
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
