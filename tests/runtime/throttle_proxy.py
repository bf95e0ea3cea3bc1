"""A reverse proxy on 127.0.0.1 in front of moto_server that answers, while told to, as S3 and
EC2 answer a throttled account: S3 503 SlowDown, EC2 503 RequestLimitExceeded (the wire formats of
the S3 and EC2 API references' error responses). Everything else passes through; what it refused
is counted. The drill's nodes use it as their endpoint; the harness talks to moto directly."""
from __future__ import annotations

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

EC2_VERSION = b"Version=2016-11-15"
S3_SLOWDOWN = (b"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>SlowDown</Code>"
               b"<Message>Please reduce your request rate.</Message><RequestId>injected</RequestId></Error>")
EC2_LIMIT = (b"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Response><Errors><Error><Code>RequestLimitExceeded</Code>"
             b"<Message>Request limit exceeded.</Message></Error></Errors><RequestID>injected</RequestID></Response>")


class ThrottleProxy:
    def __init__(self, upstream: str, bucket: str) -> None:
        self.upstream = urlsplit(upstream)
        self.bucket = bucket
        self.throttle: set[str] = set()  # "s3", "ec2"
        self.refused = {"s3": 0, "ec2": 0}
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_):
                pass

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                kind = ("s3" if self.path.startswith(f"/{proxy.bucket}") else
                        "ec2" if EC2_VERSION in body or "Version=2016-11-15" in self.path else "")
                if kind and kind in proxy.throttle:
                    with proxy.lock:
                        proxy.refused[kind] += 1
                    payload = S3_SLOWDOWN if kind == "s3" else EC2_LIMIT
                    self.send_response(503)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                conn = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                headers["Host"] = proxy.upstream.netloc
                conn.request(self.command, self.path, body=body or None, headers=headers)
                r = conn.getresponse()
                data = r.read()
                self.send_response(r.status)
                for k, v in r.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> "ThrottleProxy":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
