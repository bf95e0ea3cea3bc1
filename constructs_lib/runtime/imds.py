"""A small IMDSv2 client: token first, then the metadata paths the watcher needs."""
from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from typing import Optional

DEFAULT_ENDPOINT = "http://169.254.169.254"
TOKEN_TTL = 21600


class Imds:
    def __init__(self, endpoint: Optional[str] = None, timeout: float = 2.0) -> None:
        self.endpoint = (endpoint or os.environ.get("DL_IMDS_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
        self.timeout = timeout
        self._token: Optional[str] = None
        self._token_expiry = 0.0

    def _fetch_token(self) -> str:
        if self._token and time.monotonic() < self._token_expiry:
            return self._token
        req = urllib.request.Request(f"{self.endpoint}/latest/api/token", method="PUT",
                                     headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL)})
        with urllib.request.urlopen(req, timeout=self.timeout) as r:
            self._token = r.read().decode()
        self._token_expiry = time.monotonic() + TOKEN_TTL - 60
        return self._token

    def get(self, path: str) -> Optional[str]:
        """The text at /latest/<path>, or None if IMDS says 404 (nothing there)."""
        for attempt in (1, 2):
            req = urllib.request.Request(f"{self.endpoint}/latest/{path}",
                                         headers={"X-aws-ec2-metadata-token": self._fetch_token()})
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as r:
                    return r.read().decode()
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
