"""The node's runner, run for real as a subprocess against moto_server on 127.0.0.1: results land
where `bench collect` looks, a hung command is killed with everything it started, a failing S3
is retried, and collect turns each case into a measurement or a reason."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from selector.bench import runner
from selector.bench.collect import judge
from selector.bench.contract import parse_output, result_key, started_key

BUCKET = "bench-results"
PREFIX = "bench/t"


@pytest.fixture(scope="module")
def moto_url():
    from moto.server import ThreadedMotoServer
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    import boto3
    boto3.client("s3", region_name="us-east-1", endpoint_url=url).create_bucket(Bucket=BUCKET)
    yield url
    server.stop()


def _run(moto_url, instance_type: str, command: str, *extra: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "AWS_ENDPOINT_URL": moto_url, "AWS_EC2_METADATA_SERVICE_ENDPOINT": "http://127.0.0.1:9"}
    return subprocess.run([sys.executable, "-m", "selector.bench.runner", "--bucket", BUCKET, "--prefix", PREFIX,
                           "--instance-type", instance_type, "--minutes", "20", "--market", "spot", "--region",
                           "us-east-1", "--no-shutdown", *extra, "--", command],
                          env=env, capture_output=True, timeout=timeout, check=False)


def _get(moto_url, key: str) -> str | None:
    import boto3
    s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=moto_url)
    try:
        return s3.get_object(Bucket=BUCKET, Key=key)["Body"].read().decode()
    except s3.exceptions.NoSuchKey:
        return None


def test_a_good_run_uploads_started_and_result_and_collect_measures_it(moto_url):
    command = "echo warming up; for i in 1 2 3; do echo dl-bench samples_per_second=$((100 + i)) window=$i; done"
    r = _run(moto_url, "g5.xlarge", command)
    assert r.returncode == 0, r.stderr
    assert b"dl-bench samples_per_second=101" in r.stdout  # echoed for the journal and console
    started = json.loads(_get(moto_url, started_key(PREFIX, "g5.xlarge")))
    assert started["command"] == command
    text = _get(moto_url, result_key(PREFIX, "g5.xlarge"))
    result = json.loads(text)
    assert result["exit_code"] == 0 and result["timed_out"] is False and result["market"] == "spot"
    windows, problems = parse_output(result["output_tail"])
    assert [w.samples_per_second for w in windows] == [101.0, 102.0, 103.0] and not problems
    outcome = judge("g5.xlarge", 20, text, None, "s3://x")
    assert outcome.measurement["samples_per_second"] == 102.0


def test_a_failing_command_and_a_missing_one_are_reported_with_their_output(moto_url):
    assert _run(moto_url, "g6.xlarge", "echo CUDA error: out of memory >&2; exit 3").returncode == 0
    outcome = judge("g6.xlarge", 20, _get(moto_url, result_key(PREFIX, "g6.xlarge")), None, "s3://x")
    assert "exited 3" in outcome.reason and "out of memory" in outcome.reason
    assert _run(moto_url, "g6e.xlarge", "no-such-benchmark --fast").returncode == 0
    outcome = judge("g6e.xlarge", 20, _get(moto_url, result_key(PREFIX, "g6e.xlarge")), None, "s3://x")
    assert "exited 127" in outcome.reason and "command not found" in outcome.reason


def test_a_hung_command_is_killed_with_its_whole_process_group(moto_url, tmp_path):
    pids = tmp_path / "pids"
    # A child in the background, and a parent that ignores SIGTERM: only a group SIGKILL ends both.
    command = (f"sleep 300 & echo $! > {pids}; trap '' TERM; echo dl-bench samples_per_second=5 window=1; "
               "sleep 300 & wait")
    t0 = time.monotonic()
    r = _run(moto_url, "g4dn.xlarge", command, "--limit-seconds", "2", "--kill-grace", "1")
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - t0 < 30
    child = int(pids.read_text())
    time.sleep(0.2)
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)
    result = json.loads(_get(moto_url, result_key(PREFIX, "g4dn.xlarge")))
    assert result["timed_out"] is True
    outcome = judge("g4dn.xlarge", 20, json.dumps(result), None, "s3://x")
    assert outcome.measurement is None and "20-minute limit" in outcome.reason  # a partial figure is no figure


def test_an_unreachable_bucket_fails_the_runner_after_retries(moto_url):
    r = _run(moto_url, "g5.2xlarge", "echo hi", timeout=90)  # bucket exists: sanity
    assert r.returncode == 0
    env_bucket = ["--bucket", "no-such-bucket"]
    r2 = subprocess.run([sys.executable, "-m", "selector.bench.runner", *env_bucket, "--prefix", PREFIX,
                         "--instance-type", "g5.4xlarge", "--minutes", "20", "--region", "us-east-1",
                         "--no-shutdown", "--retry-delay", "0.01", "--", "echo hi"],
                        env={**os.environ, "AWS_ENDPOINT_URL": moto_url}, capture_output=True, timeout=120,
                        check=False)
    assert r2.returncode == 1 and b"NOT uploaded" in r2.stderr and b"(5/5)" in r2.stderr


def test_put_with_retry_survives_transient_errors():
    calls = []

    def flaky(key: str, body: bytes) -> None:
        calls.append(key)
        if len(calls) < 3:
            raise ConnectionError("reset by peer")

    log = open(os.devnull, "w")
    assert runner.put_with_retry(flaky, "k", b"x", log=log, delay=0)
    assert len(calls) == 3
    assert not runner.put_with_retry(lambda k, b: (_ for _ in ()).throw(OSError("down")), "k", b"x", log=log,
                                     attempts=2, delay=0)


def test_tail_keeps_the_last_bytes():
    t = runner.Tail(limit=10)
    for i in range(100):
        t.add(f"{i:03d}\n".encode())
    assert t.text() == "7\n098\n099\n"
    assert len(t.text().encode()) == 10
