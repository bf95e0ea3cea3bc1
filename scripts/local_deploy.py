"""The main job, locally: `cdk deploy` a profile into moto_server on 127.0.0.1 with the real CDK
CLI, with a training project (yours with --code DIR --command ..., else examples/train_project:
code, setup, env, a secret), the
cluster launched by the capacity controller, its nodes booted from their real user data on this
machine (scripts/simnode.py) and the job run there, its lines read back from CloudWatch Logs;
then `dl-launcher destroy`, and show that the checkpoint bucket survived. With --keep, moto stays
up instead, and the script says how to point `dl-launcher status/logs/destroy` at it.

No AWS account is touched: fake credentials, every endpoint pointed at the local moto_server.
What moto does not emulate is listed at the end of the run (and in the README).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from constructs_lib.runtime.contract import TAG_CLUSTER

ROOT = Path(__file__).resolve().parents[1]
ACCOUNT = "123456789012"  # moto's default account
REGION = "us-east-1"
NOT_EMULATED = [
    "instances do not boot in moto: this script boots each node's real user data on this machine instead "
    "(scripts/simnode.py: a fake root, a fake IMDSv2, one training process per node on the CPU, no RAID 0, no "
    "systemd: units run by their ExecStart)",
    "the CloudWatch agent does not run here: a stand-in ships the job log as the agent's logs section says",
    "EFA: launch templates keep their interface layout, instances get one plain interface",
    "placement groups are accepted and ignored",
    "spot: instances start as ordinary ones; no interruption notices (the tests use a fake IMDS)",
    "SSM Session Manager and EventBridge delivery do nothing",
    "the DLAMI parameter is seeded with one of moto's stock AMIs",
    "no Lambda runs (it would need Docker): this script runs the capacity controller's own code in-process, "
    "with the spec the stack gave the function, where EventBridge would invoke it; and tears the cluster down "
    "itself before cdk destroy (the teardown custom resource is off with -c local=true)",
    "CreateFleet instant always has capacity: the controller's fallback on InsufficientInstanceCapacity is "
    "drilled in tests/fleet with injected errors",
    "a VPC created by the stack cannot be deleted again by moto's CloudFormation (NAT and internet gateways stay), "
    "so this run deploys into an existing VPC (-c vpc_id, subnet_ids, availability_zone)",
    "security-group egress rules are not modelled by moto's CloudFormation (warning above)",
]


def log(msg: str) -> None:
    print(msg, flush=True)


def start_moto():
    import logging
    import warnings

    from moto.server import ThreadedMotoServer

    # moto logs every request and warns about each resource type it does not model; the
    # summary at the end lists what matters.
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    logging.getLogger("moto").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="moto")

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    return server, port


def local_env(port: int, region: str) -> tuple[str, dict]:
    """Point this process (boto3) and the CDK CLI's environment at moto_server, with fake credentials."""
    endpoint = f"http://localhost:{port}"  # moto resolves S3 template URLs only for localhost
    os.environ.update({"AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local", "AWS_DEFAULT_REGION": region,
                       "AWS_REGION": region, "AWS_ENDPOINT_URL": endpoint, "AWS_EC2_METADATA_DISABLED": "true"})
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        os.environ.pop(k, None)
    env = {**os.environ, "CDK_DEFAULT_ACCOUNT": ACCOUNT, "CDK_DEFAULT_REGION": region,
           "AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
           "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20", "NODE_NO_WARNINGS": "1"}
    return endpoint, env


def seed_ssm(template: dict, region: str) -> list[str]:
    """moto refuses /aws/... names over the API; write the DLAMI parameters into its backend."""
    import datetime as dt

    import boto3
    from moto.ssm.models import Parameter, ssm_backends

    image = boto3.client("ec2", region_name=region).describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    backend = ssm_backends[ACCOUNT][region]
    names = []
    for p in template.get("Parameters", {}).values():
        if p.get("Type", "").startswith("AWS::SSM::Parameter::Value") and p.get("Default", "").startswith("/aws/service/"):
            name = p["Default"]
            backend._parameters[name].append(Parameter(
                account_id=ACCOUNT, name=name, value=image, parameter_type="String", description="seeded by dl-launcher",
                allowed_pattern=None, keyid=None, last_modified_date=dt.datetime.now(), version=1,
                data_type="aws:ec2:image"))
            names.append(name)
    return names


