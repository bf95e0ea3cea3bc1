"""The interruption watcher against a fake IMDSv2 and moto_server."""
from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from constructs_lib.runtime.imds import Imds
from constructs_lib.runtime.watcher import Watcher
from tests.runtime.test_store import make_checkpoint

ROOT = Path(__file__).resolve().parents[2]

# A stand-in training process using the real helper: Checkpointer registers for the notice;
# when it arrives, the loop saves step 99 and stops.
JOB = r"""
import os, sys, time
from constructs_lib.runtime import Checkpointer
ckpt = Checkpointer(sys.argv[1])
print("ready", flush=True)
while not ckpt.interrupted:
    time.sleep(0.05)
with ckpt.save(99) as d:
    with open(os.path.join(d, "model.pt"), "wb") as f:
        f.write(os.urandom(3 * 1024 * 1024))
"""
# torchrun's agent stands between systemd and the workers and has no SIGUSR1 handler: it must
# never be signalled (SIGUSR1's default action would kill it, and the workers with it).
AGENT = "import time\nprint('ready', flush=True)\ntime.sleep(120)\n"


def test_spot_notice_signals_the_job_and_uploads_its_save_manifest_last_before_the_deadline(store, imds, tmp_path):
    local = tmp_path / "ckpt"
    make_checkpoint(local, 10, sizes=(1000,))
    marker = tmp_path / "run" / "interruption"
    notify = tmp_path / "run" / "notify"
    env = {**__import__("os").environ, "PYTHONPATH": str(ROOT), "DL_NOTIFY_DIR": str(notify),
           "DL_INTERRUPTION_MARKER": str(tmp_path / "unused-marker")}
    job = subprocess.Popen([sys.executable, "-c", JOB, str(local)], stdout=subprocess.PIPE, text=True, env=env)
    agent = subprocess.Popen([sys.executable, "-c", AGENT], stdout=subprocess.PIPE, text=True)
    assert job.stdout.readline().strip() == "ready" and agent.stdout.readline().strip() == "ready"
    assert (notify / str(job.pid)).exists(), "Checkpointer registered for the notice"
    writes = []
    store.client.meta.events.register("before-parameter-build.s3.PutObject",
                                      lambda params, **kw: writes.append(params["Key"]))
    store.client.meta.events.register("before-parameter-build.s3.CompleteMultipartUpload",
                                      lambda params, **kw: writes.append(params["Key"]))
    w = Watcher(store, str(local), imds=Imds(imds.endpoint), poll_seconds=0.05, save_grace=10,
                marker=str(marker), notify_dir=str(notify), log=lambda m: None)
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("r", w.run(max_polls=400)))
    t.start()
    time.sleep(0.3)
    deadline = imds.interrupt(seconds=120)
    t.join(timeout=60)
    job.wait(timeout=10)
    r = result["r"]
    assert r.kind == "spot" and r.pushed_step == 99, "the job's save after the notice, not the older step 10"
    assert json.loads(marker.read_text())["action"] == "terminate"
    assert job.returncode == 0, "the job got SIGUSR1 and saved"
    assert agent.poll() is None, "an unregistered process is never signalled"
    agent.kill()
    assert not (notify / str(job.pid)).exists(), "the registration is removed when the job exits"
    assert writes[-1] == "jobs/test/step-000000000099/MANIFEST.json"
    assert store.latest().step == 99
    assert r.seconds_left is not None and r.seconds_left > 60, "uploaded well inside the two-minute window"
    assert dt.datetime.now(dt.timezone.utc) < deadline
    assert all(req.startswith(("PUT /latest/api/token", "GET /latest/meta-data/")) for req in imds.requests)


def test_without_a_new_save_the_newest_complete_one_is_uploaded(store, imds, tmp_path):
    local = tmp_path / "ckpt"
    make_checkpoint(local, 3, sizes=(100,))
    make_checkpoint(local, 4, sizes=(100,))
    (local / ".tmp-step-000000000005-77").mkdir()  # a save in progress is never taken
    w = Watcher(store, str(local), imds=Imds(imds.endpoint), poll_seconds=0.01, save_grace=0.5,
                marker=str(tmp_path / "m"), notify_dir=str(tmp_path / "n"), log=lambda m: None)
    imds.interrupt(seconds=10)
    r = w.run(max_polls=5)
    assert r.pushed_step == 4 and store.latest().step == 4


def test_rebalance_recommendation_notifies_once_and_keeps_watching(store, imds, tmp_path):
    local = tmp_path / "ckpt"
    make_checkpoint(local, 1, sizes=(100,))
    logs = []
    w = Watcher(store, str(local), imds=Imds(imds.endpoint), poll_seconds=0.01, save_grace=0.1,
                marker=str(tmp_path / "m"), notify_dir=str(tmp_path / "n"), log=logs.append)
    imds.recommend_rebalance()
    assert w.run(max_polls=20) is None, "a rebalance is not a termination"
    assert sum("rebalance notice" in line for line in logs) == 1
    assert (tmp_path / "m").exists() and store.latest().step == 1


def test_watch_cli_reads_bucket_and_prefix_from_instance_tags(bucket, s3env, imds, tmp_path):
    local = tmp_path / "ckpt"
    make_checkpoint(local, 8, sizes=(100,))
    imds.tags.update({"dl-launcher:checkpoint-bucket": bucket, "dl-launcher:checkpoint-prefix": "jobs/tagged"})
    imds.interrupt(seconds=30)
    env = {**s3env, "DL_IMDS_ENDPOINT": imds.endpoint, "DL_CHECKPOINT_DIR": str(local),
           "DL_INTERRUPTION_MARKER": str(tmp_path / "m"), "DL_NOTIFY_DIR": str(tmp_path / "n")}
    r = subprocess.run([sys.executable, "-m", "constructs_lib.runtime", "watch", "--poll", "0.05", "--grace", "0.2"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "pushed step 8" in r.stdout
    import boto3
    keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=bucket)["Contents"]]
    assert "jobs/tagged/step-000000000008/MANIFEST.json" in keys
