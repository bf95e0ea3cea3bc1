"""Issue 23, data staging: `-c data=s3://...` is staged onto the node's scratch by the real AWS CLI
(`aws s3 sync`, from .venv-awscli, as the DLAMI's CLI v2 runs it) from moto_server, before the
job's first generation; a kill mid-staging is resumed without fetching finished objects again;
the node role may read exactly the prefixes; a dataset that cannot fit fails before a byte moves."""
from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import aws_cdk as cdk
import boto3
import pytest
from aws_cdk.assertions import Template

from constructs_lib import JobDefinition
from constructs_lib.runtime import contract, staging
from tests.job.deployed import REGION, deploy
from tests.job.test_job_on_node import FAST

ROOT = Path(__file__).resolve().parents[2]
AWS_BIN = ROOT / ".venv-awscli" / "bin"
BUCKET, PREFIX = "team-datasets", "imagenet/train/"
# The command as a user writes it: what it found in DL_DATA_DIR when it started.
COMMAND = """cd "$DL_DATA_DIR/team-datasets/imagenet/train"
find . -type f | sort > "$SIM_OUT/seen"
touch "$SIM_OUT/started"
"""

pytestmark = pytest.mark.skipif(not (AWS_BIN / "aws").exists(), reason="scripts/test.sh installs .venv-awscli")


def _dataset(endpoint: str, objects: int = 40, size: int = 4 * 2**20) -> dict[str, str]:
    """{path under the prefix: sha256}; one object outside the prefix, which must not be staged."""
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name=REGION)
    s3.create_bucket(Bucket=BUCKET)
    want = {}
    for i in range(objects):
        body = os.urandom(size)
        s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}shard-{i:04d}.tar", Body=body)
        want[f"shard-{i:04d}.tar"] = hashlib.sha256(body).hexdigest()
    s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}labels/classes.json", Body=b'{"n": 1000}')
    want["labels/classes.json"] = hashlib.sha256(b'{"n": 1000}').hexdigest()
    s3.put_object(Bucket=BUCKET, Key="imagenet/val/shard-0000.tar", Body=b"validation")
    return want


def _files(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in root.rglob("*") if p.is_file()}


def test_a_booted_node_stages_the_prefix_resumes_after_a_kill_and_starts_the_job_after(tmp_path, moto_endpoint,
                                                                                        monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    want = _dataset(moto_endpoint)
    sim_out = tmp_path / "out"
    sim_out.mkdir()
    (tmp_path / "command.sh").write_text(COMMAND)
    d = deploy({"profile": "single-gpu-training", "job": "own", "command_file": str(tmp_path / "command.sh"),
                "data": f"s3://{BUCKET}/imagenet/train", "env": f"SIM_OUT={sim_out}"}, tmp_path / "cdk.out",
               moto_endpoint)
    node = d.node(tmp_path / "node", extra_env=FAST, path_prefix=[str(AWS_BIN)])
    try:
        boot = node.boot()
        assert boot.returncode == 0, boot.stdout[-3000:] + boot.stderr[-3000:]
        dest = node.dirs["DL_SCRATCH"] / "data" / BUCKET / "imagenet" / "train"

        # Killed (as systemd restarts a unit) once a few objects are complete (their time set to
        # S3's, the CLI's last step): the transfer tool with it.
        s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name=REGION)
        s3_time = {o["Key"].rsplit("/", 1)[-1]: int(o["LastModified"].timestamp()) * 10**9
                   for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=PREFIX)["Contents"]}

        def complete() -> list[str]:
            return [p.name for p in dest.glob("shard-*.tar") if p.stat().st_mtime_ns == s3_time[p.name]]

        node.start("dl-job.service")
        end = time.monotonic() + 120
        while time.monotonic() < end and len(complete()) < 3:
            time.sleep(0.02)
        node.kill("dl-job.service")
        done = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in dest.glob("shard-*.tar")}
        assert 3 <= len(done) < 40, f"{len(done)} objects staged at the kill: the test needs a kill mid-staging"
        assert not (sim_out / "started").exists(), "the job started before its data was staged"
        time.sleep(1)  # a transfer that outlived its unit would still be writing
        assert {p.name for p in dest.glob("shard-*.tar")} == set(done)

        node.start("dl-job.service")
        assert node.wait("dl-job.service", timeout=180) == contract.EXIT_FINISHED, node.unit_log("dl-job.service")[-4000:]
        # Byte for byte, nothing outside the prefix, no partial files left; the job saw all of it.
        assert _files(dest) == want
        assert not (node.dirs["DL_SCRATCH"] / "data" / BUCKET / "imagenet" / "val").exists()
        seen = (sim_out / "seen").read_text().split()
        assert sorted(s[2:] for s in seen) == sorted(want)
        # Objects complete before the kill were not fetched again (a new download is a new file).
        # The CLI's last two steps, renaming the finished file and then setting its time to S3's,
        # are not one: an object the kill caught between them (up to its 64 concurrent transfers,
        # under load) is newer than S3's to `sync`, and is fetched again; only those may be.
        again = {name: ((dest / name).stat().st_ino, (dest / name).stat().st_mtime_ns) for name in done}
        finished = [n for n in done if done[n][1] == s3_time[n]]
        assert len(finished) >= 3 and not [n for n in finished if again[n] != done[n]], (finished, done, again)
        health = (node.dirs["DL_RUN_DIR"] / "health.d" / "staging").read_text()
        assert health.startswith("ok staged 1 dataset(s)"), health
        log = node.unit_log("dl-job.service")
        assert f"staging s3://{BUCKET}/{PREFIX}:" in log and "objects" in log and "MiB/s" in log, log[-3000:]
    finally:
        node.stop()


