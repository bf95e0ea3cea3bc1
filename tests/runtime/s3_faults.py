"""An S3 error as the service sends it, for botocore's before-send hook: the tests inject
throttling, outages and denials without touching moto."""
from __future__ import annotations

from botocore.awsrequest import AWSResponse


def s3_error(request, status: int, code: str) -> AWSResponse:
    body = f"<Error><Code>{code}</Code><Message>injected</Message></Error>".encode()

    class Raw:
        def stream(self, **_):
            yield body
    return AWSResponse(request.url, status, {"Content-Type": "application/xml"}, Raw())
