"""moto_server on 127.0.0.1 (real HTTP, real boto3 transfers), a fake IMDS, and a bucket."""
from __future__ import annotations

import os
import urllib.request

import pytest

from tests.runtime.fake_imds import FakeImds


@pytest.fixture(autouse=True)
def node_dirs(tmp_path, monkeypatch):
    """Each test its own node: the contract's directories under tmp_path."""
    dirs = {}
    for var in ("DL_ETC_DIR", "DL_RUN_DIR", "DL_SCRATCH", "DL_LOG_DIR"):
        dirs[var] = tmp_path / "node" / var.lower()
        monkeypatch.setenv(var, str(dirs[var]))
    for var in ("DL_CHECKPOINT_DIR", "DL_RESUME_FROM", "DL_RESUME_STEP", "DL_GENERATION", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    return dirs


@pytest.fixture(scope="session")
def moto_endpoint():
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3env(moto_endpoint, monkeypatch):
    """Environment pointing boto3 (in this process and in subprocesses) at moto_server."""
    urllib.request.urlopen(urllib.request.Request(f"{moto_endpoint}/moto-api/reset", method="POST")).read()
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    return {**os.environ, "AWS_ENDPOINT_URL": moto_endpoint, "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture
def bucket(s3env):
    import boto3

    boto3.client("s3").create_bucket(Bucket="ckpt-test")
    return "ckpt-test"


@pytest.fixture
def store(bucket):
    from constructs_lib.runtime.store import CheckpointStore

    return CheckpointStore(bucket, "jobs/test", concurrency=8, part_size=5 * 1024 * 1024)


@pytest.fixture
def imds():
    fake = FakeImds().start()
    yield fake
    fake.stop()


@pytest.fixture
def moto_process(tmp_path):
    """moto_server in its own process, for the drill (see tests/runtime/drill.py)."""
    import subprocess

    from tests.runtime.drill import start_moto_server

    server, endpoint = start_moto_server(tmp_path / "moto_server.log")
    yield endpoint
    server.terminate()
    try:
        server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.kill()