def test_a_dataset_larger_than_scratch_fails_before_a_byte_moves(tmp_path, moto_endpoint, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("DL_SCRATCH", str(tmp_path / "scratch"))
    (tmp_path / "scratch").mkdir()
    _dataset(moto_endpoint, objects=3, size=2**20)
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name=REGION)
    real = staging.shutil.disk_usage(tmp_path)
    # A scratch volume with 2 MiB free: the dataset (3 MiB and a bit) cannot fit.
    monkeypatch.setattr(staging.shutil, "disk_usage", lambda p: real._replace(free=2 * 2**20))
    ran = []
    with pytest.raises(staging.StagingError) as e:
        staging.stage([(BUCKET, PREFIX)], s3=s3, emit=print, run=lambda *a, **k: ran.append(a) or (0, []))
    assert e.value.final and not ran
    assert f"the data is 3.0 MiB (3.0 MiB still to fetch); {tmp_path / 'scratch'} has 2.0 MiB free of" in str(e.value)
    assert "Fix: stage a smaller prefix, pick a type with more NVMe" in str(e.value)
    assert not (tmp_path / "scratch" / "data").exists()


def test_an_empty_or_unreadable_prefix_is_final_with_the_prefix_named(tmp_path, moto_endpoint):
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name=REGION)
    s3.create_bucket(Bucket=BUCKET)
    with pytest.raises(staging.StagingError, match=r"s3://team-datasets/nothing/ holds no objects") as e:
        staging.plan([(BUCKET, "nothing/")], s3)
    assert e.value.final
    with pytest.raises(staging.StagingError, match=r"s3://no-such-bucket-here/x/: NoSuchBucket") as e:
        staging.plan([("no-such-bucket-here", "x/")], s3)
    assert e.value.final


def test_progress_lines_count_objects_and_bytes_of_the_sync_output():
    ds = staging.Dataset("s3://b/p/", "b", "p/", "/d", {"a": 3 * 2**30, "b/c": 2**30})
    lines: list[str] = []
    clock = iter([0.0, 5.0, 20.0, 20.0, 30.0, 30.0]).__next__
    prog = staging.Progress(ds, ds.sizes, lines.append, every=15.0, clock=clock)
    prog.line("download: s3://b/p/b/c to /d/b/c")          # at 5 s: no line yet
    prog.line("download: s3://b/p/a to /d/a")              # at 20 s: one line
    prog.line("delete: /d/a.1a2B3c4D")
    assert lines == ["staging s3://b/p/: 2 of 2 objects, 4.00 of 4.00 GiB, 205 MiB/s"]
    assert prog.say(final=True).endswith("done in 30 s")


