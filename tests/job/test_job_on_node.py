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
    # secret-like files never ship (the code goes to the asset bucket and every node) unless
    # .dlignore takes one back on purpose (.env.example below)
    for rel in (".git/config", "__pycache__/train.cpython-311.pyc", ".venv/bin/python", "data/shard-0.bin",
                "lib/__pycache__/util.cpython-311.pyc", ".env", ".aws/credentials", ".ssh/id_rsa", ".netrc",
                "certs/server.pem", "lib/credentials"):
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"not shipped")
    (root / ".env.example").write_bytes(b"WANDB_PROJECT=\n")
    ships[".env.example"] = b"WANDB_PROJECT=\n"
    (root / ".dlignore").write_text("# data comes from S3\ndata/\n!.env.example\n")
    ships[".dlignore"] = (root / ".dlignore").read_bytes()
    return ships


def _wait(path: Path, node, unit: str, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while not path.exists():
        proc = node.procs[unit]
        if proc.poll() is not None or time.monotonic() > end:
            raise AssertionError(f"{path.name} never appeared (unit exit {proc.poll()}):\n{node.unit_log(unit)[-4000:]}")
        node.ship_logs()
        time.sleep(0.1)


def test_code_setup_env_secret_and_logs_arrive_on_a_booted_node(tmp_path, moto_endpoint, monkeypatch, capsys):
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
    # the synth summary names what was left out as secret-like, once
    assert capsys.readouterr().err.count("left out as secret-like (never shipped to the nodes): .aws/, .env, .netrc, "
                                         ".ssh/, certs/server.pem, lib/credentials; to ship one on purpose") == 1
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


# ---- failure paths, a redeploy, a container image -------------------------------------------------
SHIMS = Path(__file__).with_name("shims")
FAST = {"DL_RETRY_BASE_SECONDS": "0.05"}


def _booted(tmp_path, endpoint, ctx, **node_kw):
    d = deploy({"profile": "single-gpu-training", "job": "own", **ctx}, tmp_path / "cdk.out", endpoint)
    node = d.node(tmp_path / "node", extra_env={**FAST, **node_kw.pop("extra_env", {})}, **node_kw)
    boot = node.boot()
    assert boot.returncode == 0, boot.stdout[-3000:] + boot.stderr[-3000:]
    return d, node


def _lines(endpoint: str, node) -> list[str]:
    node.ship_logs()
    logs = boto3.client("logs", endpoint_url=endpoint, region_name=REGION)
    return [e["message"] for e in logs.get_log_events(logGroupName=contract.job_log_group("dl-own"),
                                                       logStreamName=node.instance_id, startFromHead=True)["events"]]


def _failed(d) -> dict:
    s3 = boto3.client("s3", endpoint_url=d.endpoint, region_name=REGION)
    key = f"jobs/own/{contract.CLUSTER_DIR}/failed.json"
    import json
    return json.loads(s3.get_object(Bucket=d.bucket, Key=key)["Body"].read())


def test_a_failing_setup_fails_the_job_with_its_last_lines_and_never_starts_the_command(tmp_path, moto_endpoint,
                                                                                         monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("print('never')\n")
    d, node = _booted(tmp_path, moto_endpoint, {"code": str(project), "command": f"touch {tmp_path}/started",
                                               "setup": "echo resolving torch==9.9; echo 'ERROR: No matching distribution' >&2; exit 3"})
    try:
        node.start("dl-job.service")
        assert node.wait("dl-job.service", timeout=90) == contract.EXIT_FAILED  # not restarted by systemd
        assert not (tmp_path / "started").exists()
        health = (node.dirs["DL_RUN_DIR"] / "health.d" / "setup").read_text()
        assert health.startswith("failed setup exited 3") and "ERROR: No matching distribution" in health
        reason = _failed(d)["reason"]
        assert reason.startswith(f"{node.instance_id}: setup exited 3") and "No matching distribution" in reason
        lines = _lines(moto_endpoint, node)
        assert "[setup] resolving torch==9.9" in lines and "[setup] ERROR: No matching distribution" in lines
        assert any(x.startswith("[dl-launcher] job cannot run:") for x in lines)
    finally:
        node.stop()


def test_a_redeploy_with_changed_code_reaches_a_running_node_at_its_next_generation(tmp_path, moto_endpoint,
                                                                                     monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    project = tmp_path / "project"
    project.mkdir()
    (project / "version.txt").write_text("v1\n")
    command = f"cat version.txt >> {tmp_path}/seen; touch {tmp_path}/running; while [ ! -e {tmp_path}/release ]; do sleep 0.1; done"
    d, node = _booted(tmp_path, moto_endpoint, {"code": str(project), "command": command})
    try:
        node.start("dl-job.service")
        _wait(tmp_path / "running", node, "dl-job.service")
        # cdk deploy again with changed code: new assets, the parameter names the new revision
        (project / "version.txt").write_text("v2\n")
        deploy({"profile": "single-gpu-training", "job": "own", "code": str(project), "command": command},
               tmp_path / "cdk.out.2", moto_endpoint)
        # the running generation keeps its code; the next one (here: a restart of the job unit) runs the new
        node.kill("dl-job.service")
        (tmp_path / "running").unlink()
        node.start("dl-job.service")
        _wait(tmp_path / "running", node, "dl-job.service")
        (tmp_path / "release").touch()
        assert node.wait("dl-job.service", timeout=90) == contract.EXIT_FINISHED
        assert (tmp_path / "seen").read_text() == "v1\nv2\n"
        s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name=REGION)
        import json
        plan = json.loads(s3.get_object(Bucket=d.bucket, Key=f"jobs/own/{contract.CLUSTER_DIR}/gen-000002/plan.json")["Body"].read())
        ssm = boto3.client("ssm", endpoint_url=moto_endpoint, region_name=REGION)
        assert plan["job"] == json.loads(ssm.get_parameter(Name=contract.job_parameter("dl-own"))["Parameter"]["Value"])
        work = (node.dirs["DL_SCRATCH"] / "work").resolve()
        assert (work / "version.txt").read_text() == "v2\n" and len(list(work.parent.iterdir())) == 2
    finally:
        node.stop()


ECR_IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/team/train:v3"


def test_the_command_runs_in_the_image_with_every_gpu_efa_and_the_host_network(tmp_path, moto_endpoint, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("import os\nprint('in', os.environ['IN_IMAGE'], 'lr', os.environ['LR'])\n")
    calls = tmp_path / "docker.calls"
    sm = boto3.client("secretsmanager", endpoint_url=moto_endpoint, region_name=REGION)
    arn = sm.create_secret(Name="hf-token", SecretString=SECRET + " 'quoted' $HOME")["ARN"]
    seen = tmp_path / "seen-secret"
    d, node = _booted(tmp_path, moto_endpoint, {"code": str(project), "image": ECR_IMAGE, "env": "LR=0.1",
                                               "secrets": f"HF_TOKEN={arn}",
                                               "command": f"python3 train.py; printf %s \"$HF_TOKEN\" > {seen}; "
                                                          "echo \"rank env $NODE_RANK/$WORLD_SIZE\""},
                      path_prefix=[str(SHIMS)], extra_env={"DOCKER_CALLS": str(calls)})
    try:
        node.start("dl-job.service")
        assert node.wait("dl-job.service", timeout=90) == contract.EXIT_FINISHED, node.unit_log("dl-job.service")
        docker = calls.read_text().splitlines()
        assert docker[0] == "docker login --username AWS --password-stdin 123456789012.dkr.ecr.us-east-1.amazonaws.com"
        assert docker[1] == f"docker pull --quiet {ECR_IMAGE}"
        (run,) = [c for c in docker if c.startswith("docker run ")]
        for option in ("--gpus all", "--network host", "--ipc host", "--ulimit memlock=-1", "--name dl-job",
                       "--env LR", "--env MASTER_ADDR", "--env NODE_RANK", "--env DL_CHECKPOINT_DIR"):
            assert option in run, option
        work = (node.dirs["DL_SCRATCH"] / "work").resolve()
        assert f"--workdir {work}" in run and f"--volume {node.dirs['DL_LIB_DIR']}:{node.dirs['DL_LIB_DIR']}:ro" in run
        lines = _lines(moto_endpoint, node)
        assert f"in {ECR_IMAGE} lr 0.1" in lines and "rank env 0/1" in lines
        # the secret reached the command, byte for byte, but never docker's arguments or --env
        # (docker keeps those in the container's config, for `docker inspect`); its file is gone
        assert seen.read_text() == SECRET + " 'quoted' $HOME"
        assert SECRET not in calls.read_text() and "--env HF_TOKEN" not in run
        assert not (node.dirs["DL_RUN_DIR"] / "container-secrets.env").exists()
    finally:
        node.stop()


def test_an_image_that_cannot_be_pulled_fails_the_job_with_the_registrys_words(tmp_path, moto_endpoint, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    image = "public.ecr.aws/team/missing:v1"
    calls = tmp_path / "docker.calls"
    d, node = _booted(tmp_path, moto_endpoint, {"image": image, "command": "python3 train.py"},
                      path_prefix=[str(SHIMS)], extra_env={"DOCKER_CALLS": str(calls)})
    try:
        node.start("dl-job.service")
        assert node.wait("dl-job.service", timeout=120) == contract.EXIT_FAILED
        assert [c for c in calls.read_text().splitlines() if c.startswith("docker pull")] == [
            f"docker pull --quiet {image}"] * 3, "retried, bounded"
        assert not any(c.startswith(("docker run", "docker login")) for c in calls.read_text().splitlines())
        reason = _failed(d)["reason"]
        assert f"image {image} could not be pulled: Error response from daemon: manifest for {image} not found" in reason
        assert "manifest unknown" in (node.dirs["DL_RUN_DIR"] / "health.d" / "setup").read_text()
    finally:
        node.stop()
