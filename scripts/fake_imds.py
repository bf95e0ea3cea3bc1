"""A small, honest IMDSv2 stand-in on 127.0.0.1 (moto has no spot interruptions).

It enforces the IMDSv2 token dance (PUT /latest/api/token, then the token header on every GET),
answers 404 where real IMDS does when nothing is pending, and lets a test post a spot
instance-action or a rebalance recommendation at any moment.
"""
from __future__ import annotations

import datetime as dt
import json
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional


class FakeImds:
    def __init__(self, tags: Optional[dict[str, str]] = None, *, instance_id: str = "i-0123456789abcdef0",
                 local_ipv4: str = "10.0.0.10", region: str = "us-east-1", host: str = "127.0.0.1") -> None:
        self.instance_id = instance_id
        self.local_ipv4 = local_ipv4
        self.region = region
        self.tokens: set[str] = set()
        self.spot: Optional[dict] = None
        self.rebalance: Optional[dict] = None
        self.tags = dict(tags or {})
        self.placement: dict[str, str] = {}  # e.g. availability-zone-id, partition-number: 404 when absent
        self.requests: list[str] = []
        # What the next requests meet, one entry each: ("stall", seconds) answers late (a busy
        # node), ("status", 429) throttles as real IMDS does past its packet rate.
        self.faults: list[tuple[str, float]] = []
        self._faults_lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def _send(self, code: int, body: str = "") -> None:
                data = body.encode()
                try:
                    self.send_response(code)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up on a stalled answer
                    pass

            def _fault(self) -> bool:
                with fake._faults_lock:
                    kind, value = fake.faults.pop(0) if fake.faults else ("", 0)
                if kind == "stall":
                    time.sleep(value)
                if kind == "status":
                    self._send(int(value))
                    return True
                return False

            def do_PUT(self):
                fake.requests.append(f"PUT {self.path}")
                if self._fault():
                    return
                if self.path != "/latest/api/token" or not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    return self._send(400)
                token = secrets.token_hex(16)
                fake.tokens.add(token)
                self._send(200, token)

            def do_GET(self):
                fake.requests.append(f"GET {self.path}")
                if self._fault():
                    return
                if self.headers.get("X-aws-ec2-metadata-token") not in fake.tokens:
                    return self._send(401)
                path = self.path.removeprefix("/latest/meta-data/")
                if path == "spot/instance-action":
                    return self._send(200, json.dumps(fake.spot)) if fake.spot else self._send(404)
                if path == "events/recommendations/rebalance":
                    return self._send(200, json.dumps(fake.rebalance)) if fake.rebalance else self._send(404)
                if path.startswith("tags/instance/"):
                    key = path.removeprefix("tags/instance/")
                    return self._send(200, fake.tags[key]) if key in fake.tags else self._send(404)
                if path == "instance-id":
                    return self._send(200, fake.instance_id)
                if path == "local-ipv4":
                    return self._send(200, fake.local_ipv4)
                if path == "placement/region":
                    return self._send(200, fake.region)
                if path.startswith("placement/") and path.removeprefix("placement/") in fake.placement:
                    return self._send(200, fake.placement[path.removeprefix("placement/")])
                self._send(404)

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "FakeImds":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def interrupt(self, seconds: int = 120, action: str = "terminate") -> dt.datetime:
        """Post a spot notice whose deadline is `seconds` from now; returns the deadline."""
        when = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=seconds)).replace(microsecond=0)
        self.spot = {"action": action, "time": when.strftime("%Y-%m-%dT%H:%M:%SZ")}
        return when

    def recommend_rebalance(self) -> None:
        self.rebalance = {"noticeTime": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
