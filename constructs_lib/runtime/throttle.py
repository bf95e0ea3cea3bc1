"""AWS errors a node rides out instead of dying on: throttling, 5xx and timeouts.

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
        code = str(e.response.get("Error", {}).get("Code", ""))
        status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        return code in TRANSIENT_CODES or status in (429, 500, 502, 503, 504)
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


class Said:
    """One log line per `every` seconds for the same kind of trouble, with how often it happened."""

    def __init__(self, log: Callable[[str], None], every: float = 60.0) -> None:
        self.log, self.every = log, every
        self.last: dict[str, tuple[float, int]] = {}

    def __call__(self, kind: str, line: str) -> None:
        at, count = self.last.get(kind, (0.0, 0))
        if time.monotonic() - at >= self.every:
            self.log(line + (f" ({count + 1} times since the last note)" if count else ""))
            self.last[kind] = (time.monotonic(), 0)
        else:
            self.last[kind] = (at, count + 1)


def jittered(seconds: float, rng: random.Random = random.Random()) -> float:
    """A poll period spread by +-25%: a cluster's nodes do not poll in lockstep."""
    return seconds * rng.uniform(0.75, 1.25)
