"""Data staging (-c data=) vs a plain download of the same objects, from moto_server on loopback.

Three ways to put one prefix on the disk, alternated run by run, medians compared (a noisy
machine: the ratios are the result):
  stage      constructs_lib.runtime.staging.stage: one listing, the size check, then `aws s3 sync`
             (.venv-awscli, the CLI v1 here; the DLAMI's v2 adds the CRT client) with 64 requests
             at a time, progress lines parsed;
  sync       a plain `aws s3 sync` with the CLI's defaults (10 requests at a time);
  boto3      a loop of boto3's download_file, one object after another (what a hand-written
             downloader does first).
And the restart case: stage again over a complete copy (what a job-unit restart or a reboot
costs: one listing and a sync that fetches nothing).
moto_server is one Python process, so absolute MiB/s here say nothing about S3; the ratios say
what the staging machinery adds or saves over the same server.
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


def main(objects: int = 64, size: int = 4 * MiB, runs: int = 3) -> None:
    import boto3

    from constructs_lib.runtime import staging
    from constructs_lib.runtime.stream import stream

    if not AWS.exists():
        raise SystemExit("needs .venv-awscli (bash scripts/test.sh installs it)")
    proc, url = start_moto()
    work = Path(tempfile.mkdtemp())
    env = {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
           "AWS_DEFAULT_REGION": "us-east-1", "DL_SCRATCH": str(work / "scratch"), "DL_RUN_DIR": str(work / "run"),
           "PATH": f"{AWS.parent}:{os.environ['PATH']}"}
    os.environ.update(env)
    try:
        reset(url)
        s3 = boto3.client("s3", endpoint_url=url, region_name="us-east-1")
        s3.create_bucket(Bucket="bench-data")
        for i in range(objects):
            s3.put_object(Bucket="bench-data", Key=f"train/part-{i:04d}", Body=os.urandom(size))
        total = objects * size
        times: dict[str, list[float]] = {"stage": [], "sync": [], "boto3": [], "restage": []}
        for _ in range(runs):
            shutil.rmtree(work / "scratch", ignore_errors=True)
            (work / "scratch").mkdir(parents=True)
            t = time.perf_counter()
            staging.stage([("bench-data", "train/")], s3=s3, emit=lambda line: None, run=stream)
            times["stage"].append(time.perf_counter() - t)
            t = time.perf_counter()
            staging.stage([("bench-data", "train/")], s3=s3, emit=lambda line: None, run=stream)
            times["restage"].append(time.perf_counter() - t)

            dest = work / "sync"
            shutil.rmtree(dest, ignore_errors=True)
            t = time.perf_counter()
            code, _ = stream([str(AWS), "s3", "sync", "s3://bench-data/train", str(dest), "--no-progress",
                              "--only-show-errors"], emit=lambda line: None, timeout=600,
                             env={**os.environ, "AWS_CONFIG_FILE": os.devnull})
            assert code == 0
            times["sync"].append(time.perf_counter() - t)

            dest = work / "boto3"
            shutil.rmtree(dest, ignore_errors=True)
            dest.mkdir()
            t = time.perf_counter()
            for i in range(objects):
                s3.download_file("bench-data", f"train/part-{i:04d}", str(dest / f"part-{i:04d}"))
            times["boto3"].append(time.perf_counter() - t)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"{objects} objects x {size // MiB} MiB = {total // MiB} MiB, {runs} runs each, medians:")
        for k in ("stage", "sync", "boto3"):
            print(f"  {k:<6} {med[k]:6.2f} s  {total / MiB / med[k]:7.0f} MiB/s")
        print(f"  restage over a complete copy: {med['restage']:.2f} s (nothing fetched)")
        print(f"ratios: stage/sync {med['stage'] / med['sync']:.2f}, stage/boto3 loop {med['stage'] / med['boto3']:.2f}, "
              f"restage/stage {med['restage'] / med['stage']:.2f}")
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    import argparse
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
