"""The user data, run for real under bash on a fake root: the user data CloudFormation would
deploy (taken from the synthesized template), the bundle the CDK CLI would publish (the staged
asset, zipped, at the bucket and key of the asset manifest), and shims for aws, systemctl,
shutdown and sleep that record their calls."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace

import aws_cdk as cdk
import aws_cdk.aws_ec2 as ec2
import pytest

from constructs_lib import CheckpointBucket, GpuLaunchTemplate
from constructs_lib.bundle import unit_texts
from constructs_lib.runtime import contract
from tests.constructs.userdata_text import evaluate, user_data_text

SHIMS = Path(__file__).parent / "boot_shims"
UNITS = ["dl-nvme-raid0.service", "dl-efa-env.service", "dl-node-agent.service", "dl-job.service"]
# A bash script body: variables, both quotes, a backslash continuation, several lines.
COMMAND = """export RUN="it's $(hostname)"
python train.py --name "$RUN" --sep '\\t' \\
  --epochs 10 && echo "done: \\$HOME stays literal"
"""


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    out = tmp_path_factory.mktemp("cdk.out")
    app = cdk.App(outdir=str(out))
    stack = cdk.Stack(app, "Boot", env=cdk.Environment(region="us-east-1"))
    vpc = ec2.Vpc(stack, "Vpc", max_azs=1, nat_gateways=0, subnet_configuration=[
        ec2.SubnetConfiguration(name="nodes", subnet_type=ec2.SubnetType.PRIVATE_ISOLATED)])
    node = GpuLaunchTemplate(stack, "Node", vpc=vpc, instance_type="p5.48xlarge", multi_node=True)
    node.enable_checkpoints(CheckpointBucket(stack, "Ckpt"), "jobs/boot")
    node.enable_job(cluster="boot", command=COMMAND)
    template = app.synth().get_stack_by_name("Boot").template
    (lt,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::EC2::LaunchTemplate"]
    manifest = json.loads((out / "Boot.assets.json").read_text())
    (asset,) = [a for a in manifest["files"].values() if a["source"]["packaging"] == "zip"]
    (dest,) = asset["destinations"].values()
    bucket, key = evaluate({"Fn::Sub": dest["bucketName"]}), dest["objectKey"]
    s3 = out / "s3"
    (s3 / bucket).mkdir(parents=True)
    staged = out / asset["source"]["path"]
    with zipfile.ZipFile(s3 / bucket / key, "w", zipfile.ZIP_DEFLATED) as z:
        for p in sorted(staged.rglob("*")):
            if p.is_file():
                z.write(p, p.relative_to(staged).as_posix())
    return SimpleNamespace(user_data=user_data_text(lt["Properties"]["LaunchTemplateData"]), s3=s3,
                           url=f"s3://{bucket}/{key}", staged=staged, bucket=bucket, key=key)


class Node:
    """A fake root for one node: the contract's directories and the system paths the bootstrap
    writes, all moved under `root` through their environment variables."""

    def __init__(self, root: Path, deployed):
        self.root, self.deployed = root, deployed
        self.etc, self.run_dir, self.lib = root / "etc/dl-launcher", root / "run/dl-launcher", root / "lib/dl-launcher"
        self.units, self.bin, self.profile = root / "etc/systemd/system", root / "usr/local/bin", root / "etc/profile.d"
        self.log_file = root / "var/log/dl-launcher-bootstrap.log"
        self.calls_log, self.state = root / "calls.log", root / "shim-state"
        self.script = root / "user-data"
        self.script.write_text(deployed.user_data)

    def env(self, path: str = "", **extra: str) -> dict:
        return {"PATH": path or f"{SHIMS}:{os.environ['PATH']}", "HOME": str(self.root),
                "DL_ETC_DIR": str(self.etc), "DL_RUN_DIR": str(self.run_dir), "DL_LIB_DIR": str(self.lib),
                "DL_SCRATCH": str(self.root / "scratch"), "DL_UNIT_DIR": str(self.units), "DL_BIN_DIR": str(self.bin),
                "DL_PROFILE_DIR": str(self.profile), "DL_BOOTSTRAP_LOG": str(self.log_file),
                "SHIM_LOG": str(self.calls_log), "SHIM_STATE": str(self.state), "FAKE_S3": str(self.deployed.s3),
                **extra}

    def boot(self, **env) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(self.script)], env=self.env(**env), capture_output=True, text=True,
                              timeout=60)

    def calls(self, *names: str) -> list[str]:
        lines = self.calls_log.read_text().splitlines() if self.calls_log.exists() else []
        return [c for c in lines if not names or c.split()[0] in names]

    def health(self) -> str:
        return (self.run_dir / "health.d" / "bootstrap").read_text()

    def files(self) -> dict[str, bytes]:
        skip = {self.log_file, self.calls_log}
        return {str(p.relative_to(self.root)): p.read_bytes() for p in sorted(self.root.rglob("*"))
                if p.is_file() and p not in skip and self.state not in p.parents}


@pytest.fixture
def node(tmp_path, deployed):
    return Node(tmp_path, deployed)


def test_good_fetch_installs_and_enables_every_unit_before_starting_any(node, deployed):
    r = node.boot()
    assert r.returncode == 0, r.stdout + r.stderr
    assert node.calls("aws") == [f"aws s3 cp --only-show-errors {deployed.url} {node.run_dir}/bundle.new.zip"]
    systemctl = node.calls("systemctl")
    assert systemctl == ["systemctl daemon-reload", *(f"systemctl enable {u}" for u in UNITS),
                         *(f"systemctl start --no-block {u}" for u in UNITS)], "all enabled, then all started"
    for u in UNITS:
        assert (node.units / u).read_text() == unit_texts()[u]
    assert node.health().startswith(f"ok bundle {deployed.url} installed")
    assert node.calls("shutdown") == []
    # what the node now holds is what the CDK CLI would have published
    installed = {str(p.relative_to(node.lib)): p.read_bytes() for p in node.lib.rglob("*") if p.is_file()}
    staged = {str(p.relative_to(deployed.staged)): p.read_bytes() for p in deployed.staged.rglob("*") if p.is_file()}
    assert installed == staged
    assert os.readlink(node.bin / "dl-torchrun") == str(node.lib / "dl_torchrun.sh")
    assert os.access(node.lib / "dl_torchrun.sh", os.X_OK)
    assert (node.profile / "dl-launcher.sh").read_text().endswith(f". {node.lib}/contract.sh\n")
    # the console got it, and so did the log file
    assert "dl-bootstrap: done" in r.stdout and "dl-bootstrap: done" in node.log_file.read_text()


def test_settings_are_written_as_given(node, deployed):
    assert node.boot().returncode == 0
    env = contract.parse_env((node.etc / "node.env").read_text())
    assert {k: env[k] for k in ("DL_INSTANCE_TYPE", "DL_PROCS_PER_NODE", "DL_SDK", "DL_SCRATCH", "DL_CLUSTER",
                                "DL_BUNDLE_URL", "DL_REGION")} == {
        "DL_INSTANCE_TYPE": "p5.48xlarge", "DL_PROCS_PER_NODE": "8", "DL_SDK": "cuda", "DL_SCRATCH": "/scratch",
        "DL_CLUSTER": "boot", "DL_BUNDLE_URL": deployed.url, "DL_REGION": "us-east-1"}
    assert env["DL_UNITS"].split() == UNITS
    assert contract.parse_env((node.etc / "nvme.env").read_text()) == {
        "MOUNT_POINT": "/scratch", "DLAMI_MOUNT": "replace", "CHUNK_KIB": "512"}
    assert contract.parse_env((node.etc / "efa-sdk.env").read_text()) == {"SDK": "cuda"}
    assert (node.etc / "job.sh").read_text() == COMMAND, "the command, verbatim"


def test_botocore_on_the_node_asks_imds_for_its_credentials_patiently(node, monkeypatch):
    """botocore's own default is one try of 1 s: "no credentials" on a node busy at boot."""
    import botocore.session

    assert node.boot().returncode == 0
    env = contract.parse_env((node.etc / "node.env").read_text())
    for k in ("AWS_METADATA_SERVICE_TIMEOUT", "AWS_METADATA_SERVICE_NUM_ATTEMPTS"):
        monkeypatch.setenv(k, env[k])
    session = botocore.session.Session()
    assert session.get_config_variable("metadata_service_num_attempts") >= 3
    assert session.get_config_variable("metadata_service_timeout") >= 2


