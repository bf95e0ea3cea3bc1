"""dl_core.aws against botocore's own errors: a real ClientError from a stubbed client (botocore's
Stubber answers as the service would), connection errors as botocore raises them, and the
backoff's jitter measured over many draws: full jitter spreads the waits over [0, cap]."""
from __future__ import annotations

import random
import statistics
import time

import boto3
import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError
from botocore.stub import Stubber

from dl_core.aws import Backoff, Said, brief, error_code, http_status, jittered, not_found, retry, transient


def _s3_error(code: str, status: int = 400, message: str = "said the service"):
    """The ClientError a real S3 client raises for `code` (its response parsed by botocore)."""
    s3 = boto3.client("s3", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    with Stubber(s3) as stub:
        stub.add_client_error("get_object", service_error_code=code, service_message=message,
                              http_status_code=status)
        with pytest.raises(ClientError) as e:
            s3.get_object(Bucket="b", Key="k")
    return e.value


def test_the_code_and_status_come_from_botocore_s_own_error():
    e = _s3_error("SlowDown", 503)
    assert error_code(e) == "SlowDown" and http_status(e) == 503
    assert brief(e).startswith("SlowDown: An error occurred (SlowDown)")


def test_anything_that_is_not_an_aws_answer_has_no_code():
    for e in (ValueError("x"), EndpointConnectionError(endpoint_url="http://127.0.0.1:9"), KeyError("Error")):
        assert error_code(e) == "" and http_status(e) == 0
    odd = _s3_error("SlowDown")
    odd.response["Error"] = "not a mapping"  # a malformed answer never raises here
    assert error_code(odd) == "" and brief(ValueError("a\n  b")) == "ValueError: a b"


@pytest.mark.parametrize("code", ["NoSuchKey", "NoSuchBucket", "404", "ParameterNotFound", "ResourceNotFoundException",
                                  "InvalidInstanceID.NotFound", "InvalidLaunchTemplateId.NotFound"])
def test_not_found_is_said_by_every_service_s_own_words(code):
    assert not_found(_s3_error(code, 404))


@pytest.mark.parametrize("code", ["AccessDenied", "SlowDown", "InvalidParameterValue"])
def test_denied_or_later_is_not_not_found(code):
    assert not not_found(_s3_error(code))


@pytest.mark.parametrize("code,status", [("SlowDown", 503), ("ThrottlingException", 400), ("RequestLimitExceeded", 503),
                                         ("InternalError", 500), ("Whatever", 502), ("Whatever", 429)])
def test_throttling_and_5xx_are_transient(code, status):
    assert transient(_s3_error(code, status))


def test_wrong_requests_are_not_transient_and_connection_trouble_is():
    assert not transient(_s3_error("AccessDenied", 403)) and not transient(_s3_error("NoSuchKey", 404))
    assert transient(EndpointConnectionError(endpoint_url="http://127.0.0.1:9"))
    assert transient(ReadTimeoutError(endpoint_url="http://127.0.0.1:9")) and not transient(ValueError("x"))


def test_full_jitter_spreads_the_waits_over_zero_to_the_cap():
    """Nodes throttled together must not come back together: not "cap +- a little", but anywhere
    in [0, cap]: the smallest of many draws near 0, the largest near the cap, the mean near half."""
    backoff = Backoff(base=1.0, cap=8.0, rng=random.Random(7))
    for _ in range(10):
        backoff.next()  # past the doubling: every draw is now bounded by the cap
    draws = [backoff.next() for _ in range(4000)]
    assert all(0.0 <= d <= 8.0 for d in draws)
    assert min(draws) < 0.08 and max(draws) > 7.92
    assert 3.7 < statistics.mean(draws) < 4.3
    quarters = [sum(1 for d in draws if q * 2 <= d < (q + 1) * 2) for q in range(4)]
    assert all(850 < n < 1150 for n in quarters), quarters


def test_the_bound_doubles_from_the_base_up_to_the_cap_and_reset_starts_over():
    rng = random.Random(3)
    bounds = []
    for _ in range(300):
        backoff = Backoff(base=0.5, cap=4.0, rng=rng)
        bounds.append([backoff.next() for _ in range(6)])
    for i, cap in enumerate([0.5, 1.0, 2.0, 4.0, 4.0, 4.0]):
        column = [b[i] for b in bounds]
        assert max(column) <= cap and max(column) > 0.9 * cap  # each step reaches its own bound
    backoff = Backoff(base=0.5, cap=4.0, rng=rng)
    [backoff.next() for _ in range(5)]
    backoff.reset()
    assert max(Backoff(base=0.5, cap=4.0, rng=rng).next() for _ in range(200)) <= 0.5
    assert backoff.next() <= 0.5


def test_retry_rides_out_throttling_from_a_real_client_and_returns_the_answer():
    s3 = boto3.client("s3", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    waits: list[float] = []
    told: list[str] = []
    with Stubber(s3) as stub:
        stub.add_client_error("head_bucket", service_error_code="SlowDown", http_status_code=503)
        stub.add_client_error("head_bucket", service_error_code="InternalError", http_status_code=500)
        stub.add_response("head_bucket", {}, {"Bucket": "b"})
        got = retry(lambda: s3.head_bucket(Bucket="b"), attempts=5, backoff=Backoff(1.0, 30.0), sleep=waits.append,
                    on_retry=lambda e, d: told.append(error_code(e)))
        stub.assert_no_pending_responses()
    assert got == {} and told == ["SlowDown", "InternalError"] and len(waits) == 2
    assert 0 <= waits[0] <= 1.0 and 0 <= waits[1] <= 2.0


def test_retry_stops_at_once_on_what_no_retry_fixes_and_after_its_attempts_otherwise():
    denied, slow = _s3_error("AccessDenied", 403), _s3_error("SlowDown", 503)
    calls: list[int] = []

    def fail(e):
        def fn():
            calls.append(1)
            raise e
        return fn
    with pytest.raises(ClientError, match="AccessDenied"):
        retry(fail(denied), attempts=5, sleep=lambda s: None)
    assert len(calls) == 1
    calls.clear()
    with pytest.raises(ClientError, match="SlowDown"):
        retry(fail(slow), attempts=3, sleep=lambda s: None)
    assert len(calls) == 3
    calls.clear()
    with pytest.raises(ClientError):  # a deadline already past: the first error, no wait
        retry(fail(slow), deadline=0.0, sleep=lambda s: pytest.fail("waited past the deadline"))
    assert len(calls) == 1


def test_said_once_per_period_with_how_often_meanwhile(monkeypatch):
    # A node booted 10 s ago: the monotonic clock counts from boot (the first note was once
    # swallowed there, on a CI machine up for 19 minutes).
    now = [10.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    lines: list[str] = []
    said = Said(lines.append, every=3600)
    for _ in range(3):
        said("s3", "S3 throttles")
    said("ec2", "EC2 throttles")
    assert lines == ["S3 throttles", "EC2 throttles"] and said.last["s3"][1] == 2
    now[0] += 3600
    said("s3", "S3 throttles")
    assert lines[-1] == "S3 throttles (3 times since the last note)"


def test_jittered_periods_stay_within_a_quarter():
    rng = random.Random(1)
    draws = [jittered(10.0, rng) for _ in range(2000)]
    assert 7.5 <= min(draws) < 7.6 and 12.4 < max(draws) <= 12.5
