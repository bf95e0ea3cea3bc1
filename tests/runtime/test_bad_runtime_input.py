"""Bad input to the runtime: every mistake through the real CLI exits 2 with one stderr line, and
a malformed or half-written checkpoint in S3 is skipped for the previous complete one, leaving no
temporary directories behind (against moto_server)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest

from constructs_lib.runtime.layout import prefix_problem
from constructs_lib.runtime.store import CheckpointStore, manifest_problem

ROOT = Path(__file__).resolve().parents[2]
NO_IMDS = "http://127.0.0.1:9"  # nothing listens: off EC2
STEP_DIR = "{tmp}/ck/step-000000000001"


def _step_dir(tmp: Path, name: str = "step-000000000001") -> Path:
    d = tmp / "ck" / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "model.pt").write_bytes(b"weights")
    return d


def _symlink_out(tmp: Path) -> None:
    os.symlink("/etc/passwd", _step_dir(tmp) / "passwd")


def _symlinked_dir_out(tmp: Path) -> None:
    (tmp / "outside").mkdir()
    (tmp / "outside" / "secret").write_text("s")
    os.symlink(tmp / "outside", _step_dir(tmp) / "sub")


def _dangling(tmp: Path) -> None:
    os.symlink(tmp / "nowhere", _step_dir(tmp) / "gone")


def _manifest_named_file(tmp: Path) -> None:
    (_step_dir(tmp) / "MANIFEST.json").write_text("{}")


def _a_file(tmp: Path) -> None:
    (tmp / "ck").mkdir()
    (tmp / "ck" / "step-000000000001").write_text("not a directory")


def _dir_is_a_file(tmp: Path) -> None:
    (tmp / "plain-file").write_text("x")


B = ["--bucket", "ckpt-test", "--prefix", "jobs/x"]
# (id, argv, extra env, setup, expected text in the one stderr line)
ROWS = [
    ("step-negative", ["checkpoint", "push", STEP_DIR, "--step", "-1", *B], {}, _step_dir, "'-1' is not a step"),
    ("step-negative-eq", ["checkpoint", "pull", "--step=-5", *B], {}, None, "'-5' is not a step"),
    ("step-huge", ["checkpoint", "push", STEP_DIR, "--step", str(10**12), *B], {}, _step_dir, "is not a step"),
    ("step-enormous", ["checkpoint", "pull", "--step", "9" * 5000, *B], {}, None, "is not a step"),
    ("step-nan", ["checkpoint", "pull", "--step", "nan", *B], {}, None, "'nan' is not a step"),
    ("step-inf", ["checkpoint", "push", STEP_DIR, "--step", "inf", *B], {}, _step_dir, "'inf' is not a step"),
    ("step-exponent", ["checkpoint", "pull", "--step", "1e3", *B], {}, None, "'1e3' is not a step"),
    ("step-hex", ["checkpoint", "pull", "--step", "0x10", *B], {}, None, "'0x10' is not a step"),
    ("step-fraction", ["checkpoint", "pull", "--step", "2.0", *B], {}, None, "'2.0' is not a step"),
    ("step-unicode-digits", ["checkpoint", "pull", "--step", "\uff15", *B], {}, None, "is not a step"),
    ("step-empty", ["checkpoint", "pull", "--step", "", *B], {}, None, "'' is not a step"),
    ("poll-zero", ["agent", "--poll", "0", *B], {}, None, "--poll '0'"),
    ("poll-negative", ["agent", "--poll=-2", *B], {}, None, "--poll '-2'"),
    ("poll-nan", ["agent", "--poll", "nan", *B], {}, None, "--poll 'nan'"),
    ("poll-inf", ["agent", "--poll", "inf", *B], {}, None, "--poll 'inf'"),
    ("poll-too-slow", ["agent", "--poll", "600", *B], {}, None, "at most 60"),
    ("poll-env-garbage", ["agent", *B], {"DL_AGENT_POLL_SECONDS": "fast"}, None, "DL_AGENT_POLL_SECONDS 'fast'"),
    ("poll-env-nan", ["agent", *B], {"DL_AGENT_POLL_SECONDS": "NaN"}, None, "DL_AGENT_POLL_SECONDS 'NaN'"),
    ("off-ec2-no-bucket", ["checkpoint", "list"], {}, None, "not a dl-launcher node"),
    ("off-ec2-no-bucket-says-what", ["checkpoint", "pull"], {}, None, "pass --bucket and --prefix"),
    ("off-ec2-no-prefix", ["checkpoint", "pull", "--bucket", "ckpt-test"], {}, None,
     "no checkpoint prefix: this is not a dl-launcher node"),
    ("off-ec2-job", ["job", *B], {}, None, "this is not a dl-launcher node: no instance metadata"),
    ("prefix-star", ["checkpoint", "list", "--bucket", "ckpt-test", "--prefix", "jobs/*"], {}, None,
     "bad checkpoint prefix 'jobs/*'"),
    ("prefix-question", ["checkpoint", "list", "--bucket", "ckpt-test", "--prefix", "jobs/a?"], {}, None,
     "bad checkpoint prefix 'jobs/a?'"),
    ("prefix-star-env", ["checkpoint", "list"], {"DL_CHECKPOINT_BUCKET": "ckpt-test", "DL_CHECKPOINT_PREFIX": "*"},
     None, "bad checkpoint prefix '*'"),
    ("prefix-dot", ["checkpoint", "list", "--bucket", "ckpt-test", "--prefix", "jobs/./x"], {}, None,
     "bad checkpoint prefix 'jobs/./x'"),
    ("prefix-dotdot", ["checkpoint", "pull", "--bucket", "ckpt-test", "--prefix", "jobs/../other"], {}, None,
     "bad checkpoint prefix"),
    ("prefix-quote", ["checkpoint", "list", "--bucket", "ckpt-test", "--prefix", "jobs/it's"], {}, None,
     "bad checkpoint prefix"),
    ("prefix-slash-only", ["checkpoint", "list", "--bucket", "ckpt-test", "--prefix", "/"], {}, None,
     "bad checkpoint prefix '/'"),
    ("prefix-double-slash", ["checkpoint", "list", "--bucket", "ckpt-test", "--prefix", "jobs//x"], {}, None,
     "bad checkpoint prefix"),
    ("bucket-upper", ["checkpoint", "list", "--bucket", "Ckpt", "--prefix", "jobs/x"], {}, None, "bad bucket name"),
    ("region-bad", ["checkpoint", "list", *B, "--region", "not a region!"], {}, None, "bad region"),
    ("push-symlink-to-etc-passwd", ["checkpoint", "push", STEP_DIR, *B], {}, _symlink_out,
     "passwd is a symlink to '/etc/passwd'"),
    ("push-symlinked-dir-out", ["checkpoint", "push", STEP_DIR, *B], {}, _symlinked_dir_out, "sub is a symlink"),
    ("push-dangling-symlink", ["checkpoint", "push", STEP_DIR, *B], {}, _dangling, "gone is a symlink"),
    ("push-manifest-name", ["checkpoint", "push", STEP_DIR, *B], {}, _manifest_named_file, "MANIFEST.json"),
    ("push-a-file", ["checkpoint", "push", STEP_DIR, *B], {}, _a_file, "does not exist as a directory"),
    ("pull-dir-is-a-file", ["checkpoint", "pull", *B, "--dir", "{tmp}/plain-file"], {}, _dir_is_a_file,
     "cannot use checkpoint directory"),
    # issue 22: control characters in settings (a trailing newline passed a `$`-anchored check, and a
    # directory was created with a BEL in its name), typos with the closest flag or verb
    ("bucket-newline", ["checkpoint", "list", "--bucket", "ckpt-test\n", "--prefix", "jobs/x"], {}, None,
     "--bucket 'ckpt-test\\n' has a control character: not allowed; closest: 'ckpt-test'"),
    ("dir-bel", ["checkpoint", "pull", *B, "--dir", "{tmp}/a\x07b"], {}, None, "--dir"),
    ("region-cr", ["checkpoint", "list", *B, "--region", "us-east-1\r"], {}, None, "control character"),
    ("env-bucket-newline", ["checkpoint", "list", "--prefix", "jobs/x"], {"DL_CHECKPOINT_BUCKET": "ckpt-test\n"},
     None, "DL_CHECKPOINT_BUCKET"),
    ("env-prefix-esc", ["checkpoint", "list", "--bucket", "ckpt-test"], {"DL_CHECKPOINT_PREFIX": "jobs/x\x1b[2J"},
     None, "DL_CHECKPOINT_PREFIX"),
    ("verb-typo", ["checkpoint", "lst", *B], {}, None, "invalid choice: 'lst' (choose from 'push', 'pull', 'list'); "
                                                    "closest: list"),
    ("flag-typo", ["checkpoint", "list", "--buckett", "ckpt-test", "--prefix", "jobs/x"], {}, None,
     "closest: --bucket; flags: --bucket, --prefix, --dir, --region"),
    # the node monitor run where there is no node (a laptop, CI): no IMDS answers
    ("monitor-off-a-node", ["monitor"], {"DL_CLUSTER": "dl-x"}, None,
     "this is not a dl-launcher node: no instance metadata (IMDSv2) at"),
]


@pytest.mark.parametrize("argv,env,setup,expected", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_bad_input_is_one_line_exit_2(bucket, s3env, tmp_path, argv, env, setup, expected):
    if setup:
        setup(tmp_path)
    base = {k: v for k, v in s3env.items() if not k.startswith(("DL_CHECKPOINT_", "DL_AGENT_"))}
    full_env = {**base, "DL_IMDS_ENDPOINT": NO_IMDS, "DL_CHECKPOINT_DIR": str(tmp_path / "ck"), **env}
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    r = subprocess.run([sys.executable, "-m", "constructs_lib.runtime", *argv], cwd=ROOT, env=full_env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr
    assert "Traceback" not in r.stderr and expected in r.stderr, r.stderr
    assert not any("\x07" in p.name for p in tmp_path.rglob("*")), "a directory was created from a bad --dir"


def test_there_are_enough_rows():
    assert len(ROWS) >= 25


def test_nothing_was_uploaded_through_a_refused_symlink(bucket, s3env, tmp_path):
    _symlink_out(tmp_path)
    with pytest.raises(Exception, match="symlink"):
        CheckpointStore(bucket, "jobs/x").push(str(tmp_path / "ck" / "step-000000000001"), 1)
    assert boto3.client("s3").list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0


def test_a_symlink_to_a_file_inside_the_checkpoint_is_pushed_as_that_file(store, tmp_path):
    d = _step_dir(tmp_path)
    os.symlink("model.pt", d / "alias.pt")
    cp = store.push(str(d), 1)
    assert sorted(f["path"] for f in cp.manifest["files"]) == ["alias.pt", "model.pt"]


@pytest.mark.parametrize("prefix", ["*", "jobs/*", "jobs/a?", "jobs/./x", "jobs/../x", ".", "..", "jobs/it's",
                                    "a//b", "jobs/\u00e9", "x" * 513])
def test_prefix_rule_refuses(prefix):
    assert prefix_problem(prefix)


@pytest.mark.parametrize("prefix", ["jobs/llama-7b", "/jobs/x/", "a.b/c_d/(e)!", "jobs/v1.2"])
def test_prefix_rule_allows(prefix):
    assert prefix_problem(prefix) is None


# ---- malformed manifests in S3: treated as incomplete, the previous step restored ----------------
GOOD_FILE = {"path": "model.pt", "size": 4, "sha256": "x", "checksum_type": "FULL_OBJECT", "part_size": 4}


def _m(**over):
    m = {"format": 1, "step": 2, "name": "step-000000000002", "files": [dict(GOOD_FILE)]}
    m.update(over)
    return m


def _f(**over):
    return _m(files=[{**GOOD_FILE, **over}])


MALFORMED = {
    "not-json": b"{not json",
    "not-utf8": b"\xff\xfe\x00",
    "a-list": json.dumps([1, 2]).encode(),
    "a-string": json.dumps("manifest").encode(),
    "null": b"null",
    "deeply-nested": b"[" * 100000 + b"]" * 100000,
    "no-format": json.dumps({k: v for k, v in _m().items() if k != "format"}).encode(),
    "format-2": json.dumps(_m(format=2)).encode(),
    "no-files": json.dumps({k: v for k, v in _m().items() if k != "files"}).encode(),
    "files-a-dict": json.dumps(_m(files={"model.pt": 4})).encode(),
    "files-empty": json.dumps(_m(files=[])).encode(),
    "file-a-string": json.dumps(_m(files=["model.pt"])).encode(),
    "no-step": json.dumps({k: v for k, v in _m().items() if k != "step"}).encode(),
    "step-mismatch": json.dumps(_m(step=7)).encode(),
    "step-a-string": json.dumps(_m(step="2")).encode(),
    "size-negative": json.dumps(_f(size=-1)).encode(),
    "size-a-string": json.dumps(_f(size="4")).encode(),
    "size-a-float": json.dumps(_f(size=4.0)).encode(),
    "size-bool": json.dumps(_f(size=True)).encode(),
    "size-missing": json.dumps(_m(files=[{"path": "model.pt", "sha256": "x"}])).encode(),
    "path-dotdot": json.dumps(_f(path="../../escape")).encode(),
    "path-inner-dotdot": json.dumps(_f(path="a/../../b")).encode(),
    "path-absolute": json.dumps(_f(path="/etc/cron.d/x")).encode(),
    "path-dot": json.dumps(_f(path="./model.pt")).encode(),
    "path-empty-segment": json.dumps(_f(path="a//b")).encode(),
    "path-backslash": json.dumps(_f(path="..\\x")).encode(),
    "path-nul": json.dumps(_f(path="a\x00b")).encode(),
    "path-number": json.dumps(_f(path=5)).encode(),
    "path-manifest": json.dumps(_f(path="MANIFEST.json")).encode(),
    "sha-missing": json.dumps(_m(files=[{"path": "model.pt", "size": 4}])).encode(),
    "checksum-type-odd": json.dumps(_f(checksum_type="MD5")).encode(),
    "composite-part-zero": json.dumps(_f(checksum_type="COMPOSITE", part_size=0)).encode(),
    "part-negative": json.dumps(_f(part_size=-3)).encode(),
    "duplicate-paths": json.dumps(_m(files=[dict(GOOD_FILE), dict(GOOD_FILE)])).encode(),
    "file-under-file": json.dumps(_m(files=[dict(GOOD_FILE), {**GOOD_FILE, "path": "model.pt/x"}])).encode(),
}


@pytest.mark.parametrize("body", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_manifest_is_an_incomplete_checkpoint(store, tmp_path, body):
    d = _step_dir(tmp_path)
    store.push(str(d), 1)
    s3 = boto3.client("s3")
    s3.put_object(Bucket=store.bucket, Key="jobs/test/step-000000000002/model.pt", Body=b"evil")
    s3.put_object(Bucket=store.bucket, Key="jobs/test/step-000000000002/MANIFEST.json", Body=body)
    assert store.latest().step == 1
    assert [(n, c is not None) for n, c in store.list()] == [("step-000000000001", True),
                                                               ("step-000000000002", False)]
    assert not store.has_step(2)
    dst = tmp_path / "dst"
    assert store.pull(str(dst)) == (1, str(dst / "step-000000000001"))
    assert store.pull(str(dst), 2) is None
    assert sorted(p.name for p in dst.iterdir()) == ["step-000000000001"], "no leftovers, nothing outside"
    assert not (tmp_path / "escape").exists()


def test_manifest_problem_accepts_what_push_writes(store, tmp_path):
    cp = store.push(str(_step_dir(tmp_path)), 1)
    assert manifest_problem(json.loads(json.dumps(cp.manifest)), "step-000000000001") is None


def test_malformed_manifest_via_the_cli_restores_the_previous_step(store, s3env, tmp_path):
    store.push(str(_step_dir(tmp_path)), 1)
    boto3.client("s3").put_object(Bucket=store.bucket, Key="jobs/test/step-000000000002/MANIFEST.json",
                                  Body=json.dumps([{"path": "/etc/passwd"}]).encode())
    env = {**s3env, "DL_IMDS_ENDPOINT": NO_IMDS}
    r = subprocess.run([sys.executable, "-m", "constructs_lib.runtime", "checkpoint", "pull", "--bucket", store.bucket,
                        "--prefix", store.prefix, "--dir", str(tmp_path / "dst")], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "restored step 1" in r.stdout, r.stderr


# ---- a failed pull leaves no temporary directories --------------------------------------------
def _tmp_dirs(root: Path) -> list[str]:
    return [p.name for p in root.iterdir() if p.name.startswith(".tmp")] if root.exists() else []


def test_an_exception_mid_download_leaves_no_temp_dir(store, tmp_path):
    store.push(str(_step_dir(tmp_path)), 1)

    def boom(request, **kw):
        if request.method == "GET" and request.url.split("?")[0].endswith("/model.pt"):
            raise RuntimeError("network gone mid-download")

    store.client.meta.events.register_first("before-send.s3.GetObject", boom)
    dst = tmp_path / "dst"
    with pytest.raises(RuntimeError, match="network gone"):
        store.pull(str(dst))
    assert _tmp_dirs(dst) == []


def test_an_interrupt_mid_download_leaves_no_temp_dir(store, tmp_path):
    store.push(str(_step_dir(tmp_path)), 1)

    def interrupt(*a, **kw):
        raise KeyboardInterrupt

    store._download = interrupt
    dst = tmp_path / "dst"
    with pytest.raises(KeyboardInterrupt):
        store.pull(str(dst))
    assert _tmp_dirs(dst) == []


def test_a_missing_object_and_a_failed_check_leave_no_temp_dir(store, tmp_path):
    store.push(str(_step_dir(tmp_path)), 1)
    store.push(str(_step_dir(tmp_path, "step-000000000002")), 2)
    store.push(str(_step_dir(tmp_path, "step-000000000003")), 3)
    s3 = boto3.client("s3")
    s3.delete_object(Bucket=store.bucket, Key="jobs/test/step-000000000003/model.pt")  # 404 on download
    s3.put_object(Bucket=store.bucket, Key="jobs/test/step-000000000002/model.pt", Body=b"tampered")
    dst = tmp_path / "dst"
    assert store.pull(str(dst))[0] == 1
    assert _tmp_dirs(dst) == []


def test_a_failed_rename_leaves_no_temp_dir(store, tmp_path, monkeypatch):
    store.push(str(_step_dir(tmp_path)), 1)
    import constructs_lib.runtime.store as store_mod

    def no_rename(src, dst):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(store_mod.os, "rename", no_rename)
    dst = tmp_path / "dst"
    with pytest.raises(PermissionError):
        store.pull(str(dst))
    monkeypatch.undo()
    assert _tmp_dirs(dst) == []


def test_a_local_copy_that_does_not_verify_is_replaced(store, tmp_path):
    store.push(str(_step_dir(tmp_path)), 1)
    dst = tmp_path / "dst"
    (dst / "step-000000000001").mkdir(parents=True)
    (dst / "step-000000000001" / "model.pt").write_bytes(b"stale!!")
    assert store.pull(str(dst)) == (1, str(dst / "step-000000000001"))
    assert (dst / "step-000000000001" / "model.pt").read_bytes() == b"weights"
    assert _tmp_dirs(dst) == []
