"""Fixtures of the job tests."""
from __future__ import annotations

import pytest


@pytest.fixture
def moto_endpoint():
    """A moto of its own per test: each deploys the same job name."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    import urllib.request
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"), timeout=10).read()
    yield endpoint
    server.stop()
