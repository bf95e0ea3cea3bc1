"""`-c bench=PLAN_FILE`: the benchmark stack synthesized through the app (cdk-nag runs on every
synth), checked with assertions, cfn-lint and checkov; bad context refused in one line; and the
node's user data run for real with shims for shutdown and the AWS CLI, its runner writing into
moto_server."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from dl_selector.bench.collect import judge
from dl_selector.bench.contract import Plan, PlannedCandidate, result_key, started_key
from tests.cdk_checks import cfn_lint, checkov

CANDIDATES = (("g5.xlarge", 1.006, 0.45), ("g6.xlarge", 0.8048, 0.36))


def _plan(tmp_path: Path, market: str = "spot", command: str = "python3 -m dl_selector.bench.reference",
          candidates=CANDIDATES) -> Path:
    cands = tuple(PlannedCandidate(instance_type=t, price_per_hour=sp if market == "spot" else od, price_source="t",
                                   cost_usd=0.1, modelled_samples_per_second=500.0, uncertainty=0.2, basis="measured",
                                   accelerators="1 x GPU", on_demand_per_hour=od, spot_per_hour=sp,
                                   max_price_per_hour=od, worst_cost_usd=od / 3) for t, od, sp in candidates)
    plan = Plan(name="demo", profile="cost-efficient-training", region="us-west-2", market=market, minutes=20,
                command=command, candidates=cands, total_cost_usd=0.2, max_cost_usd=None,
                catalog_as_of="2026-11-22", created="2026-11-23T00:00Z", worst_total_cost_usd=0.6)
    path = tmp_path / "plan.json"
    path.write_text(plan.to_json())
    return path


def _synth(tmp_path: Path, context: dict) -> tuple[int, str]:
    import app
    out = tmp_path / "cdk.out"
    code = app.main(context, str(out))
    return code, out


@pytest.fixture(scope="module")
def spot_template(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    code, out = _synth(tmp, {"bench": str(_plan(tmp))})
    assert code == 0
    path = out / "dl-bench-demo.template.json"
    return path, json.loads(path.read_text())


def _of_type(template: dict, kind: str) -> dict:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == kind}


def _user_data(lt: dict) -> str:
    parts = lt["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]["Fn::Join"][1]
    return "".join(p if isinstance(p, str) else "<token>" for p in parts)


def test_one_self_terminating_instance_per_candidate(spot_template):
    _, t = spot_template
    lts = _of_type(t, "AWS::EC2::LaunchTemplate")
    instances = _of_type(t, "AWS::EC2::Instance")
    assert len(lts) == len(instances) == len(CANDIDATES)
    by_type = {lt["Properties"]["LaunchTemplateData"]["InstanceType"]: lt for lt in lts.values()}
    assert sorted(by_type) == sorted(c[0] for c in CANDIDATES)
    for name, od, _ in CANDIDATES:
        data = by_type[name]["Properties"]["LaunchTemplateData"]
        assert data["InstanceInitiatedShutdownBehavior"] == "terminate"
        assert data["MetadataOptions"]["HttpTokens"] == "required"
        assert data["BlockDeviceMappings"][0]["Ebs"]["Encrypted"] is True
        assert "KeyName" not in data  # no SSH: SSM only
        spot = data["InstanceMarketOptions"]
        assert spot["MarketType"] == "spot"
        assert spot["SpotOptions"] == {"InstanceInterruptionBehavior": "terminate", "MaxPrice": f"{od:g}",
                                       "SpotInstanceType": "one-time"}
        script = _user_data(by_type[name])
        backstop = script.index("shutdown -h +20 ")
        runner = script.index("-m dl_selector.bench.runner")
        assert backstop < script.index("aws s3 cp") < runner < script.rindex("shutdown -h now")
        assert f"--instance-type {name} --minutes 20 --market spot --region us-west-2" in script
        tags = {tag["Key"]: tag["Value"] for tag in data["TagSpecifications"][0]["Tags"]}
        assert tags["dl-launcher:bench-candidate"] == name and tags["dl-launcher:bench-plan"] == "demo"
    for inst in instances.values():
        props = inst["Properties"]
        assert props["InstanceInitiatedShutdownBehavior"] == "terminate"
        assert "KeyName" not in props
        tags = {tag["Key"]: tag["Value"] for tag in props["Tags"]}
        assert tags["dl-launcher:bench-plan"] == "demo" and tags["dl-launcher:bench-candidate"] in by_type


def test_the_role_writes_results_under_the_prefix_and_reads_only_its_asset(spot_template):
    _, t = spot_template
    (policy,) = [p for p in _of_type(t, "AWS::IAM::Policy").values() if "Identity" in p["Properties"]["Roles"][0]["Ref"]]
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    actions = sorted(s["Action"] for s in statements)
    assert actions == ["s3:GetObject", "s3:PutObject"]
    put = next(s for s in statements if s["Action"] == "s3:PutObject")
    assert put["Resource"]["Fn::Join"][1][1] == "/bench/demo/*"
    get = next(s for s in statements if s["Action"] == "s3:GetObject")
    assert get["Resource"]["Fn::Join"][1][-1].endswith(".zip")  # one object, not the staging bucket
    outputs = t["Outputs"]
    assert "ResultsBucket" in outputs and outputs["ResultsPrefix"]["Value"] == "bench/demo"
    collect = outputs["CollectCommand"]["Value"]["Fn::Join"][1]
    assert collect[0] == "python -m dl_selector bench collect --bucket " and collect[2].startswith(" --prefix bench/demo ")
    assert outputs["Candidates"]["Value"] == "g5.xlarge,g6.xlarge"
    assert "Values=demo" in outputs["InstancesCommand"]["Value"] and "Instances" in outputs
    # The results bucket: encrypted, TLS-only, versioned, access-logged, kept after cdk destroy.
    buckets = _of_type(t, "AWS::S3::Bucket")
    (results,) = [b for b in buckets.values() if "LoggingConfiguration" in b["Properties"]]
    assert results["DeletionPolicy"] == "Retain" and results["Properties"]["VersioningConfiguration"]["Status"] == "Enabled"
    assert results["Properties"]["BucketEncryption"]
    tls = [st for p in _of_type(t, "AWS::S3::BucketPolicy").values() for st in p["Properties"]["PolicyDocument"]["Statement"]]
    assert any(st["Effect"] == "Deny" and st["Condition"] == {"Bool": {"aws:SecureTransport": "false"}} for st in tls)


def test_arm_and_neuron_candidates_get_their_own_dlami_and_python(tmp_path):
    plan = _plan(tmp_path, market="on-demand", candidates=(("g5g.xlarge", 0.42, 0.2), ("trn1.2xlarge", 1.34, 0.5)))
    code, out = _synth(tmp_path, {"bench": str(plan)})
    assert code == 0
    t = json.loads((out / "dl-bench-demo.template.json").read_text())
    images = " ".join(str(p.get("Default", "")) for p in t.get("Parameters", {}).values())
    assert "/aws/service/deeplearning/ami/arm64/" in images and "/aws/service/neuron/dlami/" in images
    scripts = {lt["Properties"]["LaunchTemplateData"]["InstanceType"]: _user_data(lt)
               for lt in _of_type(t, "AWS::EC2::LaunchTemplate").values()}
    assert "aws_neuronx_venv_pytorch" in scripts["trn1.2xlarge"]
    assert "aws_neuronx_venv_pytorch" not in scripts["g5g.xlarge"]
    _shellcheck(tmp_path, scripts["trn1.2xlarge"])


def test_on_demand_plan_has_no_spot_options(tmp_path):
    code, out = _synth(tmp_path, {"bench": str(_plan(tmp_path, market="on-demand"))})
    assert code == 0
    t = json.loads((out / "dl-bench-demo.template.json").read_text())
    for lt in _of_type(t, "AWS::EC2::LaunchTemplate").values():
        assert "InstanceMarketOptions" not in lt["Properties"]["LaunchTemplateData"]


def test_every_policy_is_one_aws_documents(spot_template):
    """Issue 35, item 1: the bench stack's policies against AWS's service authorization reference."""
    from tests.iam_reference import check_template, policy_count

    _, t = spot_template
    assert policy_count(t) >= 1
    problems = check_template(t, "bench")
    assert not problems, "\n".join(problems)


def test_cfn_lint_and_checkov_are_clean(spot_template):
    path, _ = spot_template
    cfn_lint([path])
    checkov([path])


def _shellcheck(tmp_path: Path, text: str) -> None:
    script = tmp_path / "ud.sh"
    script.write_text(text)
    r = subprocess.run([str(Path(sys.executable).parent / "shellcheck"), str(script)], capture_output=True,
                       text=True, check=False)
    assert r.returncode == 0, r.stdout


def test_user_data_passes_shellcheck(spot_template, tmp_path):
    _, t = spot_template
    _shellcheck(tmp_path, _user_data(next(iter(_of_type(t, "AWS::EC2::LaunchTemplate").values()))))


@pytest.mark.parametrize("mutate, context, words", [
    (None, {"bench": "missing-plan.json"}, "cannot read bench plan file"),
    # a hand-edited cap would become the spot maximum price while the summary says the catalog's
    (lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "candidates": [
        {**c, "max_price_per_hour": 9999} for c in json.loads(p.read_text())["candidates"]]})), {},
     "max_price_per_hour=9999, but the catalog's on-demand price in "),
    (lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "candidates": [
        {**c, "max_price_per_hour": None} for c in json.loads(p.read_text())["candidates"]]})), {},
     "max_price_per_hour=None, but the catalog's on-demand price"),
    (lambda p: p.write_text("{"), {}, "not valid JSON"),
    (lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "minutes": 0})), {}, "minutes 0"),
    (lambda p: p.write_text(json.dumps({k: v for k, v in json.loads(p.read_text()).items() if k != "command"})), {},
     "the plan: missing key 'command'"),
    (lambda p: p.write_text(p.read_text().replace("g6.xlarge", "g6.xlarg")), {}, "closest: g6.xlarge"),
    (None, {"profile": "multi-node-training"}, "drop profile"),
    (None, {"nodes": "2"}, "drop nodes"),
    (None, {"bech": "x"}, "closest: bench"),
])
def test_bad_bench_context_is_one_line_and_no_template(tmp_path, capsys, mutate, context, words):
    plan = _plan(tmp_path)
    if mutate:
        mutate(plan)
    code, out = _synth(tmp_path, {"bench": str(plan), **context})
    err = capsys.readouterr().err
    assert code == 2 and words in err, err
    assert len([line for line in err.splitlines() if line.startswith("error:")]) == 1 and "Traceback" not in err
    assert not list(Path(out).glob("*.template.json")) if Path(out).exists() else True


# ---- the node's user data, run for real -----------------------------------------------------------

def _shims(tmp_path: Path, asset_zip: Path, fetch_ok: bool = True) -> Path:
    shims = tmp_path / "shims"
    shims.mkdir()
    calls = tmp_path / "calls"
    files = {
        "shutdown": f'#!/bin/bash\necho "shutdown $*" >> {calls}\n',
        # aws s3 cp [opts] SRC DEST: the asset comes from the local zip CDK would have uploaded.
        "aws": (f'#!/bin/bash\necho "aws $*" >> {calls}\n' +
                (f'cp {asset_zip} "${{@: -1}}"\n' if fetch_ok else 'echo "fatal error: 403 Forbidden" >&2; exit 1\n')),
        "python3": f'#!/bin/bash\nexec {sys.executable} "$@"\n',
    }
    for name, text in files.items():
        (shims / name).write_text(text)
        (shims / name).chmod(stat.S_IRWXU)
    return shims


@pytest.fixture
def moto_s3():
    from moto.server import ThreadedMotoServer
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    import uuid

    import boto3
    s3 = boto3.client("s3", region_name="us-west-2", endpoint_url=url)
    bucket = f"results-{uuid.uuid4().hex[:12]}"  # moto's state outlives one server: a bucket per test
    s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    yield url, s3, bucket
    server.stop()


def _asset_zip(tmp_path: Path) -> Path:
    from constructs_lib.bench_node import build_runner_asset
    build_runner_asset(str(tmp_path / "asset"))
    return Path(shutil.make_archive(str(tmp_path / "asset"), "zip", tmp_path / "asset"))


def _render(tmp_path: Path, command: str, bucket: str) -> Path:
    from constructs_lib.bench_node import user_data_script
    from dl_selector.catalog import load_catalog
    script = tmp_path / "user-data.sh"
    script.write_text(user_data_script(asset_url="s3://cdk-assets/runner.zip", bucket=bucket, prefix="bench/demo",
                                       facts=load_catalog().get("g5.xlarge"), minutes=20, market="spot",
                                       region="us-west-2", command=command))
    return script


def _boot(tmp_path: Path, script: Path, shims: Path, url: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update({"PATH": f"{shims}:{env['PATH']}", "AWS_ENDPOINT_URL": url, "DL_BENCH_DIR": str(tmp_path / "opt"),
                "DL_BENCH_LOG": str(tmp_path / "dl-bench.log"), "DL_BENCH_BACKOFF": "0",
                "AWS_EC2_METADATA_SERVICE_ENDPOINT": "http://127.0.0.1:9"})
    return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=180, check=False,
                          cwd=tmp_path)


def test_user_data_runs_the_reference_benchmark_and_powers_off(tmp_path, moto_s3):
    url, s3, bucket = moto_s3
    command = ("python3 -m dl_selector.bench.reference --device cpu --model resnet50 --width-div 16 --image-size 64 "
               "--batch 4 --warmup-steps 1 --steps-per-window 2 --windows 3 --precision fp32 --threads 1")
    r = _boot(tmp_path, _render(tmp_path, command, bucket), _shims(tmp_path, _asset_zip(tmp_path)), url)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls[0] == "shutdown -h +20 dl-launcher: benchmark time limit"  # the backstop, before anything else
    assert calls[1].startswith("aws s3 cp --only-show-errors --region us-west-2 s3://cdk-assets/runner.zip")
    assert calls[-1] == "shutdown -h now"
    assert s3.get_object(Bucket=bucket, Key=started_key("bench/demo", "g5.xlarge"))
    text = s3.get_object(Bucket=bucket, Key=result_key("bench/demo", "g5.xlarge"))["Body"].read().decode()
    outcome = judge("g5.xlarge", 20, text, None, "s3://results/")
    assert outcome.measurement and outcome.measurement["windows"] == 3, outcome.reason
    assert outcome.measurement["labels"]["model"] == "resnet50"
    assert "dl-bench samples_per_second=" in (tmp_path / "dl-bench.log").read_text()  # the console keeps it


def test_user_data_that_cannot_fetch_the_runner_powers_off_at_once(tmp_path, moto_s3):
    url, s3, bucket = moto_s3
    r = _boot(tmp_path, _render(tmp_path, "echo never", bucket), _shims(tmp_path, tmp_path / "none.zip", fetch_ok=False), url)
    assert r.returncode == 1
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls[0].startswith("shutdown -h +20") and calls[-1] == "shutdown -h now"
    assert sum(c.startswith("aws s3 cp") for c in calls) == 5  # retried
    assert s3.list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0
