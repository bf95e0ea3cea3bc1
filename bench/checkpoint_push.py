"""Checkpoint push vs boto3's own upload_file of the same bytes, to moto_server on loopback.

moto_server runs as its own process on 127.0.0.1; runs alternate between the two methods and
the medians are compared (noisy machine: the ratio is the result). Goal: push at least as fast,
i.e. ratio push/upload_file <= 1.0, although push also hashes every byte (SHA-256) and writes
a manifest.
"""
from __future__ import annotations

import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MiB = 1024 * 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_moto() -> tuple[subprocess.Popen, str]:
    port = free_port()
    exe = Path(sys.executable).parent / "moto_server"
    proc = subprocess.Popen([str(exe), "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            urllib.request.urlopen(f"{url}/moto-api/", timeout=0.5)
            return proc, url
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("moto_server did not start")


def reset(url: str) -> None:
    urllib.request.urlopen(urllib.request.Request(f"{url}/moto-api/reset", method="POST")).read()


def scenario(name: str, sizes: list[int], url: str, runs: int) -> None:
    import boto3
    import botocore.config
    from constructs_lib.runtime.store import CheckpointStore

    work = Path(tempfile.mkdtemp())
    ckpt = work / "step-000000000001"
    ckpt.mkdir()
    for i, size in enumerate(sizes):
        (ckpt / f"shard-{i}.bin").write_bytes(os.urandom(size))
    files = sorted(ckpt.iterdir())
    base, push = [], []

    def fresh_client():
        reset(url)  # every measurement starts from an empty moto_server
        s3 = boto3.client("s3", endpoint_url=url, region_name="us-east-1",
                          config=botocore.config.Config(max_pool_connections=32))
        s3.create_bucket(Bucket="bench")
        return s3

    def plain():
        s3 = fresh_client()
        t = time.perf_counter()
        for f in files:  # what a script would do: boto3's managed transfer, one file after another
            s3.upload_file(str(f), "bench", f"plain/{f.name}")
        base.append(time.perf_counter() - t)

    def ours():
        store = CheckpointStore("bench", "jobs/bench", client=fresh_client())
        t = time.perf_counter()
        store.push(str(ckpt), 1)
        push.append(time.perf_counter() - t)

    for i in range(runs):  # alternate the order so neither side always runs first
        for fn in ((plain, ours) if i % 2 == 0 else (ours, plain)):
            fn()
    shutil.rmtree(work)
    total = sum(sizes) / MiB
    b, p = statistics.median(base), statistics.median(push)
    print(f"{name}: {len(sizes)} file(s), {total:.0f} MiB: upload_file {b:.2f} s ({total / b:.0f} MiB/s), "
          f"push {p:.2f} s ({total / p:.0f} MiB/s), ratio push/upload_file {p / b:.2f}  [goal <= 1.0]")


if __name__ == "__main__":
    import argparse
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    os.environ.pop("AWS_ENDPOINT_URL", None)
    runs = int(os.environ.get("RUNS", "5"))
    proc, url = start_moto()
    try:
        scenario("one large file", [256 * MiB], url, runs)
        scenario("sharded", [32 * MiB] * 8, url, runs)
    finally:
        proc.terminate()
        proc.wait()