def existing_vpc(region: str) -> tuple[str, str, str]:
    """The network a platform team already has: a VPC with a private subnet in one AZ.

    The stack's own new-VPC path deploys into moto too, but moto's CloudFormation cannot delete
    that VPC again (its NAT and internet gateways stay), so the local run uses the stack's
    existing-VPC path and `cdk destroy` comes back clean."""
    import boto3

    ec2 = boto3.client("ec2", region_name=region)
    vpc = ec2.create_vpc(CidrBlock="10.42.0.0/16")["Vpc"]["VpcId"]
    az = f"{region}a"
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.42.16.0/20", AvailabilityZone=az)["Subnet"]["SubnetId"]
    return vpc, subnet, az


def toolkit_stack(region: str) -> None:
    """A minimal stand-in for `cdk bootstrap`: only the staging bucket the CLI uploads large
    templates and assets (the node bundle) to; the legacy synthesizer needs nothing else."""
    import boto3

    cfn = boto3.client("cloudformation", region_name=region)
    template = {
        "Resources": {"StagingBucket": {"Type": "AWS::S3::Bucket", "Properties": {"BucketName": f"cdk-local-staging-{ACCOUNT}"}}},
        "Outputs": {"BucketName": {"Value": {"Ref": "StagingBucket"}},
                    "BucketDomainName": {"Value": {"Fn::GetAtt": ["StagingBucket", "RegionalDomainName"]}},
                    "BootstrapVersion": {"Value": "6"}},
    }
    cfn.create_stack(StackName="CDKToolkit", TemplateBody=json.dumps(template))


def synth_into_moto(context: list[str], *, stack: str, out: Path, env: dict) -> dict:
    """Everything before `cdk deploy`: an existing VPC in moto, `cdk synth` with `context` (-c
    pairs) into it with -c local=true, the DLAMI parameters seeded, the toolkit stand-in.
    Returns the stack's template."""
    vpc, subnet, az = existing_vpc(REGION)
    log(f"existing VPC {vpc}, private subnet {subnet} in {az}")
    cdk("synth", *context, "-c", "local=true", "-c", f"vpc_id={vpc}", "-c", f"subnet_ids={subnet}",
        "-c", f"availability_zone={az}", "--quiet", "-o", str(out), env=env)
    template = json.loads((out / f"{stack}.template.json").read_text())
    for name in seed_ssm(template, REGION):
        log(f"seeded SSM {name}")
    toolkit_stack(REGION)
    return template


def cdk(*args: str, env: dict, check: bool = True) -> subprocess.CompletedProcess:
    cmd = [str(ROOT / "node_modules" / ".bin" / "cdk"), *args]
    log("$ " + " ".join(["cdk", *args]))
    r = subprocess.run(cmd, cwd=ROOT, env=env, text=True, capture_output=True)
    out = (r.stdout + r.stderr).strip()
    if out:
        print("\n".join("  " + line for line in out.splitlines()[-40:]), flush=True)
    if check and r.returncode != 0:
        raise SystemExit(f"cdk {args[0]} failed (exit {r.returncode})")
    return r


def show(stack: str, region: str) -> dict:
    import boto3

    ec2 = boto3.client("ec2", region_name=region)
    cfn = boto3.client("cloudformation", region_name=region)
    s3 = boto3.client("s3", region_name=region)
    iam = boto3.client("iam", region_name=region)
    desc = cfn.describe_stacks(StackName=stack)["Stacks"][0]
    log(f"\nstack {stack}: {desc['StackStatus']}")
    for o in desc.get("Outputs", []):
        log(f"  output {o['OutputKey']}: {o['OutputValue']}")
    reservations = ec2.describe_instances(Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}])
    instances = [i for r in reservations["Reservations"] for i in r["Instances"]]
    log(f"instances ({len(instances)}):")
    for i in instances:
        tags = {t["Key"]: t["Value"] for t in i.get("Tags", [])}
        log(f"  {i['InstanceId']} {i['InstanceType']} {i.get('PrivateIpAddress')} cluster={tags.get(TAG_CLUSTER)}")
    lts = ec2.describe_launch_templates()["LaunchTemplates"]
    log(f"launch templates ({len(lts)}):")
    for lt in lts:
        data = ec2.describe_launch_template_versions(LaunchTemplateId=lt["LaunchTemplateId"])["LaunchTemplateVersions"][0]["LaunchTemplateData"]
        nics = data.get("NetworkInterfaces", [])
        efa = [n for n in nics if n.get("InterfaceType") in ("efa", "efa-only")]
        log(f"  {lt['LaunchTemplateName']}: {data.get('InstanceType')}, {len(efa)} EFA interfaces on cards "
            f"{sorted({n.get('NetworkCardIndex', 0) for n in efa})}, IMDS tokens {data.get('MetadataOptions', {}).get('HttpTokens')}")
    buckets = [b["Name"] for b in s3.list_buckets()["Buckets"]]
    log(f"buckets: {', '.join(buckets)}")
    roles = [r["RoleName"] for r in iam.list_roles()["Roles"]]
    log(f"roles: {', '.join(roles)}")
    return {"instances": instances, "launch_templates": lts, "buckets": buckets, "outputs": desc.get("Outputs", [])}