def test_the_job_command_runs_as_bash(node):
    assert node.boot().returncode == 0
    (node.root / "python").write_text('#!/bin/sh\nprintf "%s\\n" "python $*"\n')
    (node.root / "python").chmod(0o755)
    r = subprocess.run(["bash", str(node.etc / "job.sh")], capture_output=True, text=True,
                       env={"PATH": f"{node.root}:/usr/bin:/bin", "HOME": "/home/x"})
    host = subprocess.run(["hostname"], capture_output=True, text=True).stdout.strip()
    assert r.stdout == f"python train.py --name it's {host} --sep \\t --epochs 10\ndone: $HOME stays literal\n"


def test_fetch_that_fails_twice_is_retried_with_exponential_backoff(node):
    r = node.boot(AWS_FAILS="2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(node.calls("aws")) == 3
    assert node.calls("sleep") == ["sleep 2", "sleep 4"]
    assert "try 1 of 8" in r.stdout and "try 2 of 8" in r.stdout
    assert node.health().startswith("ok ")
    assert "systemctl start --no-block dl-job.service" in node.calls("systemctl")


def test_backoff_base_is_a_setting(node):
    assert node.boot(AWS_FAILS="3", DL_FETCH_BACKOFF="1").returncode == 0
    assert node.calls("sleep") == ["sleep 1", "sleep 2", "sleep 4"]


def test_fetch_that_always_fails_marks_the_node_failed_and_shuts_it_down(node, deployed):
    r = node.boot(AWS_FAILS="100")
    assert r.returncode != 0
    assert len(node.calls("aws")) == 8
    assert node.calls("sleep") == ["sleep 2", "sleep 4", "sleep 8", "sleep 16", "sleep 32", "sleep 60", "sleep 60"]
    assert node.health() == f"failed could not fetch the node bundle {deployed.url} in 8 tries\n"
    assert node.calls("shutdown") == ["shutdown -h now"]
    assert sum("BOOTSTRAP FAILED" in line for line in r.stdout.splitlines()) == 1
    assert node.calls("systemctl") == [], "nothing half-installed is started"
    assert not node.units.exists() and not (node.lib / "install.sh").exists()
    assert not list(node.run_dir.glob("bundle.new*"))


def test_a_failing_unit_does_not_keep_the_others_from_starting(node):
    r = node.boot(SHIM_FAIL="systemctl start --no-block dl-nvme-raid0.service")
    assert r.returncode == 0
    starts = [c for c in node.calls("systemctl") if " start " in c]
    assert starts == [f"systemctl start --no-block {u}" for u in UNITS]
    assert node.health().startswith("degraded ") and "install.sh" in node.health()
    assert node.calls("shutdown") == []


def test_running_it_twice_changes_nothing(node):
    assert node.boot().returncode == 0
    first_files, first_calls = node.files(), node.calls()
    node.calls_log.unlink()
    r = node.boot()
    assert r.returncode == 0, r.stdout + r.stderr
    assert node.files() == first_files
    assert node.calls() == first_calls, "the same idempotent steps: install, enable, start"
    assert node.health().startswith("ok ")


def test_without_aws_cli_or_unzip_python_and_boto3_do_it(tmp_path, deployed):
    """The fallbacks, against a real S3 API (moto_server): PATH holds only what a minimal node has."""
    from moto.server import ThreadedMotoServer
    import boto3

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "cat", "chmod", "cp", "dirname", "basename", "mkdir", "mktemp", "mv", "rm", "tee", "install",
                 "ln"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    (bin_dir / "python3").symlink_to(Path(sys.executable).parent / "python3")
    for shim in ("systemctl", "shutdown", "sleep", "_record"):
        (bin_dir / shim).symlink_to(SHIMS / shim)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        endpoint = "http://127.0.0.1:%d" % server.get_host_and_port()[1]
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        s3.create_bucket(Bucket=deployed.bucket)
        s3.upload_file(str(deployed.s3 / deployed.bucket / deployed.key), deployed.bucket, deployed.key)
        root = tmp_path / "root"
        root.mkdir()
        n = Node(root, deployed)
        r = n.boot(path=str(bin_dir), AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="x")
    finally:
        server.stop()
    assert r.returncode == 0, r.stdout + r.stderr
    assert n.health().startswith("ok "), r.stdout
    assert (n.lib / "install.sh").is_file() and (n.units / "dl-job.service").is_file()



def test_a_second_run_that_cannot_fetch_leaves_a_working_node_alone(node):
    assert node.boot().returncode == 0
    first_files = node.files()
    node.calls_log.unlink()
    r = node.boot(AWS_FAILS="100")
    assert r.returncode != 0
    assert node.calls("shutdown") == [] and node.calls("systemctl") == []
    assert node.health().startswith("degraded could not fetch the node bundle")
    after = node.files()
    assert after.pop("run/dl-launcher/health.d/bootstrap") != first_files.pop("run/dl-launcher/health.d/bootstrap")
    assert after == first_files


def test_the_user_data_itself_is_shellcheck_clean(deployed, tmp_path):
    path = tmp_path / "user-data"
    path.write_text(deployed.user_data)
    shellcheck = shutil.which("shellcheck", path=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    # The contract's names come whole (SC2034: the bootstrap uses only some of them).
    r = subprocess.run([shellcheck, "-e", "SC2034", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout
