"""Another team adopting the library (issue 26): the wheel, installed into a clean venv outside the
repository, synthesizes examples/consumer_app.py (the documented constructs, ec2.InstanceType,
cdk-nag) with the real CDK CLI on the lowest aws-cdk-lib, constructs and cdk-nag pyproject.toml
admits; its `dl-launcher` runs an AWS verb against moto_server on 127.0.0.1 (issue 35 item 8: the
wheel's CLI crashed on every AWS verb without boto3); then the construct tests run on those floors
too. (The rest of the suite runs on the pinned versions of constraints.txt; one install here, not
two, keeps this test to one pip run.) Issue 40 item 6: the wheel installs only the project's own
top-level names (OWN_NAMES), read from its RECORD and top_level.txt, and the clean venv has no other
top-level module from it: no `selector`, no `stacks`."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CDK = ROOT / "node_modules" / ".bin" / "cdk"
# Every top-level name the wheel may install: the project's own, nothing another project could also
# ship under a generic name (the selector was `selector`, the CDK app's code `stacks`, before issue 40).
OWN_NAMES = {"constructs_lib", "dl_core", "dl_launcher", "dl_selector", "dl_stacks"}
# The suite's own pip installs into the consumer's venv (pip --python): the venv is made without
# pip (ensurepip was a fifth of this test's time), and nothing is byte-compiled ahead (the floors'
# aws-cdk-lib is hundreds of modules; Python compiles the few that are imported).
PIP = ("install", "--quiet", "--disable-pip-version-check", "--no-compile")
CDK_TESTS = ("test_public_api.py", "test_documented_checks.py")  # need pytest alone: one small install


# Runtime dependencies installed as constraints.txt pins them rather than at their floor: the
# suite's moto and the construct tests need the pinned boto3 (and botocore with it).
PINNED = ("boto3",)


def floors() -> dict[str, str]:
    """{distribution: lowest version} from pyproject's runtime ranges (">=X,<Y"), less PINNED."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    found = {}
    for dep in deps:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9.]+),<([0-9.]+)", dep)
        assert m, f"{dep}: a runtime dependency is a range, >=lowest,<next major"
        found[m.group(1)] = m.group(2)
    assert set(PINNED) <= set(found), "a PINNED distribution is a runtime dependency"
    return {d: v for d, v in found.items() if d not in PINNED}


def _run(cmd, *, cwd, timeout=600, env=None) -> subprocess.CompletedProcess:
    out = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert out.returncode == 0, f"{' '.join(map(str, cmd))} failed ({out.returncode}):\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
    return out


def _wheel(tmp: Path) -> Path:
    """Built from a copy, so that the build's own files (build/, *.egg-info) never land in the
    source tree. The copy holds every top-level package and module of the checkout (tests/ and
    app.py too), so that what the wheel leaves out is pyproject's doing, not the copy's."""
    src = tmp / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for path in ROOT.iterdir():
        if path.is_dir() and (path / "__init__.py").is_file():
            shutil.copytree(path, src / path.name, ignore=ignore)
        elif path.suffix == ".py" and path.is_file():
            shutil.copy(path, src / path.name)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", tmp / "dist", src],
         cwd=tmp)
    (wheel,) = (tmp / "dist").glob("dl_launcher-*.whl")
    return wheel


def wheel_top_level(wheel: Path) -> tuple[set[str], set[str]]:
    """(the first path part of every file the wheel's RECORD lists, less its own .dist-info;
    the names its top_level.txt declares)."""
    with zipfile.ZipFile(wheel) as z:
        (record,) = [n for n in z.namelist() if n.endswith(".dist-info/RECORD")]
        info = record.rpartition("/")[0]
        files = [row.split(",")[0] for row in z.read(record).decode().splitlines() if row.strip()]
        declared = set(z.read(f"{info}/top_level.txt").decode().split())
    return {f.split("/")[0].removesuffix(".py") for f in files if not f.startswith(info + "/")}, declared


def installed_top_level(python: Path) -> dict:
    """What the consumer's venv got from the dl-launcher distribution (its installed RECORD), and
    whether `selector` or `stacks` can be imported there at all."""
    code = ("import json, importlib.metadata as m, importlib.util as u;"
            "files = [str(f) for f in m.files('dl-launcher')];"
            "top = {f.split('/')[0].removesuffix('.py') for f in files if not f.startswith(('..', 'dl_launcher-'))};"
            "print(json.dumps({'top': sorted(top), "
            "'importable': [n for n in ('selector', 'stacks') if u.find_spec(n) is not None]}))")
    return json.loads(_run([python, "-c", code], cwd=python.parent).stdout)


def _versions(python: Path) -> dict[str, str]:
    code = ("import json, importlib.metadata as m, constructs_lib;"
            "print(json.dumps({d: m.version(d) for d in ('aws-cdk-lib', 'constructs', 'cdk-nag')} | "
            "{'constructs_lib': constructs_lib.__file__}))")
    return json.loads(_run([python, "-c", code], cwd=python.parent).stdout)