def test_the_node_role_reads_exactly_the_prefixes():
    stack = cdk.Stack(cdk.App(), "S", env=cdk.Environment(region="us-east-1"))
    import aws_cdk.aws_iam as iam
    role = iam.Role(stack, "Node", assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"))
    job = JobDefinition(stack, "Job", cluster="c", command="python train.py",
                        data=["s3://team-datasets/imagenet/train", "s3://team-datasets/imagenet/labels/", "s3://other-bucket"])
    job.grant_run(role)
    (policy,) = Template.from_stack(stack).find_resources("AWS::IAM::Policy").values()
    text = json.dumps(stack.resolve(policy["Properties"]["PolicyDocument"]["Statement"]))
    assert '"Resource": [{"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, ' \
           '":s3:::team-datasets/imagenet/train/*"]]}' in text
    assert ":s3:::team-datasets/imagenet/labels/*" in text and ":s3:::other-bucket/*" in text
    # Listing is held to the prefixes; the whole-bucket dataset lists its whole bucket.
    assert '"StringLike": {"s3:prefix": ["imagenet/train/*", "imagenet/labels/*"]}' in text
    assert text.count('"s3:ListBucket"') == 2
    assert "s3:PutObject" not in text and "s3:DeleteObject" not in text and "s3:*" not in text


@pytest.mark.parametrize("owner,expected", [(None, {"Ref": "AWS::AccountId"}), ("210987654321", "210987654321")])
def test_the_node_reads_data_only_from_buckets_of_the_owner(owner, expected):
    """Issue 35: a bucket ARN names no account; s3:ResourceAccount makes S3 refuse a bucket of any
    other account, for boto3's listing and the AWS CLI's sync alike (which has no
    --expected-bucket-owner): the stack's own account unless data_owner names another."""
    import aws_cdk.aws_iam as iam
    stack = cdk.Stack(cdk.App(), "S", env=cdk.Environment(region="us-east-1"))
    role = iam.Role(stack, "Node", assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"))
    job = JobDefinition(stack, "Job", cluster="c", command="python train.py", data_owner=owner,
                        data=["s3://team-datasets/imagenet/train", "s3://other-bucket"])
    job.grant_run(role)
    (policy,) = Template.from_stack(stack).find_resources("AWS::IAM::Policy").values()
    data = [st for st in policy["Properties"]["PolicyDocument"]["Statement"]
            if "datasets" in json.dumps(st["Resource"]) or "other-bucket" in json.dumps(st["Resource"])]
    assert len(data) == 3  # the objects, and each bucket's listing
    assert all(st["Condition"]["StringEquals"] == {"s3:ResourceAccount": expected} for st in data), data


def test_a_data_owner_that_is_no_account_is_refused():
    from constructs_lib.validation import ConfigurationError
    with pytest.raises(ConfigurationError, match="data_owner '1234' is not an AWS account id"):
        JobDefinition(cdk.Stack(cdk.App(), "S"), "Job", cluster="c", command="x", data=["s3://b1x/p"], data_owner="1234")


def test_staging_runs_once_per_boot_not_at_every_generation(tmp_path, monkeypatch):
    """The supervisor prepares the revision at every generation; a 512-node cluster would list
    every prefix 512 times a generation. The marker lives in the run directory (tmpfs), so a
    reboot syncs again, and a kill mid-staging leaves none."""
    from constructs_lib.runtime.jobdef import Definition, NodeJob

    monkeypatch.setenv("DL_RUN_DIR", str(tmp_path / "run"))
    calls = []
    monkeypatch.setattr(staging, "stage", lambda sources, **kw: calls.append(sources))
    job = NodeJob(log=print, client=lambda *a, **k: None)
    d = Definition("0" * 64, "python train.py", None, {}, {}, None, None, ("s3://team-datasets/imagenet/train/",))
    for _ in range(3):
        job.prepare_data(d, print)
    assert calls == [[(BUCKET, PREFIX)]]
    monkeypatch.setenv("DL_RUN_DIR", str(tmp_path / "after-reboot"))
    job.prepare_data(d, print)
    assert len(calls) == 2
    monkeypatch.setattr(staging, "stage", lambda sources, **kw: (_ for _ in ()).throw(staging.StagingError("slow")))
    monkeypatch.setenv("DL_RUN_DIR", str(tmp_path / "killed"))
    with pytest.raises(Exception, match="staging the data: slow"):
        job.prepare_data(d, print)
    assert not list((tmp_path / "killed").rglob("staged-*"))
