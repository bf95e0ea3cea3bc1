"""The node's IMDS client against the IMDSv2 stand-in: a slow or throttling IMDS is asked again
with backoff (a busy node once stopped its job for good with "not a dl-launcher node"), while a
refused connection (off EC2) fails at once. The CLI test runs the real job entry point."""
from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
from pathlib import Path

import pytest

from constructs_lib.runtime import contract
from constructs_lib.runtime.errors import ImdsUnavailable
from constructs_lib.runtime.imds import Imds

ROOT = Path(__file__).resolve().parents[2]


def _client(imds, attempts: int = 3):
    waits: list[float] = []
    return Imds(imds.endpoint, timeout=0.3, attempts=attempts, backoff=0.5, sleep=waits.append), waits


def _jittered(waits: list[float], caps: list[float]) -> bool:
    """Full jitter: each wait lies in [0, its doubling cap]."""
    return len(waits) == len(caps) and all(0 <= w <= c for w, c in zip(waits, caps))


def test_a_stalled_then_throttled_token_request_is_asked_again_with_doubling_waits(imds):
    client, waits = _client(imds)
    imds.faults = [("stall", 1.0), ("status", 429)]
    assert client.instance_id() == imds.instance_id
    assert _jittered(waits, [0.5, 1.0]), waits
    assert [r for r in imds.requests if r.startswith("PUT")] == ["PUT /latest/api/token"] * 3


def test_a_metadata_read_that_meets_5xx_is_asked_again_with_the_same_token(imds):
    client, waits = _client(imds)
    client.instance_id()
    imds.faults = [("status", 503), ("status", 500)]
    assert client.get("meta-data/local-ipv4") == imds.local_ipv4
    assert _jittered(waits, [0.5, 1.0]) and sum(r.startswith("PUT") for r in imds.requests) == 1


def test_tries_are_bounded_and_the_error_says_how_many_and_the_last_cause(imds):
    client, waits = _client(imds)
    imds.faults = [("status", 429)] * 3
    with pytest.raises(ImdsUnavailable, match=r"did not answer a token in 3 tries of 0.3 s \(last: HTTP 429 Too Many Requests\)"):
        client.instance_id()
    assert _jittered(waits, [0.5, 1.0]), waits


def test_waits_double_up_to_four_seconds_and_no_further(imds):
    client, waits = _client(imds, attempts=6)
    imds.faults = [("status", 503)] * 5
    assert client.instance_id() == imds.instance_id
    assert _jittered(waits, [0.5, 1.0, 2.0, 4.0, 4.0]), waits


def test_nothing_listening_is_off_ec2_and_is_not_retried():
    waits: list[float] = []
    client = Imds("http://127.0.0.1:9", timeout=0.3, attempts=6, sleep=waits.append)
    with pytest.raises(urllib.error.URLError) as e:
        client.instance_id()
    assert not isinstance(e.value, ImdsUnavailable) and waits == []


def test_404_is_nothing_there_and_is_not_retried(imds):
    client, waits = _client(imds)
    assert client.spot_action() is None and waits == []


def test_a_job_unit_on_a_throttled_node_exits_1_to_be_restarted_not_2_which_stops_the_job(imds, tmp_path):
    imds.faults = [("status", 429)] * 6
    env = {k: v for k, v in os.environ.items() if not k.startswith("DL_CHECKPOINT_")}
    env.update({"DL_IMDS_ENDPOINT": imds.endpoint, "DL_RETRY_BASE_SECONDS": "0.01", "DL_CLUSTER": "dl-x",
                "DL_NODES": "1", "DL_CHECKPOINT_DIR": str(tmp_path / "ck"), "AWS_REGION": "us-east-1"})
    r = subprocess.run([sys.executable, "-m", "constructs_lib.runtime", "job", "--bucket", "ckpt-test", "--prefix", "jobs/x"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.returncode not in contract.NO_RESTART_EXITS, (r.returncode, r.stderr)
    assert r.stderr.count("\n") == 1 and "did not answer a token in 6 tries" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def _node_env(imds, tmp_path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DL_CHECKPOINT_", "AWS_"))}
    env.update({"DL_IMDS_ENDPOINT": imds.endpoint, "DL_RETRY_BASE_SECONDS": "0.01", "DL_CLUSTER": "dl-x",
                "DL_NODES": "1", "DL_CHECKPOINT_DIR": str(tmp_path / "ck"), "AWS_REGION": "us-east-1",
                "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_MAX_ATTEMPTS": "1", **extra})
    return env


def _runtime(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "constructs_lib.runtime", *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_an_unreachable_endpoint_restarts_the_job_unit_but_is_a_usage_error_for_a_person(imds, tmp_path):
    b = ["--bucket", "ckpt-test", "--prefix", "jobs/x"]
    etc = Path(os.environ["DL_ETC_DIR"])  # the node's directories under tmp_path (conftest)
    etc.mkdir(parents=True)
    (etc / "job.sh").write_text("true\n")
    job = _runtime(["job", *b], _node_env(imds, tmp_path))
    assert job.returncode == 1, (job.returncode, job.stderr)
    assert "EndpointConnectionError" in job.stderr and "starts again shortly" in job.stderr, job.stderr
    person = _runtime(["checkpoint", "list", *b], _node_env(imds, tmp_path))
    assert person.returncode == contract.EXIT_USAGE and person.stderr.startswith("error: cannot reach AWS")
    assert "Traceback" not in job.stderr + person.stderr