def show_bundle(stack: str, region: str) -> bool:
    """The node bundle as the CDK CLI published it: the stack's asset parameters (legacy
    synthesizer) name the object in the staging bucket; the node role may read exactly that."""
    import io
    import zipfile

    import boto3

    desc = boto3.client("cloudformation", region_name=region).describe_stacks(StackName=stack)["Stacks"][0]
    params = {p["ParameterKey"]: p["ParameterValue"] for p in desc.get("Parameters", [])}
    buckets = {k[:-len("S3Bucket") - 8]: v for k, v in params.items() if k.startswith("AssetParameters") and "S3Bucket" in k}
    keys = {k[:-len("S3VersionKey") - 8]: v for k, v in params.items() if k.startswith("AssetParameters") and "S3VersionKey" in k}
    s3 = boto3.client("s3", region_name=region)
    found = False
    for asset, bucket in buckets.items():
        key = keys[asset].replace("||", "")
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        if not zipfile.is_zipfile(io.BytesIO(body)):
            log(f"job definition in staging bucket: s3://{bucket}/{key} ({len(body)} bytes: command, setup, env, "
                f"secret ARNs, the code's digest)")
            continue
        names = zipfile.ZipFile(io.BytesIO(body)).namelist()
        if "install.sh" not in names and "constructs_lib/fleet/handler.py" not in names:
            log(f"your code in staging bucket: s3://{bucket}/{key} ({len(body)} bytes: {', '.join(sorted(names))})")
            continue
        if "constructs_lib/fleet/handler.py" in names:
            log(f"capacity controller code in staging bucket: s3://{bucket}/{key} ({len(body)} bytes, "
                f"{len(names)} files)")
            continue
        found = found or "install.sh" in names
        log(f"node bundle in staging bucket: s3://{bucket}/{key} ({len(body)} bytes, {len(names)} files; "
            f"install.sh {'present' if 'install.sh' in names else 'MISSING'}, "
            f"{sum(n.startswith('units/') for n in names)} units, "
            f"{sum(n.startswith('python/') for n in names)} Python files)")
    iam = boto3.client("iam", region_name=region)
    for role in [r for r in iam.list_roles()["Roles"] if "NodeRole" in r["RoleName"]]:
        statements = []
        for name in iam.list_role_policies(RoleName=role["RoleName"])["PolicyNames"]:
            doc = iam.get_role_policy(RoleName=role["RoleName"], PolicyName=name)["PolicyDocument"]
            # moto returns a role's own Policies (from CloudFormation) as Python's repr of the
            # document, not JSON; and one statement may stand alone.
            if isinstance(doc, str):
                import ast
                doc = ast.literal_eval(doc)
            found_st = doc["Statement"]
            statements += found_st if isinstance(found_st, list) else [found_st]
        for bucket in set(buckets.values()):
            on_bucket = [st for st in statements if f":::{bucket}" in json.dumps(st["Resource"])]
            rights = ", ".join(f"{st['Action']} on {st['Resource']}" for st in on_bucket) or "nothing"
            log(f"  role {role['RoleName']} may, in {bucket}: {rights}")
    return found


