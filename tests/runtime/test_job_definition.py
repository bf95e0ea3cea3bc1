"""How a node reads its job's pieces from AWS (job_definition.read_retrying) and restores a
checkpoint (resume.with_retries): throttling from a real botocore client (Stubber) is ridden out
after full-jitter waits within the old bounds; what no retry fixes stops at once; the tries are
bounded, and the end is one JobError that names what was read and AWS's code."""
from __future__ import annotations

import boto3
import pytest
from botocore.stub import Stubber

from constructs_lib.runtime import job_definition, resume
from constructs_lib.runtime.errors import RuntimeUserError
from constructs_lib.runtime.job_definition import JobError, read_retrying


@pytest.fixture
def ssm():
    client = boto3.client("ssm", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    with Stubber(client) as stub:
        yield client, stub


@pytest.fixture
def waits():
    return []


def _get(client):
    return lambda: client.get_parameter(Name="/job/rev")["Parameter"]["Value"]


def test_a_throttled_parameter_is_read_after_jittered_waits(ssm, waits):
    client, stub = ssm
    for _ in range(2):
        stub.add_client_error("get_parameter", service_error_code="ThrottlingException", http_status_code=400)
    stub.add_response("get_parameter", {"Parameter": {"Name": "/job/rev", "Value": "v1"}}, {"Name": "/job/rev"})
    said: list[str] = []
    assert read_retrying("job parameter /job/rev", _get(client), log=said.append, base=2.0, sleep=waits.append) == "v1"
    assert len(waits) == 2 and 0 <= waits[0] <= 2.0 and 0 <= waits[1] <= 4.0
    assert all(line.startswith("job parameter /job/rev: ThrottlingException; retrying in ") for line in said)


@pytest.mark.parametrize("code", sorted(job_definition.FINAL_CODES - {"404", "403"}))
def test_what_no_retry_fixes_is_one_try_and_one_error(ssm, waits, code):
    client, stub = ssm
    stub.add_client_error("get_parameter", service_error_code=code, http_status_code=400)
    with pytest.raises(JobError, match=rf"^job parameter /job/rev: {code}: "):
        read_retrying("job parameter /job/rev", _get(client), log=print, sleep=waits.append)
    assert waits == []
    stub.assert_no_pending_responses()


def test_the_tries_are_bounded_and_the_waits_capped(ssm, waits):
    client, stub = ssm
    for _ in range(7):
        stub.add_client_error("get_parameter", service_error_code="InternalServerError", http_status_code=500)
    with pytest.raises(JobError, match="InternalServerError"):
        read_retrying("job parameter /job/rev", _get(client), log=lambda line: None, attempts=7, base=8.0, sleep=waits.append)
    assert len(waits) == 6 and all(0 <= w <= 30.0 for w in waits)  # 8, 16, then the 30 s cap


def test_an_error_without_an_aws_code_is_retried_and_named_by_its_type(waits):
    calls: list[int] = []

    def broken():
        calls.append(1)
        raise ConnectionResetError("reset by peer")
    with pytest.raises(JobError, match="^code s3://b/k: ConnectionResetError: reset by peer"):
        read_retrying("code s3://b/k", broken, log=lambda line: None, attempts=3, sleep=waits.append)
    assert len(calls) == 3


def test_a_restore_retries_s3_trouble_but_never_a_user_error():
    slept: list[float] = []
    said: list[str] = []
    tries: list[int] = []

    def flaky():
        tries.append(1)
        if len(tries) < 4:
            raise OSError("S3 unreachable")
        return "restored"
    assert resume.with_retries(flaky, "restoring step 3", base=1.0, cap=2.0, log=said.append, sleep=slept.append) == "restored"
    assert len(slept) == 3 and all(0 <= w <= c for w, c in zip(slept, [1.0, 2.0, 2.0]))
    assert said[0].startswith("restoring step 3 failed (OSError: S3 unreachable); retry 1/7 in ")
    tries.clear()

    def wrong():
        tries.append(1)
        raise RuntimeUserError("bad bucket")
    with pytest.raises(RuntimeUserError):
        resume.with_retries(wrong, "restoring", sleep=slept.append)
    assert len(tries) == 1
