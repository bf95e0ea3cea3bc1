"""The checkpoint protocol against moto_server: manifest last, never restore a partial."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest

from constructs_lib.runtime.errors import RuntimeUserError
from constructs_lib.runtime.store import CheckpointStore
from tests.runtime.s3_faults import s3_error

ROOT = Path(__file__).resolve().parents[2]


def make_checkpoint(root: Path, step: int, sizes=(1024, 7 * 1024 * 1024), seed: int = 0) -> Path:
    d = root / f"step-{step:012d}"
    (d / "shards").mkdir(parents=True)
    for i, size in enumerate(sizes):
        target = d / ("model.pt" if i == 0 else f"shards/part-{i}.bin")
        target.write_bytes(os.urandom(size) if seed == 0 else bytes([(seed + i) % 256]) * size)
    return d


def test_push_pull_roundtrip_with_multipart(store, tmp_path):
    src = make_checkpoint(tmp_path / "src", 42)
    events = []
    cp = store.push(str(src), 42, on_event=lambda kind, key: events.append((kind, key)))
    assert cp.step == 42 and len(cp.manifest["files"]) == 2
    assert events[-1] == ("manifest", "jobs/test/step-000000000042/MANIFEST.json")
    assert [k for k, _ in events].count("manifest") == 1, "the manifest goes last, once"
    got = store.pull(str(tmp_path / "dst"))
    assert got == (42, str(tmp_path / "dst" / "step-000000000042"))
    for rel in ("model.pt", "shards/part-1.bin"):
        assert (Path(got[1]) / rel).read_bytes() == (src / rel).read_bytes()
    # a 7 MiB file with 5 MiB parts went up in parts
    head = boto3.client("s3").head_object(Bucket=store.bucket, Key="jobs/test/step-000000000042/shards/part-1.bin")
    assert "-" in head["ETag"], "multipart upload"


def test_manifest_is_the_last_object_written(store, tmp_path):
    src = make_checkpoint(tmp_path, 1, sizes=(2048, 300_000, 12 * 1024 * 1024))
    calls = []
    store.client.meta.events.register("after-call.s3.*", lambda model, **kw: calls.append(model.name))
    store.client.meta.events.register("before-parameter-build.s3.*",
                                      lambda params, model, **kw: calls.append((model.name, params.get("Key", ""))))
    store.push(str(src), 1)
    writes = [c for c in calls if isinstance(c, tuple) and c[0] in ("PutObject", "CompleteMultipartUpload")]
    assert writes[-1] == ("PutObject", "jobs/test/step-000000000001/MANIFEST.json")
    assert sum(1 for w in writes if w[1].endswith("MANIFEST.json")) == 1


def test_incomplete_steps_are_listed_but_never_restored(store, tmp_path):
    store.push(str(make_checkpoint(tmp_path / "a", 10)), 10)
    s3 = boto3.client("s3")
    # step 20: files but no manifest (an upload that died), the newest name in S3
    s3.put_object(Bucket=store.bucket, Key="jobs/test/step-000000000020/model.pt", Body=b"half")
    rows = store.list()
    assert [(n, c is not None) for n, c in rows] == [("step-000000000010", True), ("step-000000000020", False)]
    assert store.latest().step == 10
    assert store.pull(str(tmp_path / "dst"))[0] == 10


def test_a_checkpoint_that_does_not_verify_is_skipped_for_the_previous(store, tmp_path):
    store.push(str(make_checkpoint(tmp_path / "a", 1)), 1)
    store.push(str(make_checkpoint(tmp_path / "b", 2)), 2)
    boto3.client("s3").put_object(Bucket=store.bucket, Key="jobs/test/step-000000000002/model.pt", Body=b"tampered")
    step, path = store.pull(str(tmp_path / "dst"))
    assert step == 1
    assert not any(p.name.startswith(".tmp") for p in (tmp_path / "dst").iterdir()), "no half-restored leftovers"


def test_repush_of_a_step_is_incomplete_until_its_new_manifest(store, tmp_path):
    store.push(str(make_checkpoint(tmp_path / "a", 5)), 5)
    calls = []
    store.client.meta.events.register("before-parameter-build.s3.*",
                                      lambda params, model, **kw: calls.append((model.name, params.get("Key", ""))))
    store.push(str(make_checkpoint(tmp_path / "b", 5)), 5)
    assert calls[0] == ("DeleteObject", "jobs/test/step-000000000005/MANIFEST.json")


def test_process_killed_mid_upload_leaves_the_previous_checkpoint(store, s3env, tmp_path):
    store.push(str(make_checkpoint(tmp_path / "old", 1, sizes=(1000,))), 1)
    big = make_checkpoint(tmp_path / "new", 2, sizes=[8 * 1024 * 1024] * 12)  # 96 MiB, many parts
    proc = subprocess.Popen(
        [sys.executable, "-m", "constructs_lib.runtime", "checkpoint", "push", str(big),
         "--bucket", store.bucket, "--prefix", store.prefix],
        cwd=ROOT, env=s3env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    s3 = boto3.client("s3")
    deadline = time.monotonic() + 60
    started = False
    while time.monotonic() < deadline and proc.poll() is None:
        uploads = s3.list_multipart_uploads(Bucket=store.bucket).get("Uploads", [])
        objects = s3.list_objects_v2(Bucket=store.bucket, Prefix="jobs/test/step-000000000002/").get("KeyCount", 0)
        if uploads or objects:
            started = True
            break
        time.sleep(0.01)
    assert started, "the upload began"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    rows = dict(store.list())
    assert rows.get("step-000000000002") is None, "no manifest: step 2 is not complete"
    assert store.latest().step == 1
    assert store.pull(str(tmp_path / "dst"))[0] == 1


@pytest.mark.parametrize("code,status", [("SlowDown", 503), ("InternalError", 500), ("ServiceUnavailable", 503)])
def test_throttling_and_5xx_are_retried_and_nothing_is_lost(store, tmp_path, code, status):

    failures = {"left": 6}

    def inject(request, **kw):
        # Fail a share of writes, parts and reads alike, the way an overloaded prefix does.
        if failures["left"] > 0 and request.method in ("PUT", "POST", "GET"):
            failures["left"] -= 1
            return s3_error(request, status, code)
        return None

    store.client.meta.events.register_first("before-send.s3.*", inject)
    src = make_checkpoint(tmp_path / "src", 3, sizes=(4096, 11 * 1024 * 1024))
    store.push(str(src), 3)
    assert failures["left"] == 0, "errors were injected"
    failures["left"] = 4
    step, path = store.pull(str(tmp_path / "dst"))
    assert step == 3 and failures["left"] == 0
    assert (Path(path) / "shards/part-1.bin").read_bytes() == (src / "shards/part-1.bin").read_bytes()


@pytest.mark.parametrize("args,expected", [
    (("no-such-bucket-xyz", "jobs/x"), "checkpoint bucket 'no-such-bucket-xyz' does not exist"),
    (("Bad_Bucket", "jobs/x"), "bad bucket name 'Bad_Bucket'"),
    (("ckpt-test", "../etc"), "bad checkpoint prefix '../etc'"),
    (("ckpt-test", ""), "bad checkpoint prefix ''"),
])
def test_bad_bucket_or_prefix(bucket, tmp_path, args, expected):
    src = make_checkpoint(tmp_path, 1, sizes=(10,))
    with pytest.raises(RuntimeUserError, match=expected.replace("(", r"\(").replace(".", r"\.")):
        CheckpointStore(*args).push(str(src), 1)


def test_bad_directory(store, tmp_path):
    with pytest.raises(RuntimeUserError, match="does not exist"):
        store.push(str(tmp_path / "nope"), 1)
    (tmp_path / "empty").mkdir()
    with pytest.raises(RuntimeUserError, match="is empty"):
        store.push(str(tmp_path / "empty"), 1)


@pytest.mark.parametrize("argv,expected", [
    (["checkpoint", "push", "/nonexistent/step-000000000001", "--bucket", "ckpt-test", "--prefix", "j"], "does not exist"),
    (["checkpoint", "list", "--bucket", "missing-bucket-1", "--prefix", "j"], "checkpoint bucket 'missing-bucket-1' does not exist"),
    (["checkpoint", "push", "/tmp/whatever", "--bucket", "ckpt-test", "--prefix", "j"], "cannot tell the step"),
    (["checkpoint", "pull", "--bucket", "ckpt-test"], "no checkpoint prefix"),
    (["checkpoint", "frobnicate"], "invalid choice"),
])
def test_runtime_cli_errors_are_one_line(bucket, s3env, argv, expected):
    env = {**s3env, "DL_IMDS_ENDPOINT": "http://127.0.0.1:9"}
    r = subprocess.run([sys.executable, "-m", "constructs_lib.runtime", *argv], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert expected in r.stderr and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr


def test_runtime_cli_push_list_pull(bucket, s3env, tmp_path):
    make_checkpoint(tmp_path / "ck", 7, sizes=(100, 200))
    env = {**s3env, "DL_CHECKPOINT_BUCKET": bucket, "DL_CHECKPOINT_PREFIX": "jobs/cli",
           "DL_CHECKPOINT_DIR": str(tmp_path / "ck")}
    run = lambda *a: subprocess.run([sys.executable, "-m", "constructs_lib.runtime", *a], cwd=ROOT, env=env,
                                    capture_output=True, text=True, timeout=60)
    r = run("checkpoint", "push")
    assert r.returncode == 0 and "pushed step 7" in r.stdout, r.stderr
    r = run("checkpoint", "list", "--json")
    assert json.loads(r.stdout) == [{"name": "step-000000000007", "step": 7, "complete": True, "bytes": 300}]
    r = run("checkpoint", "pull", "--dir", str(tmp_path / "restore"))
    assert "restored step 7" in r.stdout
