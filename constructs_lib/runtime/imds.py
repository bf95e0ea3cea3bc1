"""A small IMDSv2 client: token first, then the metadata paths the node needs.

IMDS on a busy node is not always quick, and it throttles (HTTP 429) past its packet limit:
a timeout, a reset or a 429/5xx is asked again after a full-jitter wait (dl_core.aws.Backoff: the
nodes of a cluster ask together), up to `attempts` tries. A refused
connection is not retried: nothing listens there, so this is not an EC2 instance.
"""
from __future__ import annotations

import http.client
import json
import os
import random
import socket
import time
import urllib.error
import urllib.request
from typing import Callable, Optional, TypeVar

from dl_core.aws import Backoff

from .errors import ImdsUnavailable

DEFAULT_ENDPOINT = "http://169.254.169.254"
TOKEN_TTL = 21600
RETRIED_HTTP = (429, 500, 502, 503, 504)
T = TypeVar("T")


def transient(e: BaseException) -> bool:
    """True for the failures that another try may cure (timeouts, resets, throttling, 5xx)."""
    if isinstance(e, urllib.error.HTTPError):
        return e.code in RETRIED_HTTP
    if isinstance(e, urllib.error.URLError):
        return not isinstance(e.reason, str) and transient(e.reason)
    if isinstance(e, ConnectionRefusedError):
        return False
    return isinstance(e, (TimeoutError, socket.timeout, ConnectionResetError, ConnectionAbortedError,
                          http.client.RemoteDisconnected, http.client.IncompleteRead))


class Imds:
    """timeout: seconds per request. attempts: tries per request for transient failures (1 asks
    once, for tools that must answer fast off EC2); backoff: the longest first wait, doubling, at most
    4 s (each wait drawn from [0, that], so nodes throttled together do not ask again together)."""

    def __init__(self, endpoint: Optional[str] = None, timeout: float = 2.0, *, attempts: int = 1,
                 backoff: float = 0.5, sleep: Callable[[float], None] = time.sleep,
                 rng: Optional[random.Random] = None) -> None:
        self.endpoint = (endpoint or os.environ.get("DL_IMDS_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
        self.timeout = timeout
        self.attempts = max(1, attempts)
        self.backoff = backoff
        self._sleep = sleep
        self._rng = rng
        self._token: Optional[str] = None
        self._token_expiry = 0.0

    @classmethod
    def on_node(cls, endpoint: Optional[str] = None) -> "Imds":
        """The patient client the node's services use: 6 tries of 2 s, about 24 s at worst. The
        first wait is DL_RETRY_BASE_SECONDS (the node's retry base, which tests shorten), else 0.5 s."""
        try:
            backoff = min(4.0, max(0.01, float(os.environ.get("DL_RETRY_BASE_SECONDS") or 0.5)))
        except ValueError:
            backoff = 0.5
        return cls(endpoint, timeout=2.0, attempts=6, backoff=backoff)

    def _retrying(self, what: str, call: Callable[[], T]) -> T:
        backoff = Backoff(self.backoff, 4.0, self._rng)
        for attempt in range(1, self.attempts + 1):
            try:
                return call()
            except Exception as e:
                if not transient(e):
                    raise
                if attempt == self.attempts:
                    raise ImdsUnavailable(f"IMDS at {self.endpoint} did not answer {what} in {self.attempts} "
                                          f"tries of {self.timeout:g} s (last: {_words(e)})") from e
                self._sleep(backoff.next())
        raise AssertionError("unreachable")

    def _fetch_token(self) -> str:
        if self._token and time.monotonic() < self._token_expiry:
            return self._token

        def put() -> str:
            req = urllib.request.Request(f"{self.endpoint}/latest/api/token", method="PUT",
                                         headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL)})
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                return r.read().decode()

        self._token = self._retrying("a token", put)
        self._token_expiry = time.monotonic() + TOKEN_TTL - 60
        return self._token

    def get(self, path: str) -> Optional[str]:
        """The text at /latest/<path>, or None if IMDS says 404 (nothing there)."""
        for attempt in (1, 2):
            token = self._fetch_token()

            def fetch() -> str:
                req = urllib.request.Request(f"{self.endpoint}/latest/{path}",
                                             headers={"X-aws-ec2-metadata-token": token})
                with urllib.request.urlopen(req, timeout=self.timeout) as r:
                    return r.read().decode()

            try:
                return self._retrying(path, fetch)
            except urllib.error.HTTPError as e:
                if e.code == 404:
                    return None
                if e.code == 401 and attempt == 1:  # token expired or IMDS restarted
                    self._token = None
                    continue
                raise
        return None

    def spot_action(self) -> Optional[dict]:
        """{"action": "terminate"|"stop"|"hibernate", "time": "...Z"} once AWS reclaims the node."""
        text = self.get("meta-data/spot/instance-action")
        return json.loads(text) if text else None

    def rebalance(self) -> Optional[dict]:
        """{"noticeTime": "...Z"} when EC2 signals elevated interruption risk."""
        text = self.get("meta-data/events/recommendations/rebalance")
        return json.loads(text) if text else None

    def tag(self, key: str) -> Optional[str]:
        """An instance tag (needs InstanceMetadataTags enabled, as dl-launcher's templates do)."""
        return self.get(f"meta-data/tags/instance/{key}")

    def instance_id(self) -> Optional[str]:
        return self.get("meta-data/instance-id")


def _words(e: BaseException) -> str:
    if isinstance(e, urllib.error.HTTPError):
        return f"HTTP {e.code} {e.reason}"
    reason = getattr(e, "reason", None) or e
    return " ".join(str(reason).split()) or type(e).__name__
