"""python -m constructs_lib.fleet: status for operators, reconcile for them and the local demo."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from constructs_lib.fleet.cli import main
from tests.fleet.conftest import BUCKET, CLUSTER, VCPU_LIMIT, live_instances

ROOT = Path(__file__).resolve().parents[2]


def _status(spec, *extra):
    return main(["status", "--bucket", spec.state_bucket, "--key", spec.state_key, *extra])


def test_status_shows_the_type_the_instances_and_why(cloud, capsys):
    spec = cloud.spec()
    cloud.ec2.unavailable.add("p5.48xlarge")
    cloud.reconcile(cloud.controller(spec))
    capsys.readouterr()
    assert _status(spec) == 0
    out = capsys.readouterr().out
    job, cluster = out.splitlines()[:2]
    assert job.startswith("job: none (no command): the nodes wait for you"), "the job's state comes first"
    assert cluster.startswith(f"cluster {CLUSTER}: current type p5en.48xlarge; 4 running; state of 20")
    for i in live_instances(cloud.raw):
        assert f"  {i['InstanceId']}  p5en.48xlarge  {i['SubnetId']}  launched 20" in out
    assert "last 2 transitions:" in out
    assert "launch-failed    p5.48xlarge: got 0 of 4: InsufficientInstanceCapacity: We currently do not have" in out
    assert "launched         p5en.48xlarge: 4 x p5en.48xlarge (spot) launched together [i-" in out

    assert _status(spec, "--json", "--last", "1") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["instance_type"] == "p5en.48xlarge" and len(report["instances"]) == 4 and not report["stopped"]
    assert [t["kind"] for t in report["transitions"]] == ["launched"]


def test_status_of_a_torn_down_cluster(cloud, capsys):
    spec = cloud.spec()
    ctl = cloud.controller(spec)
    cloud.reconcile(ctl)
    ctl.teardown()
    capsys.readouterr()
    assert _status(spec) == 0
    out = capsys.readouterr().out
    assert f"cluster {CLUSTER}: torn down; 0 running" in out and "torn-down" in out


def test_reconcile_from_a_spec_file(cloud, tmp_path, capsys):
    spec = cloud.spec(nodes=2)
    path = tmp_path / "spec.json"
    path.write_text(spec.to_json())
    assert main(["reconcile", "--spec", str(path)]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert json.loads(line)["kind"] == "launched" and cloud.types() == {"p5.48xlarge": 2}


def test_mistakes_are_one_line_and_exit_2(cloud, tmp_path, capsys):
    spec = cloud.spec()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**json.loads(spec.to_json()), "nodes": 0}))
    for argv, says in [
        (["status"], "the following arguments are required: --bucket, --key"),
        (["stats"], "invalid choice: 'stats'"),
        (["status", "--bucket", BUCKET, "--key", "nothing/here"], "no controller state at s3://dl-fleet-state/nothing/here"),
        (["status", "--bucket", BUCKET, "--key", "k", "--last", "-1"], "--last must be 0 or more"),
        (["reconcile", "--spec", str(tmp_path / "missing.json")], "No such file"),
        (["reconcile", "--spec", str(bad)], "nodes must be a whole number from 1 to 1000, got 0"),
        (["status", "--bucket", "no-such-bucket-here", "--key", "k"], "NoSuchBucket"),
        (["status", "--bucket", BUCKET, "--key", ""], "--key is empty"),
        (["status", "--bucket", " ", "--key", "k"], "--bucket is empty"),
        (["reconcile", "--spec", str(tmp_path)], "is a directory: expected a ClusterSpec JSON file"),
        (["logs", "--job", ""], "--job is empty"),
        (["stats"], "closest: status"),
        (["status", "--bucket", BUCKET, "--key", "k", "--lsat", "2"], "unrecognized arguments: --lsat 2; closest: "
                                                                       "--last; flags: --bucket, --key"),
        (["reconcile", "--spec", str(bad), "again"], "takes no further values"),
    ]:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1, (argv, err)


def test_the_module_runs_as_a_program():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "constructs_lib.fleet", "status"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.startswith("error: python -m constructs_lib.fleet status: the following")
    assert r.stderr.count("\n") == 1


def _short_line(out: str) -> str:
    (line,) = [x for x in out.splitlines() if x.startswith("short: ")]
    return line


def test_a_quota_shortfall_is_one_line_in_status_after_one_reconcile_and_goes_when_it_launches(cloud, capsys):
    """Issue 24: the deploy completes and the controller waits; status must say why, at once."""
    spec = cloud.spec()
    for t in ("p5.48xlarge", "p5en.48xlarge", "p4d.24xlarge"):
        cloud.ec2.unavailable.add(t)
        cloud.ec2.answer[t] = VCPU_LIMIT
    cloud.reconcile(cloud.controller(spec))
    capsys.readouterr()
    assert _status(spec) == 0
    line = _short_line(capsys.readouterr().out)
    assert line.startswith("short: 4 x p4d.24xlarge (spot): quota: VcpuLimitExceeded: You have requested more vCPU "
                           "capacity than your current vCPU limit of 0 allows")
    assert "next: every option again (3, in order) on the next EC2 event or the 1-minute schedule" in line
    assert "dl-launcher preflight" in line and line.endswith(")") and "(since 20" in line
    assert _status(spec, "--json") == 0
    short = json.loads(capsys.readouterr().out)["short"]
    assert short["kind"] == "quota" and short["what"] == "4 x p4d.24xlarge (spot)"
    first = short["since"]

    cloud.ec2.answer.clear()  # capacity, not quota, on the next try: the kind changes, the start stays
    cloud.reconcile(cloud.controller(spec))
    assert _status(spec, "--json") == 0
    short = json.loads(capsys.readouterr().out)["short"]
    assert short["kind"] == "capacity" and short["since"] == first

    cloud.ec2.unavailable.discard("p5en.48xlarge")
    cloud.reconcile(cloud.controller(spec))
    assert _status(spec) == 0
    out = capsys.readouterr().out
    assert "current type p5en.48xlarge" in out and "short: " not in out
    assert _status(spec, "--json") == 0 and json.loads(capsys.readouterr().out)["short"] is None


def test_no_option_within_the_ceiling_is_a_price_shortfall(cloud, capsys):
    spec = cloud.spec(max_price=10.0)
    cloud.reconcile(cloud.controller(spec))
    capsys.readouterr()
    assert _status(spec) == 0
    line = _short_line(capsys.readouterr().out)
    assert line.startswith("short: 4 nodes of any option: price: no option is within the ceiling") and "max_price" in line


def test_status_shows_each_nodes_last_health_verdict_and_why(cloud, capsys):
    from constructs_lib.runtime import contract
    from constructs_lib.runtime.health_gate import mark_for_replacement

    spec = cloud.spec()
    cloud.reconcile(cloud.controller(spec))
    first, second = sorted(i["InstanceId"] for i in live_instances(cloud.raw))[:2]
    # what the boot gate tags (health_gate.conclude and .hold), as the node's role does it
    cloud.raw.create_tags(Resources=[first], Tags=[{"Key": contract.TAG_HEALTH, "Value": "ok: gate passed in 41 s (7 checks)"}])
    assert mark_for_replacement(cloud.raw, second, "efa-devices: 31 of 32 EFA devices", print)
    capsys.readouterr()
    assert _status(spec) == 0
    out = capsys.readouterr().out
    assert f"  {first}  " in out and "health ok: gate passed in 41 s (7 checks)" in out
    assert [line for line in out.splitlines() if second in line and "health replace: efa-devices: 31 of 32" in line]
    assert _status(spec, "--json") == 0
    health = {i["id"]: i["health"] for i in json.loads(capsys.readouterr().out)["instances"]}
    assert health[second] == "replace: efa-devices: 31 of 32 EFA devices"
