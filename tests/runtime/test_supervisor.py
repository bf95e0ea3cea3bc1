"""The job supervisor's exit-code contract on two nodes, with plain shell commands (no torch):
what systemd sees (the rendered unit's Restart= and RestartPreventExitStatus=) in each case.
The rules themselves (the failure count, the agreed outcome) are pinned in test_decisions.py; a
retry in a new generation and another node's failure counted as this one's, in test_supervisor_rides.py."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from constructs_lib.runtime import contract
from constructs_lib.runtime.resume import restore
from tests.runtime.drill import Drill
from tests.runtime.s3_faults import s3_error
from tests.runtime.test_store import make_checkpoint


@pytest.fixture
def drill(tmp_path, moto_process):
    made = []

    def make(command: str, **kw) -> Drill:
        (tmp_path / "run").mkdir()
        d = Drill(tmp_path / "run", moto_process, steps=0, command=command, **kw)
        made.append(d)
        return d
    yield make
    for d in made:
        d.stop()


def _cluster_file(d: Drill, name: str) -> dict:
    return json.loads(d.s3.get_object(Bucket=d.bucket, Key=f"{d.prefix}/{contract.CLUSTER_DIR}/{name}")["Body"].read())


def test_a_command_that_always_fails_stops_the_job_on_every_node_without_a_restart_loop(drill):
    d = drill("echo doomed; exit 7")
    nodes = [d.add_node("127.0.0.2"), d.add_node("127.0.0.3")]
    d.wait("both job units to end", lambda: all(n.units["dl-job.service"].done for n in nodes), timeout=60)
    for n in nodes:
        job = n.units["dl-job.service"]
        assert job.exits == [contract.EXIT_FAILED] and job.starts == 1, "systemd does not restart it"
        assert (Path(n.dirs["DL_RUN_DIR"]) / "health.d" / "job").read_text().startswith("failed")
    failed = _cluster_file(d, "failed.json")
    # The same error from the same step twice: no third try on every node (issue 40, item 3).
    assert "failed twice in a row with the same error, from the same step (exit 7)" in failed["reason"], failed
    # What `dl-launcher status` shows of a failed job: the attempts and the command's own last lines.
    assert failed["attempts"] == 2 and failed["last_lines"][-1] == "doomed"
    assert not any(line.startswith("[dl-launcher]") for line in failed["last_lines"]), "the job's output only"


def test_a_finished_job_stays_finished_for_late_and_replacement_nodes(drill):
    d = drill("echo rank $NODE_RANK of $NNODES at $MASTER_ADDR:$MASTER_PORT")
    nodes = [d.add_node("127.0.0.2"), d.add_node("127.0.0.3")]
    d.wait("the job to finish", d.finished, timeout=60)
    assert [n.units["dl-job.service"].exits for n in nodes] == [[0], [0]]
    logs = "".join(n.log_text() for n in nodes)
    plan = d.plan("1")
    assert f"rank 0 of 2 at {plan['master_addr']}:{plan['master_port']}" in logs and "rank 1 of 2" in logs
    late = d.add_node("127.0.0.4")
    d.wait("the late node's job", lambda: late.units["dl-job.service"].done, timeout=30)
    assert late.units["dl-job.service"].exits == [0] and "has finished" in late.log_text()
    assert _cluster_file(d, "finished.json")["generation"] == 1
    status = subprocess.run([sys.executable, "-m", "constructs_lib.runtime", "status"], env=nodes[0].env,
                            capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    assert "job finished (generation 1)" in status.stdout and "generation 1: finished" in status.stdout
    assert f"ranks 0={plan['members'][0]['node']}@{plan['master_addr']}" in status.stdout


def test_no_command_leaves_the_node_up_for_ssm(drill):
    d = drill("")
    node = d.add_node("127.0.0.2")
    d.wait("the job unit", lambda: node.units["dl-job.service"].done, timeout=30)
    assert node.units["dl-job.service"].exits == [0] and "stays up for SSM" in node.log_text()


def test_a_job_command_with_shell_syntax_runs_as_written(drill, tmp_path):
    out = tmp_path / "out.txt"
    d = drill(f"""X='a "quoted" $HOME `not run`'; printf '%s|%s\\n' "$X" "$DL_GENERATION" > {out}""", nodes=1)
    d.add_node("127.0.0.2")
    d.wait("the job to finish", d.finished, timeout=30)
    assert out.read_text() == 'a "quoted" $HOME `not run`|1\n'


def test_restore_rides_out_s3_errors_with_backoff(store, tmp_path):
    """First boot (or any round) with S3 failing for a while: the restore is retried, not abandoned."""

    store.push(str(make_checkpoint(tmp_path / "src", 12, sizes=(100, 6 * 1024 * 1024))), 12)
    import boto3
    from botocore.config import Config

    from constructs_lib.runtime.store import CheckpointStore
    # Three attempts per call instead of the node's ten: the same ride-out past botocore's own
    # retries, without minutes of its randomized backoff (up to 20 s a retry) in the suite.
    store = CheckpointStore(store.bucket, store.prefix, concurrency=8, part_size=5 * 1024 * 1024,
                            client=boto3.client("s3", region_name="us-east-1",
                                                config=Config(retries={"mode": "standard", "max_attempts": 3})))
    failures = {"left": 10}  # more than the client's own 3 attempts, three times over

    def flaky(request, **kw):
        if failures["left"] > 0 and request.method == "GET":
            failures["left"] -= 1
            return s3_error(request, 500, "InternalError")
        return None
    store.client.meta.events.register_first("before-send.s3.*", flaky)
    logs = []
    path = restore(store, str(tmp_path / "ck"), 12, log=logs.append, retry_base=0.01)
    assert path and Path(path, "model.pt").exists() and failures["left"] == 0
    assert any("retry" in line for line in logs)
    assert contract.read_env("resume_env") == {"DL_RESUME_FROM": path, "DL_RESUME_STEP": "12"}
    assert (Path(contract.path("health_dir")) / "restore").read_text().startswith("ok")


def test_the_finished_marker_records_the_jobs_final_step(drill, tmp_path):
    d = drill("true", nodes=1)
    make_checkpoint(tmp_path / "c", 41)
    from constructs_lib.runtime.store import CheckpointStore
    import boto3
    CheckpointStore(d.bucket, d.prefix, client=boto3.client("s3", endpoint_url=d.s3.meta.endpoint_url,
                                                            region_name="us-east-1")).push(
        str(tmp_path / "c" / "step-000000000041"), 41)
    d.add_node("127.0.0.2")
    d.wait("the job to finish", d.finished, timeout=60)
    assert _cluster_file(d, "finished.json")["step"] == 41, "the job's newest complete step, not this node's own push"


def _exists(d: Drill, name: str) -> bool:
    try:
        d.s3.head_object(Bucket=d.bucket, Key=f"{d.prefix}/{contract.CLUSTER_DIR}/{name}")
        return True
    except Exception:
        return False