def controller(stack: str, region: str):
    """The capacity controller as the stack's Lambda would run it: its code, its spec."""
    import boto3

    from constructs_lib.fleet.controller import Controller
    from constructs_lib.fleet.handler import SPEC_ENV
    from constructs_lib.fleet.job_end import JOB_END_ENV, JobEndWatch
    from constructs_lib.fleet.spec import ClusterSpec
    from constructs_lib.fleet.state import StateStore

    lam = boto3.client("lambda", region_name=region)
    for conf in lam.list_functions()["Functions"]:
        name = conf["FunctionName"]
        env = conf.get("Environment", {}).get("Variables", {})
        if SPEC_ENV in env:
            spec = ClusterSpec.from_json(env[SPEC_ENV])
            log(f"capacity controller {name} ({conf['Runtime']}, {conf['Handler']}): {spec.nodes} nodes of "
                + " then ".join(f"{o.instance_type} (${o.price:.2f}/h)" if o.price else o.instance_type
                                for o in spec.options) + f", {spec.market}, ceiling ${spec.max_price:.2f}/h per node")
            store = StateStore(boto3.client("s3", region_name=region), spec.state_bucket, spec.state_key)
            watch = JobEndWatch.from_json(env[JOB_END_ENV]) if JOB_END_ENV in env else None
            return Controller(boto3.client("ec2", region_name=region), spec, store, job_end=watch,
                              log=lambda line: log(f"  controller: {line}")), spec
    raise RuntimeError(f"no capacity controller function in {stack}")


