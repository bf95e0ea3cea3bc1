"""The node's runner, run for real as a subprocess against moto_server on 127.0.0.1: results land
where `bench collect` looks, a hung command is killed with everything it started, a failing S3
is retried, and collect turns each case into a measurement or a reason."""
from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from dl_selector.bench import runner
from dl_selector.bench.collect import judge
from dl_core.benchline import parse_output
from dl_selector.bench.contract import result_key, started_key

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
    return subprocess.run([sys.executable, "-m", "dl_selector.bench.runner", "--bucket", BUCKET, "--prefix", PREFIX,
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


def _gone(pid: int, wait: float = 5.0) -> bool:
    """No such process, or only its zombie: once its parent bash is killed the child belongs to
    PID 1, which in a container may reap it late (a zombie runs nothing and holds no GPU)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            with open(f"/proc/{pid}/status") as f:
                state = next((x.split()[1] for x in f if x.startswith("State:")), "")
        except FileNotFoundError:
            return True
        if state == "Z":
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


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
    assert _run(moto_url, "g6.xlarge", "echo CUDA error: out of memory >&2; exit 1").returncode == 0
    text = _get(moto_url, result_key(PREFIX, "g6.xlarge"))
    assert json.loads(text)["exit_code"] == 1 and json.loads(text)["reason"] == ""
    outcome = judge("g6.xlarge", 20, text, None, "s3://x")
    assert "exited 1" in outcome.reason and "out of memory" in outcome.reason
    # Not found: it never started, so no exit code, and the reason names it.
    assert _run(moto_url, "g6e.xlarge", "CUDA_VISIBLE_DEVICES=0 no-such-benchmark --fast").returncode == 0
    result = json.loads(_get(moto_url, result_key(PREFIX, "g6e.xlarge")))
    assert result["exit_code"] is None and result["timed_out"] is False
    assert "could not start" in result["reason"] and "no-such-benchmark: command not found" in result["reason"]
    outcome = judge("g6e.xlarge", 20, json.dumps(result), None, "s3://x")
    assert outcome.measurement is None and "command not found" in outcome.reason
    # A 127 from inside the command (not its first word) is the command's own exit.
    assert runner.not_found("bash run.sh", 127, "bash: line 3: helper: command not found") is None
    assert runner.not_found("python3 x.py", 0, "bash: line 1: python3: command not found") is None


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
    assert _gone(child)
    result = json.loads(_get(moto_url, result_key(PREFIX, "g4dn.xlarge")))
    assert result["timed_out"] is True
    outcome = judge("g4dn.xlarge", 20, json.dumps(result), None, "s3://x")
    assert outcome.measurement is None and "20-minute limit" in outcome.reason  # a partial figure is no figure


def test_a_sigterm_to_the_runner_kills_the_command_and_still_uploads(moto_url, tmp_path):
    """What a spot interruption or the shutdown backstop does: systemd sends the runner SIGTERM."""
    pids = tmp_path / "pids"
    env = {**os.environ, "AWS_ENDPOINT_URL": moto_url}
    proc = subprocess.Popen([sys.executable, "-m", "dl_selector.bench.runner", "--bucket", BUCKET, "--prefix", PREFIX,
                             "--instance-type", "g6.2xlarge", "--minutes", "20", "--region", "us-east-1",
                             "--no-shutdown", "--kill-grace", "1", "--",
                             f"echo dl-bench samples_per_second=7 window=1; sleep 300 & echo $! > {pids}; wait"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while not (pids.exists() and pids.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(pids.read_text())
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert _gone(child)
    result = json.loads(_get(moto_url, result_key(PREFIX, "g6.2xlarge")))
    assert result["exit_code"] is None and result["timed_out"] is False
    assert result["reason"].startswith("interrupted: the runner got SIGTERM")
    assert "samples_per_second=7" in result["output_tail"]


def test_an_unreachable_bucket_fails_the_runner_after_retries(moto_url):
    r = _run(moto_url, "g5.2xlarge", "echo hi", timeout=90)  # bucket exists: sanity
    assert r.returncode == 0
    env_bucket = ["--bucket", "no-such-bucket"]
    r2 = subprocess.run([sys.executable, "-m", "dl_selector.bench.runner", *env_bucket, "--prefix", PREFIX,
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

    with open(os.devnull, "w") as log:
        assert runner.put_with_retry(flaky, "k", b"x", log=log, delay=0)
        assert len(calls) == 3
        assert not runner.put_with_retry(lambda k, b: (_ for _ in ()).throw(OSError("down")), "k", b"x", log=log,
                                         attempts=2, delay=0)


# ---- in-process against moto (the `aws` fixture): S3 faults and the runner's own crash ------------

def _in_process(monkeypatch, fail_first: int = 0, *argv: str) -> tuple[list[str], int]:
    import boto3
    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket=BUCKET)
    attempts: list[str] = []
    real = runner.s3_put

    def flaky_s3_put(bucket, region):
        put = real(bucket, region)

        def wrapped(key: str, body: bytes) -> None:
            attempts.append(key)
            if len(attempts) <= fail_first:
                raise ConnectionError("Connection was closed before we received a valid response")
            put(key, body)
        return wrapped

    monkeypatch.setattr(runner, "s3_put", flaky_s3_put)
    code = runner.main(["--bucket", BUCKET, "--prefix", PREFIX, "--instance-type", "g5.xlarge", "--minutes", "20",
                        "--market", "spot", "--region", "us-east-1", "--no-shutdown", "--retry-delay", "0.01",
                        *argv, "--", "echo dl-bench samples_per_second=42 window=1"])
    return attempts, code


def _s3_json(key: str) -> dict:
    import boto3
    body = boto3.client("s3", region_name="us-east-1").get_object(Bucket=BUCKET, Key=key)["Body"].read()
    return json.loads(body)


def test_s3_failing_on_the_first_put_is_retried(aws, monkeypatch, capsys):
    attempts, code = _in_process(monkeypatch, 1)
    assert code == 0
    started, result = started_key(PREFIX, "g5.xlarge"), result_key(PREFIX, "g5.xlarge")
    assert attempts == [started, started, result]  # the first put failed, the retry and the result went up
    assert "failed (1/5)" in capsys.readouterr().err
    assert _s3_json(started)["command"] == "echo dl-bench samples_per_second=42 window=1"
    windows, problems = parse_output(_s3_json(result)["output_tail"])
    assert [w.samples_per_second for w in windows] == [42.0] and not problems


def test_a_runner_crash_still_uploads_a_result_with_the_reason(aws, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("pipe exploded")

    monkeypatch.setattr(runner, "run_command", broken)
    _, code = _in_process(monkeypatch)
    assert code == 0
    result = _s3_json(result_key(PREFIX, "g5.xlarge"))
    assert result["exit_code"] is None and result["reason"] == "runner error: RuntimeError: pipe exploded"
    assert "runner error" in judge("g5.xlarge", 20, json.dumps(result), None, "s3://x").reason


class _FakeImds(http.server.BaseHTTPRequestHandler):
    def do_PUT(self):  # the handler's API names it
        self._answer("token-1" if self.path == "/latest/api/token" else None)

    def do_GET(self):
        ok = self.headers.get("X-aws-ec2-metadata-token") == "token-1"
        self._answer({"/latest/meta-data/instance-id": "i-0123456789abcdef0",
                      "/latest/meta-data/placement/availability-zone": "us-east-1b"}.get(self.path) if ok else None)

    def _answer(self, text):
        self.send_response(200 if text else 401)
        self.end_headers()
        self.wfile.write((text or "").encode())

    def log_message(self, *args):
        pass


def test_instance_identity_comes_from_imdsv2_and_its_absence_is_tolerated(monkeypatch):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeImds)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.delenv("AWS_EC2_METADATA_DISABLED", raising=False)
        monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
        assert runner.instance_identity() == ("i-0123456789abcdef0", "us-east-1b")
        monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://127.0.0.1:9")  # nothing listens
        t0 = time.monotonic()
        assert runner.instance_identity(timeout=0.5) == ("", "")
        assert time.monotonic() - t0 < 5
    finally:
        server.shutdown()


def test_tail_keeps_the_last_bytes():
    t = runner.Tail(limit=10)
    for i in range(100):
        t.add(f"{i:03d}\n".encode())
    assert t.text() == "7\n098\n099\n"
    assert len(t.text().encode()) == 10