def _consumer_env(venv: Path, *drop: str) -> dict[str, str]:
    """The environment the consumer's python runs in: none of this checkout's Python settings.
    Bytecode goes to one folder beside the venv (PYTHONPYCACHEPREFIX, never into the checkout),
    so that aws-cdk-lib's modules, installed uncompiled, are compiled once for the synth and the
    construct tests, not in every process."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE", *drop)}
    env["PYTHONPYCACHEPREFIX"] = str(venv.parent / "pycache")
    return env


def _synth(python: Path, app_dir: Path, out: str) -> dict:
    """`cdk synth` as the docs show it, in the consumer's folder with the consumer's python."""
    env = _consumer_env(python.parents[1])
    _run([CDK, "synth", "--app", f"{python} consumer_app.py", "-o", out, "-q"], cwd=app_dir, env=env)
    report = json.loads((app_dir / out / "validation-report.json").read_text())
    failures = [r for r in report["pluginReports"] if r.get("conclusion") == "failure"]
    assert not failures, json.dumps(failures, indent=1)[:4000]
    return json.loads((app_dir / out / "TeamCluster.template.json").read_text())


@pytest.mark.skipif(not CDK.exists(), reason="the pinned CDK CLI is installed by scripts/bootstrap.sh")
def test_the_wheel_outside_the_repository_on_the_lowest_aws_cdk_lib(tmp_path):
    wheel = _wheel(tmp_path)
    recorded, declared = wheel_top_level(wheel)
    assert recorded == OWN_NAMES and declared == OWN_NAMES, (recorded, declared)
    venv = tmp_path / "consumer-venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp_path)
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", python, *PIP]
    lowest = floors()
    # constraints.txt less the CDK family (the floors pick their own jsii, schema and assets):
    # everything else as the suite has it.
    cdk_family = ("aws-cdk", "jsii", "publication", "typeguard", "cattrs", "constructs", "cdk-nag")
    others = tmp_path / "constraints-less-cdk.txt"
    others.write_text("".join(line + "\n" for line in (ROOT / "constraints.txt").read_text().splitlines()
                              if not line.lower().startswith(cdk_family)))
    # The wheel first and alone: whatever its CLI needs must come from its own dependencies.
    _run([*pip, "-c", others, wheel, *(f"{d}=={v}" for d, v in lowest.items())], cwd=tmp_path)
    assert installed_top_level(python) == {"top": sorted(OWN_NAMES), "importable": []}
    _aws_verbs(venv / "bin" / "dl-launcher", tmp_path)
    _run([*pip, "-c", others, "pytest"], cwd=tmp_path)
    app_dir = tmp_path / "team-app"
    app_dir.mkdir()
    shutil.copy(ROOT / "examples" / "consumer_app.py", app_dir)

    got = _versions(python)
    assert {d: got[d] for d in lowest} == lowest
    assert got["constructs_lib"].startswith(str(venv)), got  # the wheel's copy, not the checkout
    template = _synth(python, app_dir, "lowest.out")
    types = {r["Type"] for r in template["Resources"].values()}
    assert {"AWS::EC2::LaunchTemplate", "AWS::EC2::PlacementGroup", "AWS::CloudWatch::Dashboard"} <= types, types
    (lt,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::EC2::LaunchTemplate"]
    assert len(lt["Properties"]["LaunchTemplateData"]["NetworkInterfaces"]) == 33  # p5: ENA + 32 EFA

    # The suite's construct tests on the lowest aws-cdk-lib: the checkout's code (pytest puts the
    # repository first on sys.path), this venv's aws_cdk and pytest (as constraints.txt pins it).
    env = _consumer_env(venv, "PYTEST_XDIST_WORKER")
    # Exit 0 is every test passed (none collected would be 5). The consumer app above builds every
    # documented construct on the floors already; these add the public API's every name and the
    # synth-time checks. The rest (bootstrap, RAID, agent, bundle scripts; the cluster and template
    # fixtures, cfn-lint and cdk-nag on them) prove nothing more on the floors.
    _run([python, "-m", "pytest", "-p", "no:cacheprovider", *(f"tests/constructs/{f}" for f in CDK_TESTS)], cwd=ROOT,
         env=env, timeout=900)


def _aws_verbs(console: Path, cwd: Path) -> None:
    """The wheel's own `dl-launcher`, outside the repository, against moto_server: an AWS verb gets
    AWS's answer as one line (no job there), preflight runs its checks; no traceback."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        env = {k: v for k, v in _consumer_env(console.parents[1]).items() if not k.startswith("AWS_")}
        env.update({"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "local",
                    "AWS_SECRET_ACCESS_KEY": "local", "AWS_REGION": "us-east-1", "AWS_CONFIG_FILE": "/dev/null",
                    "AWS_SHARED_CREDENTIALS_FILE": "/dev/null", "AWS_EC2_METADATA_DISABLED": "true"})
        for argv, code, start in ((["status", "nojob"], 2, "error: no stack dl-nojob in us-east-1 (job 'nojob'); "),
                                  (["destroy", "nojob"], 2, "error: no stack dl-nojob in us-east-1"),
                                  (["preflight", "--profile", "single-gpu-training"], 1, "preflight: ")):
            r = subprocess.run([str(console), *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
            both = r.stdout + r.stderr
            assert r.returncode == code and "Traceback" not in both, (argv, r.returncode, both[-3000:])
            assert (r.stderr if code == 2 else r.stdout).startswith(start), (argv, both[-3000:])
    finally:
        server.stop()