def cluster_instances(region: str, cluster: str) -> list[dict]:
    import boto3

    r = boto3.client("ec2", region_name=region).describe_instances(Filters=[
        {"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster]},
        {"Name": "instance-state-name", "Values": ["pending", "running"]}])
    return [i for res in r["Reservations"] for i in res["Instances"]]


def gang_launch_and_node_loss(stack: str, region: str):
    """What EventBridge would make the controller do: launch the cluster whole, then replace a
    lost node with the same type."""
    import boto3

    ctl, spec = controller(stack, region)
    log("\n== gang launch (the schedule's first reconcile)")
    ctl.reconcile()
    nodes = cluster_instances(region, spec.cluster)
    log(f"cluster {spec.cluster}: {len(nodes)} of {spec.nodes} running, types {sorted({i['InstanceType'] for i in nodes})}")
    lost = nodes[0]["InstanceId"]
    log(f"\n== node loss: terminating {lost} (as a spot reclamation would), then the state-change event's reconcile")
    boto3.client("ec2", region_name=region).terminate_instances(InstanceIds=[lost])
    ctl.reconcile()
    after = cluster_instances(region, spec.cluster)
    log(f"cluster {spec.cluster}: {len(after)} of {spec.nodes} running, types {sorted({i['InstanceType'] for i in after})}; "
        f"replaced {lost}: {lost not in {i['InstanceId'] for i in after}}")
    return ctl, after


PROJECT = ROOT / "examples" / "train_project"
SECRET_VALUE = "local-demo-not-a-real-key-0123456789"
# The demo's own project, when no --code is given: what the README's job runs.
EXAMPLE = {"command": "dl-torchrun train.py", "setup": "pip install -r requirements.txt", "env": "STEPS=60,LR=0.05",
           "secrets": f"WANDB_API_KEY={SECRET_VALUE}"}


def secret_values(text: Optional[str]) -> list[tuple[str, str]]:
    """--secrets NAME=VALUE,...: the values live only in this machine's moto."""
    pairs = []
    for item in (text or "").split(","):
        name, eq, value = item.strip().partition("=")
        if item.strip() and (not eq or not name or not value):
            raise ValueError(f"--secrets {item.strip()!r}: expected NAME=VALUE (the value goes into moto's "
                             "Secrets Manager on this machine, never to AWS)")
        if item.strip():
            pairs.append((name, value))
    return pairs


def job_context(region: str, a: argparse.Namespace) -> list[str]:
    """The project on the nodes: its code, command, setup, env and secrets (each made here in
    moto's Secrets Manager, as you would make yours in your account, and passed by ARN)."""
    import boto3

    ctx = ["-c", f"code={a.code}", "-c", f"command={a.command}"]
    if a.setup:
        ctx += ["-c", f"setup={a.setup}"]
    if a.env:
        ctx += ["-c", f"env={a.env}"]
    if a.checkpoint_dir:
        ctx += ["-c", f"checkpoint_dir={a.checkpoint_dir}"]
    arns = []
    for name, value in secret_values(a.secrets):
        arn = boto3.client("secretsmanager", region_name=region).create_secret(
            Name=f"local/{name.lower()}", SecretString=value)["ARN"]
        log(f"secret in Secrets Manager: {arn}")
        arns.append(f"{name}={arn}")
    if arns:
        ctx += ["-c", f"secrets={','.join(arns)}"]
    if a.nodes:
        ctx += ["-c", f"nodes={a.nodes}"]
    return ctx


def job_on_nodes(stack: str, region: str, endpoint: str, instances: list[dict], spec, code: Path,
                 secrets: list[str], expect: Optional[str]) -> bool:
    """Boot every node of the cluster from its launch template's user data, run the job unit,
    and read the job's log back through the CLI verb."""
    import base64

    import boto3

    from constructs_lib.runtime import contract
    from simnode import SimNode

    ec2 = boto3.client("ec2", region_name=region)
    prefix = next(o for o in spec.options if o.instance_type == instances[0]["InstanceType"])
    data = ec2.describe_launch_template_versions(LaunchTemplateId=prefix.launch_template_id)["LaunchTemplateVersions"][0]
    user_data = base64.b64decode(data["LaunchTemplateData"]["UserData"]).decode()
    checkpoints = next(o["OutputValue"] for o in boto3.client("cloudformation", region_name=region).describe_stacks(
        StackName=stack)["Stacks"][0]["Outputs"] if o["OutputKey"] == "CheckpointBucket")
    root = Path(tempfile.mkdtemp(prefix="dl-nodes-"))
    nodes = []
    log(f"\n== the job on the nodes: booting {len(instances)} nodes from their user data ({len(user_data)} bytes)")
    try:
        for i, inst in enumerate(instances):
            tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
            tags.update({contract.TAG_CHECKPOINT_BUCKET: checkpoints, contract.TAG_CHECKPOINT_PREFIX: f"jobs/{stack[3:]}"})
            node = SimNode(root / inst["InstanceId"], user_data=user_data, endpoint=endpoint,
                           instance_id=inst["InstanceId"], addr=f"127.0.0.{30 + i}", tags=tags, region=region,
                           procs_per_node=1, extra_env={"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"})
            nodes.append(node)
            r = node.boot()
            log(f"node {inst['InstanceId']} (127.0.0.{30 + i}) booted: exit {r.returncode}; "
                f"{(node.dirs['DL_RUN_DIR'] / 'health.d' / 'bootstrap').read_text().strip()[:120]}")
            if r.returncode != 0:
                log(r.stdout[-2000:] + r.stderr[-2000:])
                return False
        for node in nodes:
            node.start("dl-job.service")
        codes = SimNode.wait_all(nodes, "dl-job.service", timeout=300)
        log(f"job unit on every node ended: {codes} (0: the job finished)")
        work = (nodes[0].dirs["DL_SCRATCH"] / "work").resolve()
        shipped = sorted(p.relative_to(work).as_posix() for p in work.rglob("*") if p.is_file())
        log(f"code on {nodes[0].instance_id} in {work.name[:12]}...: {', '.join(shipped)} "
            f"({code} less its .dlignore)")
        log(f"\n== dl-launcher logs {stack[3:]} --region {region}")
        env = {**os.environ}
        r = subprocess.run([sys.executable, "-m", "dl_launcher", "logs", stack[3:], "--region", region],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        lines = r.stdout.splitlines()
        for line in lines:
            log("  " + line)
        leaked = any(v in x for x in lines for v in secrets)
        log(f"secret value in the log: {'YES - this is a bug' if leaked else 'no'}")
        return all(c == 0 for c in codes) and not leaked and (expect is None or any(expect in x for x in lines))
    finally:
        for node in nodes:
            node.stop()
        shutil.rmtree(root, ignore_errors=True)


def keep(endpoint: str, job: str, ran: bool) -> int:
    """Moto stays up (it lives in this process) until Ctrl-C or SIGTERM; what to run meanwhile."""
    import signal
    import threading

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    log(f"\n== --keep: moto keeps running on {endpoint} with the stack, its nodes and the job's log "
        f"(the job {'finished' if ran else 'FAILED: its log says why'}). From another terminal:")
    log(f"  unset AWS_PROFILE AWS_SESSION_TOKEN; export AWS_ENDPOINT_URL={endpoint} AWS_ACCESS_KEY_ID=local "
        f"AWS_SECRET_ACCESS_KEY=local AWS_REGION={REGION} AWS_EC2_METADATA_DISABLED=true")
    for verb in ("status", "logs", "destroy"):
        log(f"  dl-launcher {verb} {job}")
    log("  (destroy deletes the stack; locally the nodes stay in moto: the stack's teardown is off with -c local=true)")
    log(f"stop it: Ctrl-C here, or kill {os.getpid()}")
    while not stop.wait(1):  # a signal lands between waits
        pass
    log("moto stopped: everything it held is gone")
    return 0 if ran else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", default="multi-node-training")
    p.add_argument("--job", help="the job name (-c job) [the profile]")
    p.add_argument("--code", type=Path, help="your project directory, anywhere [examples/train_project]")
    p.add_argument("--command", help=f"what each node runs in it [with --code: required; else {EXAMPLE['command']}]")
    p.add_argument("--setup", help="bash run once per node before the job (-c setup)")
    p.add_argument("--env", help="KEY=VALUE,... for every rank (-c env)")
    p.add_argument("--secrets", help="NAME=VALUE,...: made in moto's Secrets Manager, passed by ARN (-c secrets)")
    p.add_argument("--nodes", type=int, help="nodes in the cluster [the profile's]")
    p.add_argument("--checkpoint-dir", help="where your framework saves its checkpoints, relative to the code "
                                            "(-c checkpoint_dir; docs/frameworks.md)")
    p.add_argument("--keep", action="store_true",
                   help="leave moto running after the job (Ctrl-C stops it): dl-launcher status/logs/destroy against it")
    a = p.parse_args(argv)
    if a.code is None:
        if a.command or a.setup or a.env or a.secrets or a.checkpoint_dir:
            p.error("--command, --setup, --env, --secrets and --checkpoint-dir go with --code DIR (without it: "
                    "examples/train_project)")
        a.code, expect = PROJECT, "WANDB_API_KEY is set"
        for key, value in EXAMPLE.items():
            setattr(a, key, value)
    else:
        expect = None
        a.code = a.code.expanduser().resolve()
        if not a.code.is_dir():
            p.error(f"--code {a.code}: not a directory")
        if not a.command:
            p.error("--code needs --command: what each node runs in it, e.g. --command \"dl-torchrun train.py\"")
    try:
        secrets = [v for _, v in secret_values(a.secrets)]
    except ValueError as e:
        p.error(str(e))
    job = a.job or a.profile

    server, port = start_moto()
    endpoint, env = local_env(port, REGION)
    out = Path(tempfile.mkdtemp(prefix="dl-local-"))
    stack = f"dl-{job}"
    try:
        log(f"moto_server on {endpoint} (in-process); account {ACCOUNT}, region {REGION}")
        synth_into_moto(["-c", f"profile={a.profile}", "-c", f"job={job}", *job_context(REGION, a)], stack=stack,
                        out=out, env=env)
        started = time.monotonic()
        cdk("deploy", "--app", str(out), "--require-approval", "never", "--method=direct",
            "--no-previous-parameters", "--progress", "events", stack, env=env)
        log(f"deployed in {time.monotonic() - started:.0f} s")
        ctl, instances = gang_launch_and_node_loss(stack, REGION)
        ran = job_on_nodes(stack, REGION, endpoint, instances, ctl.spec, a.code, secrets, expect)
        state = show(stack, REGION)
        bundle = show_bundle(stack, REGION)
        if a.keep:
            return keep(endpoint, job, ran)
        import boto3
        log("\n== teardown (what the stack's custom resource does on delete)")
        ctl.teardown()
        log("\n== dl-launcher destroy (CloudFormation deletes the stack; the checkpoints stay)")
        gone = subprocess.run([sys.executable, "-m", "dl_launcher", "destroy", job, "--region", REGION],
                              env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
        log(gone.stdout.rstrip() + gone.stderr.rstrip())
        left = [b["Name"] for b in boto3.client("s3", region_name=REGION).list_buckets()["Buckets"]]
        kept = [b for b in left if "checkpointsbucket" in b.lower()]
        log(f"\nafter dl-launcher destroy, buckets left: {', '.join(left) or 'none'}")
        log("checkpoint bucket kept (RemovalPolicy.RETAIN): " + (", ".join(kept) if kept else "NO - this is a bug"))
        others = boto3.client("ec2", region_name=REGION).describe_launch_templates()["LaunchTemplates"]
        log(f"launch templates left: {len(others)}")
        log("\nwhat moto does not emulate:\n" + "\n".join(f"  - {n}" for n in NOT_EMULATED))
        return 0 if gone.returncode == 0 and kept and state["launch_templates"] and bundle and ran else 1
    finally:
        shutil.rmtree(out, ignore_errors=True)
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
