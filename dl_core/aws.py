"""One way to talk to AWS for node, controller and CLI code: what an error says (its code, "not
found", "try again later") and how to try again (full-jitter backoff, `retry`).

AWS errors a node rides out instead of dying on: throttling, 5xx and timeouts.

Throttling is account-wide and regional: when EC2 or S3 throttles one node of a 512-node cluster
it throttles all of them at once, so a supervisor that exits on it stops every run together.
Everything here backs off with full jitter (the AWS Architecture Blog's "Exponential Backoff And
Jitter"): nodes that were throttled together do not come back together.
"""
from __future__ import annotations

import os
import random
import time
from typing import Callable, Optional, TypeVar

T = TypeVar("T")

# Error codes of EC2 (RequestLimitExceeded), S3 (SlowDown, 503 ServiceUnavailable, InternalError,
# RequestTimeout) and the JSON services (Throttling, ThrottlingException, ...).
TRANSIENT_CODES = frozenset({
    "Throttling", "ThrottlingException", "ThrottledException", "RequestLimitExceeded", "RequestThrottled",
    "RequestThrottledException", "TooManyRequestsException", "SlowDown", "RequestTimeout", "RequestTimeoutException",
    "ServiceUnavailable", "InternalError", "InternalFailure", "Unavailable", "EC2ThrottledException",
    "PriorRequestNotComplete", "500", "502", "503", "504"})


def error_code(e: BaseException) -> str:
    """The AWS error code of a botocore ClientError ("SlowDown", "NoSuchKey", ...); "" for anything else."""
    response = getattr(e, "response", None)
    if not isinstance(response, dict):
        return ""
    error = response.get("Error")
    return str(error.get("Code") or "") if isinstance(error, dict) else ""


def http_status(e: BaseException) -> int:
    """The HTTP status of a ClientError's answer; 0 when there was none."""
    response = getattr(e, "response", None)
    meta = response.get("ResponseMetadata") if isinstance(response, dict) else None
    try:
        return int(meta.get("HTTPStatusCode") or 0) if isinstance(meta, dict) else 0
    except (TypeError, ValueError):
        return 0


# "This does not exist" in S3 (NoSuchKey, NoSuchBucket, a HEAD's bare 404), SSM, Secrets Manager,
# EC2 (InvalidInstanceID.NotFound, InvalidLaunchTemplateId.NotFound, ...) and CloudFormation.
NOT_FOUND_CODES = frozenset({"NoSuchKey", "NoSuchBucket", "NoSuchUpload", "NotFound", "404", "ParameterNotFound",
                             "ResourceNotFoundException", "NoSuchEntity"})


def not_found(e: BaseException) -> bool:
    """Whether `e` says the thing asked about does not exist (as opposed to "not allowed" or "later")."""
    code = error_code(e)
    return bool(code) and (code in NOT_FOUND_CODES or code.endswith(".NotFound") or code.endswith("NotFoundException"))


def brief(e: BaseException) -> str:
    """One line for a log: the error code (or the exception's type) and the start of its message."""
    return f"{error_code(e) or type(e).__name__}: {' '.join(str(e).split())[:160]}"


def transient(e: BaseException) -> bool:
    """Whether `e` says "try again later" rather than "this is wrong"."""
    try:
        from botocore.exceptions import (ClientError, ConnectionClosedError, ConnectTimeoutError,
                                         EndpointConnectionError, ReadTimeoutError)
    except ImportError:  # pragma: no cover - botocore is on every node
        return False
    if isinstance(e, (EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError, ConnectionClosedError)):
        return True
    if isinstance(e, ClientError):
        return error_code(e) in TRANSIENT_CODES or http_status(e) in (429, 500, 502, 503, 504)
    return isinstance(e, (ConnectionError, TimeoutError))


def retries(mode: str, attempts: int) -> dict:
    """botocore's retry settings for a node's client: `attempts` tries, unless the environment
    sets botocore's own AWS_MAX_ATTEMPTS, which an explicit Config would otherwise override."""
    return {"mode": mode, "max_attempts": int(os.environ.get("AWS_MAX_ATTEMPTS") or attempts)}


class Backoff:
    """Full-jitter exponential backoff: a delay in [0, min(cap, base * 2**n)]."""

    def __init__(self, base: float = 1.0, cap: float = 60.0, rng: Optional[random.Random] = None) -> None:
        self.base, self.cap, self.n = base, cap, 0
        self.rng = rng or random.Random()

    def next(self) -> float:
        delay = self.rng.uniform(0, min(self.cap, self.base * 2 ** self.n))
        self.n = min(self.n + 1, 30)
        return delay

    def reset(self) -> None:
        self.n = 0


def retry(fn: Callable[[], T], *, attempts: Optional[int] = None, deadline: Optional[float] = None,
          backoff: Optional[Backoff] = None, retryable: Callable[[BaseException], bool] = transient,
          on_retry: Optional[Callable[[BaseException, float], None]] = None,
          sleep: Callable[[float], None] = time.sleep) -> T:
    """fn(), tried again after a full-jitter backoff while it raises what `retryable` accepts
    (transient AWS trouble by default); anything else, or the last try's error, propagates.
    `attempts` bounds the tries and `deadline` (time.monotonic()) the time; with neither it tries
    until fn succeeds (what a node does between generations: exiting would stop every run)."""
    backoff = backoff or Backoff()
    tried = 0
    while True:
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - only the retryable ones are retried
            tried += 1
            if not retryable(e) or (attempts is not None and tried >= attempts):
                raise
            delay = backoff.next()
            if deadline is not None and time.monotonic() + delay > deadline:
                raise
            if on_retry is not None:
                on_retry(e, delay)
            sleep(delay)


class Said:
    """One log line per `every` seconds for the same kind of trouble, with how often it happened."""

    def __init__(self, log: Callable[[str], None], every: float = 60.0) -> None:
        self.log, self.every = log, every
        self.last: dict[str, tuple[Optional[float], int]] = {}

    def __call__(self, kind: str, line: str) -> None:
        # The first of a kind is always said: the monotonic clock counts from boot, so on a node
        # up for less than `every` seconds "since 0" would swallow it.
        at, count = self.last.get(kind, (None, 0))
        if at is None or time.monotonic() - at >= self.every:
            self.log(line + (f" ({count + 1} times since the last note)" if count else ""))
            self.last[kind] = (time.monotonic(), 0)
        else:
            self.last[kind] = (at, count + 1)


def jittered(seconds: float, rng: random.Random = random.Random()) -> float:
    """A poll period spread by +-25%: a cluster's nodes do not poll in lockstep."""
    return seconds * rng.uniform(0.75, 1.25)
