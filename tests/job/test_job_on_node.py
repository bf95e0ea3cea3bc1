"""Your job on a node, end to end: a stack synthesized with code, setup, env, a secret and logs,
"deployed" into moto (assets, parameters, log group), and one node booted from the launch
template's real user data (scripts/simnode.py). The job unit runs the real supervisor, which
fetches and checks the code, runs setup, reads the secret, runs the command; the job's log goes
to moto's CloudWatch Logs through the agent's configuration as the stack wrote it."""
from __future__ import annotations

import os
import time
from pathlib import Path

import boto3
import pytest

from constructs_lib.runtime import contract
from tests.job.deployed import REGION, deploy

SECRET = "hf_S3cr3t-value-0123456789"
# The command and setup as a user writes them: the env value says where to report, the secret is
# written there (never printed), and the command waits so that the job unit can be restarted mid-run.
COMMAND = """echo "job starting in $PWD with EPOCHS=$EPOCHS"
pwd > "$SIM_OUT/cwd"
echo "$EPOCHS" > "$SIM_OUT/epochs"
printf '%s' "$HF_TOKEN" > "$SIM_OUT/secret"
touch "$SIM_OUT/started"
while [ ! -e "$SIM_OUT/release" ]; do sleep 0.1; done
python train.py
echo "job done"
"""
SETUP = """echo "setup: preparing $PWD"
echo ran >> "$SIM_OUT/setup-runs"
test -n "$HF_TOKEN" && echo "setup sees the secret's name set"
"""


def _project(root: Path) -> dict[str, bytes]:
    """A project with what must ship and what must not; returns what must, by path."""
    ships = {
        "train.py": b"import os\nfor e in range(int(os.environ['EPOCHS'])):\n    print(f'epoch {e} loss {1 / (e + 1):.3f}', flush=True)\n",
        "lib/util.py": b"X = 1\n",
        "run.sh": b"#!/bin/sh\necho run\n",
        "notes/\xc3\xa9t\xc3\xa9.txt".encode().decode(): "ünïcode name\n".encode(),
    }
    for rel, data in ships.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    (root / "run.sh").chmod(0o755)
    (root / "link.py").symlink_to("lib/util.py")  # a link inside ships as the file it names
    ships["link.py"] = ships["lib/util.py"]
    for rel in (".git/config", "__pycache__/train.cpython-311.pyc", ".venv/bin/python", "data/shard-0.bin",
                "lib/__pycache__/util.cpython-311.pyc"):
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"not shipped")
    (root / ".dlignore").write_text("# data comes from S3\ndata/\n")
    ships[".dlignore"] = (root / ".dlignore").read_bytes()
    return ships


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


def _wait(path: Path, node, unit: str, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while not path.exists():
        proc = node.procs[unit]
        if proc.poll() is not None or time.monotonic() > end:
            raise AssertionError(f"{path.name} never appeared (unit exit {proc.poll()}):\n{node.unit_log(unit)[-4000:]}")
        node.ship_logs()
        time.sleep(0.1)


def test_code_setup_env_secret_and_logs_arrive_on_a_booted_node(tmp_path, moto_endpoint, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    sm = boto3.client("secretsmanager", endpoint_url=moto_endpoint, region_name=REGION)
    arn = sm.create_secret(Name="hf-token", SecretString=SECRET)["ARN"]
    project = tmp_path / "project"
    ships = _project(project)
    sim_out = tmp_path / "out"
    sim_out.mkdir()
    (tmp_path / "setup.sh").write_text(SETUP)
    (tmp_path / "command.sh").write_text(COMMAND)
    d = deploy({"profile": "single-gpu-training", "job": "own", "code": str(project),
                "setup_file": str(tmp_path / "setup.sh"), "command_file": str(tmp_path / "command.sh"),
                "env": f"EPOCHS=3,SIM_OUT={sim_out}", "secrets": f"HF_TOKEN={arn}"}, tmp_path / "cdk.out", moto_endpoint)
    node = d.node(tmp_path / "node")
    try:
        boot = node.boot()
        assert boot.returncode == 0, boot.stdout[-3000:] + boot.stderr[-3000:]
        env = node.node_env()
        assert env["DL_JOB_PARAMETER"] == contract.job_parameter("dl-own")
        assert env["DL_LOG_GROUP"] == contract.job_log_group("dl-own")

        node.start("dl-job.service")
        _wait(sim_out / "started", node, "dl-job.service")
        # systemd restarts the job unit mid-run (a crash, `systemctl restart`): setup must not run again
        node.kill("dl-job.service")
        (sim_out / "started").unlink()
        node.start("dl-job.service")
        _wait(sim_out / "started", node, "dl-job.service")
        (sim_out / "release").touch()
        assert node.wait("dl-job.service", timeout=120) == contract.EXIT_FINISHED, node.unit_log("dl-job.service")[-4000:]

        # the working directory holds the code, byte for byte, and the command ran there
        work = node.dirs["DL_SCRATCH"] / "work"
        cwd = Path((sim_out / "cwd").read_text().strip())
        assert cwd == work.resolve() and cwd.parent == node.dirs["DL_SCRATCH"] / "code"
        got = {p.relative_to(cwd).as_posix(): p.read_bytes() for p in cwd.rglob("*") if p.is_file()}
        assert got == ships
        assert os.access(cwd / "run.sh", os.X_OK)
        # setup ran once across the restart; the job saw the env value and the secret's value
        assert (sim_out / "setup-runs").read_text() == "ran\n"
        assert (sim_out / "epochs").read_text() == "3\n"
        assert (sim_out / "secret").read_text() == SECRET

        # the job's, setup's and the supervisor's lines, in the job's group, one stream: this node's
        logs = boto3.client("logs", endpoint_url=moto_endpoint, region_name=REGION)
        streams = [s["logStreamName"] for s in logs.describe_log_streams(
            logGroupName=contract.job_log_group("dl-own"))["logStreams"]]
        assert streams == [node.instance_id]
        events = logs.get_log_events(logGroupName=contract.job_log_group("dl-own"), logStreamName=node.instance_id,
                                     startFromHead=True)["events"]
        lines = [e["message"] for e in events]
        assert f"job starting in {cwd} with EPOCHS=3" in lines
        assert ["epoch 0 loss 1.000", "epoch 1 loss 0.500", "epoch 2 loss 0.333", "job done"] == \
            [x for x in lines if x.startswith("epoch") or x == "job done"]
        assert lines.count("[setup] setup sees the secret's name set") == 1
        assert any(x.startswith("[dl-launcher] generation 1: running job revision") for x in lines)
        assert any(x.startswith("[dl-launcher] code ") and "unpacked" in x for x in lines)
        assert any("generation 1 ended: finished" in x for x in lines)

        # the secret's value is nowhere but in the job's environment (and where the job put it)
        places = {"template and assets": b"".join(p.read_bytes() for p in d.out.rglob("*") if p.is_file()),
                  "user data": d.user_data.encode(), "log events": "\n".join(lines).encode(),
                  "node files": b"".join(p.read_bytes() for p in node.root.rglob("*")
                                         if p.is_file() and not p.is_relative_to(sim_out))}
        for where, blob in places.items():
            assert SECRET.encode() not in blob, f"the secret's value is in the {where}"
    finally:
        node.stop()
