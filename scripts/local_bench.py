"""The measured-selection loop, locally: bench plan -> cdk deploy -c bench=... into moto_server on
127.0.0.1 with the real CDK CLI -> each instance's own user data run here (moto boots nothing) ->
bench collect -> bench report -> cdk destroy. No AWS account is touched.

Here the candidates all "run" on this machine's CPU at a tiny size, so their measured figures are
this machine's, not the GPUs': the run proves the plumbing (user data, asset, runner, results,
collect, report, teardown), not the ranking. One candidate is left unbooted, as if spot had no
capacity for it, to show how a failure is reported.
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from local_deploy import (ACCOUNT, ROOT, cdk, existing_vpc, local_env, log, seed_ssm,  # noqa: E402
                          start_moto, toolkit_stack)

from constructs_lib.runtime.contract import TAG_CLUSTER  # noqa: E402

REGION = "us-east-1"
# The reference benchmark at a size a CPU finishes in seconds.
TINY = ("python3 -m dl_selector.bench.reference --device cpu --width-div 16 --image-size 64 --batch 4 "
        "--warmup-steps 1 --steps-per-window 2 --windows 3 --precision fp32 --threads 1")
NOT_EMULATED = [
    "instances do not boot: this script runs each instance's own user data (read back from moto) with shims for "
    "`aws s3 cp` (a real download from moto's S3) and `shutdown` (`now` terminates the instance in moto, as the "
    "launch template's shutdown behaviour terminate would)",
    "spot requests, maximum prices and the instance-initiated shutdown behaviour are accepted but not enforced",
    "the DLAMI parameter is seeded with one of moto's stock AMIs; the benchmark runs on this CPU, not a GPU",
]

AWS_SHIM = '''#!{python}
"""aws s3 cp [--only-show-errors] [--region R] s3://BUCKET/KEY DEST, against moto_server."""
import sys, boto3
args = [a for a in sys.argv[1:] if a != "--only-show-errors"]
with open({calls!r}, "a") as f:
    f.write("aws " + " ".join(sys.argv[1:]) + "\\n")
region = args[args.index("--region") + 1] if "--region" in args else None
src, dest = args[-2], args[-1]
bucket, _, key = src[len("s3://"):].partition("/")
boto3.client("s3", region_name=region).download_file(bucket, key, dest)
'''
SHUTDOWN_SHIM = '''#!{python}
"""shutdown -h +M (recorded: the backstop) or shutdown -h now (terminates the instance in moto)."""
import os, sys, boto3
with open({calls!r}, "a") as f:
    f.write("shutdown " + " ".join(sys.argv[1:]) + "\\n")
if "now" in sys.argv[1:]:
    boto3.client("ec2", region_name={region!r}).terminate_instances(InstanceIds=[os.environ["DL_TEST_INSTANCE_ID"]])
