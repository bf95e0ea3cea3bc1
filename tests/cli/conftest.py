"""moto_server on 127.0.0.1 for the console script, which runs as its own process, and a job's
stack as the training stack marks it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

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
    """The installed console script, with the tests' fake credentials and `endpoint` for AWS, on
    this checkout's packages (whichever checkout the venv was installed from)."""
    full = {**os.environ, "AWS_ENDPOINT_URL": endpoint, "PYTHONPATH": str(ROOT), **env}
    return subprocess.run([str(CONSOLE), *argv], cwd=ROOT, env=full, capture_output=True, text=True, timeout=timeout)


def job_stack(cfn, job: str, outputs: Optional[dict] = None, **kw) -> str:
    """A stack dl-JOB as the training stack marks it (its OUTPUT_JOB output; test_jobstack checks
    the synthesized template carries it), with `outputs` beside; its StackId (the nodes' TAG_STACK)."""
    from constructs_lib.runtime.contract import OUTPUT_JOB

    template = {"Resources": {"T": {"Type": "AWS::SNS::Topic"}},
                "Outputs": {OUTPUT_JOB: {"Value": job}, **{k: {"Value": v} for k, v in (outputs or {}).items()}}}
    return cfn.create_stack(StackName=f"dl-{job}", TemplateBody=json.dumps(template), **kw)["StackId"]
