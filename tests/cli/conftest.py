"""moto_server on 127.0.0.1 for the console script, which runs as its own process."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONSOLE = Path(sys.executable).parent / "dl-launcher"  # installed by the README's set-up (pyproject scripts)


@pytest.fixture(scope="module")
def moto_endpoint():
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def run(*argv: str, endpoint: str = "http://127.0.0.1:9", timeout: int = 120, **env: str) -> subprocess.CompletedProcess:
    """The installed console script, with the tests' fake credentials and `endpoint` for AWS."""
    full = {**os.environ, "AWS_ENDPOINT_URL": endpoint, **env}
    return subprocess.run([str(CONSOLE), *argv], cwd=ROOT, env=full, capture_output=True, text=True, timeout=timeout)