'''


def shims(folder: Path, calls: Path) -> Path:
    folder.mkdir(parents=True)
    for name, text in (("aws", AWS_SHIM), ("shutdown", SHUTDOWN_SHIM)):
        (folder / name).write_text(text.format(python=sys.executable, calls=str(calls), region=REGION))
        (folder / name).chmod(stat.S_IRWXU)
    (folder / "python3").write_text(f'#!/bin/bash\nexec {sys.executable} "$@"\n')
    (folder / "python3").chmod(stat.S_IRWXU)
    return folder


def selector(*args: str, env: dict) -> subprocess.CompletedProcess:
    log("$ python -m dl_selector " + " ".join(args))
    r = subprocess.run([sys.executable, "-m", "dl_selector", *args], cwd=ROOT, env=env, text=True, capture_output=True,
                       check=False)
    out = (r.stdout + r.stderr).strip()
    if out:
        print("\n".join("  " + line for line in out.splitlines()), flush=True)
    if r.returncode != 0:
        raise SystemExit(f"python -m dl_selector {args[0]} {args[1]} failed (exit {r.returncode})")
    return r


def instances(stack: str) -> list[dict]:
    import boto3
    ec2 = boto3.client("ec2", region_name=REGION)
    found = ec2.describe_instances(Filters=[{"Name": f"tag:{TAG_CLUSTER}", "Values": [stack]}])
    return [i for r in found["Reservations"] for i in r["Instances"]]


def boot(instance: dict, work: Path, env: dict) -> int:
    """Run the instance's own user data here, as cloud-init would on first boot."""
    import boto3
    ec2 = boto3.client("ec2", region_name=REGION)
    attr = ec2.describe_instance_attribute(InstanceId=instance["InstanceId"], Attribute="userData")
    script = work / f"{instance['InstanceId']}-user-data.sh"
    script.write_text(base64.b64decode(attr["UserData"]["Value"]).decode())
    calls = work / f"{instance['InstanceId']}-calls"
    shim_dir = shims(work / f"{instance['InstanceId']}-shims", calls)
    node_env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    node_env.update({"PATH": f"{shim_dir}:{env['PATH']}", "DL_BENCH_DIR": str(work / instance["InstanceId"]),
                     "DL_BENCH_LOG": str(work / f"{instance['InstanceId']}.log"),
                     "DL_TEST_INSTANCE_ID": instance["InstanceId"], "AWS_EC2_METADATA_SERVICE_ENDPOINT": "http://127.0.0.1:9"})
    r = subprocess.run(["bash", str(script)], env=node_env, cwd=work, text=True, capture_output=True, timeout=300,
                       check=False)
    for line in calls.read_text().splitlines():
        log(f"    node called: {line}")
    return r.returncode


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--profile", default="cost-efficient-training")
    p.add_argument("--top", default="3")
    a = p.parse_args(argv)
    server, port = start_moto()
    endpoint, env = local_env(port, REGION)
    work = Path(tempfile.mkdtemp(prefix="dl-bench-local-"))
    try:
        log(f"moto_server on {endpoint} (in-process); account {ACCOUNT}, region {REGION}")
        plan_file = work / "bench-plan.json"
        selector("bench", "plan", "--profile", a.profile, "--top", a.top, "--minutes", "20", "--max-cost", "50",
                 "--command", TINY, "--out", str(plan_file), env=env)
        plan = json.loads(plan_file.read_text())
        stack = f"dl-bench-{plan['name']}"
        vpc, subnet, az = existing_vpc(REGION)
        out = work / "cdk.out"
        cdk("synth", "-c", f"bench={plan_file}", "-c", "local=true", "-c", f"vpc_id={vpc}", "-c", f"subnet_ids={subnet}",
            "-c", f"availability_zone={az}", "--quiet", "-o", str(out), env=env)
        template = json.loads((out / f"{stack}.template.json").read_text())
        seed_ssm(template, REGION)
        toolkit_stack(REGION)
        cdk("deploy", "--app", str(out), "--require-approval", "never", "--method=direct", "--no-previous-parameters",
            "--progress", "events", stack, env=env)
        import boto3
        outputs = {o["OutputKey"]: o["OutputValue"] for o in boto3.client("cloudformation", region_name=REGION)
                   .describe_stacks(StackName=stack)["Stacks"][0]["Outputs"]}
        nodes = sorted(instances(stack), key=lambda i: next(
            t["Value"] for t in i["Tags"] if t["Key"] == "dl-launcher:bench-candidate"))
        log(f"\n== {len(nodes)} instance(s) launched by the stack")
        by_type = {}
        for i in nodes:
            name = next(t["Value"] for t in i["Tags"] if t["Key"] == "dl-launcher:bench-candidate")
            by_type[name] = i
            ud = boto3.client("ec2", region_name=REGION).describe_instance_attribute(
                InstanceId=i["InstanceId"], Attribute="userData")["UserData"]["Value"]
            first = base64.b64decode(ud).decode().splitlines()[2]
            log(f"  {name}: {i['InstanceId']} {i['InstanceType']} {i['State']['Name']}; user data begins: {first}")
        skipped = list(by_type)[-1]
        log(f"\n== first boot of each instance ({skipped} left unbooted: no spot capacity)")
        for name, i in by_type.items():
            if name != skipped:
                log(f"  {name}: user data exit {boot(i, work, env)}")
        results = work / "bench-results.json"
        selector("bench", "collect", "--bucket", outputs["ResultsBucket"], "--plan", str(plan_file), "--out",
                 str(results), env=env)
        selector("bench", "report", "--results", str(results), "--out", str(work / "chart.png"), "--markdown",
                 str(work / "report.md"), env=env)
        selector("recommend", "--profile", a.profile, "--throughput", str(results), "--top", "3", env=env)
        states = {i["InstanceId"]: i["State"]["Name"] for i in instances(stack)}
        log(f"\nbefore cdk destroy: {sorted(states.values())}")
        cdk("destroy", "--app", str(out), "--force", stack, env=env)
        states = {i["InstanceId"]: i["State"]["Name"] for i in instances(stack)}
        running = [k for k, v in states.items() if v not in ("terminated", "shutting-down")]
        log(f"after cdk destroy: instances not terminated: {len(running)}")
        kept = [b["Name"] for b in boto3.client("s3", region_name=REGION).list_buckets()["Buckets"] if "results" in b["Name"]]
        log(f"results bucket kept: {', '.join(kept) or 'none'}")
        log("\nwhat moto does not emulate:\n" + "\n".join(f"  - {n}" for n in NOT_EMULATED))
        return 0 if not running else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
        server.stop()


if __name__ == "__main__":
    os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
    sys.exit(main())
