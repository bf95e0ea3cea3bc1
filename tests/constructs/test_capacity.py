"""CheckpointBucket, ClusterCapacity (with its controller) and InterruptionAlerts: what gets
deployed, and that it is cdk-nag and cfn-lint clean."""
from __future__ import annotations

from pathlib import Path

import aws_cdk as cdk
import aws_cdk.aws_ec2 as ec2
import aws_cdk.aws_sns as sns
import pytest
from aws_cdk.assertions import Match, Template

import json

from constructs_lib import CheckpointBucket, ClusterCapacity, ConfigurationError, InstanceOption, InterruptionAlerts
from tests.cdk_checks import cfn_lint, synth_with_nag
from tests.constructs.userdata_text import evaluate, user_data_text

COMMAND = "dl-torchrun train.py --epochs 10"


def _vpc(stack):
    vpc = ec2.Vpc(stack, "Vpc", max_azs=2, nat_gateways=1)
    vpc.add_flow_log("FlowLog")
    return vpc


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    out = tmp_path_factory.mktemp("cdk.out")
    app = cdk.App(outdir=str(out))
    stack = cdk.Stack(app, "Spot", env=cdk.Environment(region="us-east-1"))
    vpc = _vpc(stack)
    bucket = CheckpointBucket(stack, "Ckpt", noncurrent_version_days=14)
    topic = sns.Topic(stack, "Ops", enforce_ssl=True, master_key=None)
    cdk.Validations.of(topic).acknowledge(cdk.Acknowledgment(id="AwsSolutions-SNS2", reason="test topic"))
    alerts = InterruptionAlerts(stack, "Alerts", topic=topic)
    # Same count, architecture and SDK: interchangeable under "same-count"; p5en is priced above
    # the ceiling and must never be used.
    cap = ClusterCapacity(stack, "Cap", vpc=vpc, cluster="llm", nodes=3, max_price=32.0, interchange="same-count",
                          options=[InstanceOption("p5.48xlarge", 30.0), InstanceOption("p5en.48xlarge", 35.0),
                                   InstanceOption("p4d.24xlarge", 20.0)],
                          state_bucket=bucket.bucket, state_key="_control/dl-llm/capacity-state.json",
                          log_group=alerts.log_group)
    cap.enable_checkpoints(bucket, "jobs/llm")
    cap.configure_job(command=COMMAND)
    assembly = synth_with_nag(app)
    cfn_lint([Path(out) / "Spot.template.json"])
    return cap, Template.from_json(assembly.get_stack_by_name("Spot").template)


def test_bucket_is_private_encrypted_versioned_tls_only_and_retained(cluster):
    _, t = cluster
    buckets = t.find_resources("AWS::S3::Bucket", {"Properties": {"VersioningConfiguration": {"Status": "Enabled"}}})
    (logical, ckpt), = buckets.items()
    assert ckpt["DeletionPolicy"] == "Retain" and ckpt["UpdateReplacePolicy"] == "Retain"
    p = ckpt["Properties"]
    assert p["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]["ServerSideEncryptionByDefault"] == {"SSEAlgorithm": "AES256"}
    assert p["PublicAccessBlockConfiguration"] == {"BlockPublicAcls": True, "BlockPublicPolicy": True,
                                                   "IgnorePublicAcls": True, "RestrictPublicBuckets": True}
    (rule,) = p["LifecycleConfiguration"]["Rules"]
    assert rule["AbortIncompleteMultipartUpload"] == {"DaysAfterInitiation": 1}
    assert rule["NoncurrentVersionExpiration"] == {"NoncurrentDays": 14}
    assert "LoggingConfiguration" in p
    t.has_resource_properties("AWS::S3::BucketPolicy", {
        "Bucket": {"Ref": logical},
        "PolicyDocument": {"Statement": Match.array_with([Match.object_like(
            {"Effect": "Deny", "Condition": {"Bool": {"aws:SecureTransport": "false"}}})])}})


def test_grant_is_scoped_to_the_job_prefix(cluster):
    _, t = cluster
    statements = [s for pol in t.find_resources("AWS::IAM::Policy").values()
                  for s in pol["Properties"]["PolicyDocument"]["Statement"]]
    s3 = [s for s in statements if any(str(a).startswith("s3:") for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"]))]
    bundle = [s for s in s3 if s["Action"] == "s3:GetObject" and "cdk-hnb659fds-assets" in str(s["Resource"])]
    assert len(bundle) == 1, "the node bundle, granted once to the shared role"
    s3 = [s for s in s3 if s not in bundle and "state.json" not in json.dumps(s) and "_cluster/f" not in json.dumps(s)
          and "_cluster/gone/" not in json.dumps(s)]
    assert len(s3) == 2, ("the nodes: the job prefix (the controller: its state object, the job's end and its gone "
                          "records, tested below)")
    listing = next(s for s in s3 if s["Action"] == "s3:ListBucket")
    assert listing["Condition"] == {"StringLike": {"s3:prefix": ["jobs/llm/*", "jobs/llm/"]}}
    objects = next(s for s in s3 if s is not listing)
    assert objects["Resource"]["Fn::Join"][1][-1] == "/jobs/llm/*"
    assert "s3:*" not in str(s3) and "s3:DeleteBucket" not in str(s3)


def _spec(t: Template) -> str:
    (fn,) = t.find_resources("AWS::Lambda::Function").values()
    return json.dumps(fn["Properties"]["Environment"]["Variables"]["DL_CLUSTER_SPEC"])


def test_one_type_at_a_time_launched_by_the_controller_never_a_mixed_group(cluster):
    cap, t = cluster
    for mixed in ("AWS::AutoScaling::AutoScalingGroup", "AWS::EC2::EC2Fleet", "AWS::EC2::SpotFleet"):
        t.resource_count_is(mixed, 0)
    assert cap.unused == {"p5en.48xlarge": "$35.00/h is above the ceiling $32.00/h"}
    spec = _spec(t)
    for part in ('\\"cluster\\":\\"llm\\"', '\\"nodes\\":3', '\\"market\\":\\"spot\\"',
                 '\\"max_price\\":32', '\\"replace_within_seconds\\":600'):
        assert part in spec, part
    assert spec.index("p5.48xlarge") < spec.index("p4d.24xlarge") and "p5en" not in spec, "pick first; never p5en"
    templates = t.find_resources("AWS::EC2::LaunchTemplate")
    counts = sorted(len(lt["Properties"]["LaunchTemplateData"]["NetworkInterfaces"]) for lt in templates.values())
    assert counts == [5, 33], "each type its own EFA layout; nothing for the unused p5en"
    t.resource_count_is("AWS::EC2::PlacementGroup", 1)
    node_roles = t.find_resources("AWS::IAM::Role", {"Properties": {"AssumeRolePolicyDocument": {"Statement": [
        Match.object_like({"Principal": {"Service": "ec2.amazonaws.com"}})]}}})
    assert len(node_roles) == 1, "one role shared by every node type"
    t.resource_count_is("AWS::IAM::InstanceProfile", 1)
    t.resource_count_is("AWS::EC2::SecurityGroup", 1)


def test_the_controller_may_launch_and_terminate_only_its_cluster(cluster):
    _, t = cluster
    (role,) = t.find_resources("AWS::IAM::Role", {"Properties": {"AssumeRolePolicyDocument": {"Statement": [
        Match.object_like({"Principal": {"Service": "lambda.amazonaws.com"}})]}}})
    statements = [s for pol in t.find_resources("AWS::IAM::Policy").values()
                  if pol["Properties"]["Roles"] == [{"Ref": role}] for s in pol["Properties"]["PolicyDocument"]["Statement"]]
    by_action = {}
    for s in statements:
        for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"]):
            by_action.setdefault(a, []).append(s)
    (terminate,) = by_action["ec2:TerminateInstances"]
    stack = {"Ref": "AWS::StackId"}  # the stack's own id: another stack's same-named cluster is not its
    assert terminate["Condition"] == {"StringEquals": {"ec2:ResourceTag/dl-launcher:cluster": "llm",
                                                       "ec2:ResourceTag/dl-launcher:stack": stack}}
    denies = [s for s in by_action["ec2:RunInstances"] if s["Effect"] == "Deny"]
    tagged = [d for d in denies if "aws:RequestTag/" in json.dumps(d["Condition"])]
    assert sorted((d["Condition"] for d in tagged), key=json.dumps) == sorted([
        {"StringNotEquals": {"aws:RequestTag/dl-launcher:cluster": "llm"}},
        {"StringNotEquals": {"aws:RequestTag/dl-launcher:stack": stack}}], key=json.dumps), "either tag wrong: denied"
    assert all("instance/*" in json.dumps(d["Resource"]) for d in tagged)
    # and only from its own templates, subnets and group (tests/fleet/test_launch_confinement.py evaluates them)
    confined = {next(iter(next(iter(d["Condition"].values())))): json.dumps(d["Resource"]) for d in denies
                if d not in tagged}
    assert set(confined) == {"ec2:LaunchTemplate", "ec2:Subnet", "aws:ResourceTag/dl-launcher:stack"}, confined
    assert "network-interface/*" in confined["ec2:Subnet"] and "security-group/*" in confined[
        "aws:ResourceTag/dl-launcher:stack"]
    assert all(s.get("Condition") for a in by_action for s in by_action[a] if s["Resource"] == "*"), \
        "every wildcard resource is bound by a condition"
    (passrole,) = by_action["iam:PassRole"]
    assert "Role" in json.dumps(passrole["Resource"]) and "*" not in json.dumps(passrole["Resource"])
    s3 = [a for a in by_action if a.startswith("s3:")]
    assert sorted(s3) == ["s3:GetObject", "s3:ListBucket", "s3:PutObject"]
    put, gone = sorted(by_action["s3:PutObject"], key=lambda s: "_cluster" in json.dumps(s["Resource"]))
    state, records = sorted(by_action["s3:GetObject"], key=lambda s: "_cluster" in json.dumps(s["Resource"]))
    for st in (put, state):
        assert json.dumps(st["Resource"]).endswith('/_control/dl-llm/capacity-state.json"]]}')
    # A member's gone record (fleet/gone.py): written, never read or listed, in the job's gone directory only.
    assert gone["Action"] == "s3:PutObject" and evaluate(gone["Resource"]).split(">", 1)[1] == "/jobs/llm/_cluster/gone/*"
    assert evaluate(gone["Resource"]).startswith("<CkptBucket") and "Condition" not in gone
    # The job's end: the two records its nodes write, read only, never a checkpoint.
    assert sorted(evaluate(r).split(">", 1)[1] for r in records["Resource"]) == [
        "/jobs/llm/_cluster/failed.json", "/jobs/llm/_cluster/finished.json"]
    assert all(evaluate(r).startswith("<CkptBucket") for r in records["Resource"]), "the job's own bucket"
    listings = sorted((s["Condition"]["StringEquals"]["s3:prefix"] for s in by_action["s3:ListBucket"]), key=str)
    assert listings == [["jobs/llm/_cluster/finished.json", "jobs/llm/_cluster/failed.json"],
                        "_control/dl-llm/capacity-state.json"] or listings == [
        "_control/dl-llm/capacity-state.json", ["jobs/llm/_cluster/finished.json", "jobs/llm/_cluster/failed.json"]]
    assert "ec2:*" not in by_action and "*" not in by_action


def test_the_controller_learns_where_the_job_ends_and_stops_the_cluster_by_default(cluster):
    _, t = cluster
    (fn,) = [f for f in t.find_resources("AWS::Lambda::Function").values()
             if "DL_CLUSTER_SPEC" in f["Properties"]["Environment"]["Variables"]
             and f["Properties"]["Handler"] == "constructs_lib.fleet.handler.handle"]
    watch = json.loads(evaluate(fn["Properties"]["Environment"]["Variables"]["DL_JOB_END"]))
    assert watch["bucket"].startswith("<CkptBucket") and watch["prefix"] == "jobs/llm" and watch["on_end"] == "stop"


@pytest.mark.parametrize("order", ["job first", "checkpoints first"])
@pytest.mark.parametrize("command,on_end,expected", [
    (COMMAND, "keep", "keep"), ("", "stop", None),
])
def test_the_job_end_is_wired_in_either_order_and_only_for_a_job_with_a_command(order, command, on_end, expected):
    app = cdk.App()
    stack = cdk.Stack(app, "S", env=cdk.Environment(region="us-east-1"))
    bucket = CheckpointBucket(stack, "B")
    cap = ClusterCapacity(stack, "Cap", vpc=_vpc(stack), cluster="c", state_bucket=bucket.bucket,
                          state_key="_control/c/capacity-state.json", log_group=InterruptionAlerts(stack, "A").log_group,
                          options=_options(("p4d.24xlarge", 10)))
    steps = [lambda: cap.configure_job(command=command, on_end=on_end), lambda: cap.enable_checkpoints(bucket, "jobs/c")]
    for step in (steps if order == "job first" else steps[::-1]):
        step()
    (fn,) = [f for f in Template.from_stack(stack).find_resources("AWS::Lambda::Function").values()
             if f["Properties"]["Handler"] == "constructs_lib.fleet.handler.handle"]
    env = fn["Properties"]["Environment"]["Variables"]
    got = json.loads(evaluate(env["DL_JOB_END"]))["on_end"] if "DL_JOB_END" in env else None
    assert got == expected


def test_a_bad_on_end_is_refused_at_synth():
    app = cdk.App()
    stack = cdk.Stack(app, "S", env=cdk.Environment(region="us-east-1"))
    bucket = CheckpointBucket(stack, "B")
    cap = ClusterCapacity(stack, "Cap", vpc=_vpc(stack), cluster="c", state_bucket=bucket.bucket,
                          state_key="_control/c/capacity-state.json", log_group=InterruptionAlerts(stack, "A").log_group,
                          options=_options(("p4d.24xlarge", 10)))
    cap.enable_checkpoints(bucket, "jobs/c")
    with pytest.raises(ConfigurationError, match="on_end 'kep': allowed stop, keep"):
        cap.configure_job(command=COMMAND, on_end="kep")


def test_the_cluster_is_terminated_before_what_it_runs_on_is_deleted(cluster):
    _, t = cluster
    (teardown,) = t.find_resources("Custom::DlLauncherClusterTeardown").values()
    needs = set(teardown["DependsOn"])
    for kind in ("AWS::EC2::LaunchTemplate", "AWS::EC2::SecurityGroup", "AWS::EC2::PlacementGroup"):
        assert set(t.find_resources(kind)) <= needs, kind
    (fn,) = t.find_resources("AWS::Lambda::Function").values()
    assert fn["Properties"]["Runtime"] == "python3.14"
    assert fn["Properties"]["Handler"] == "constructs_lib.fleet.handler.handle"
    rules = [r for r in t.find_resources("AWS::Events::Rule").values()
             if any("Lambda" in json.dumps(tg["Arn"]) or "Function" in json.dumps(tg["Arn"]) for tg in r["Properties"]["Targets"])]
    kinds = sorted("ScheduleExpression" in r["Properties"] for r in rules)
    assert kinds == [False, True], "EC2 state changes and a one-minute schedule wake the controller"


def test_the_deploy_proves_the_controller_may_launch_before_it_launches(cluster):
    """Issue 35: a CreateFleet DryRun from the controller's role (fleet/launch_check.py) once its
    policy and every template exist; the teardown resource, whose create launches, waits for it."""
    _, t = cluster
    (check_id, check), = t.find_resources("Custom::DlLauncherLaunchCheck").items()
    (teardown,) = t.find_resources("Custom::DlLauncherClusterTeardown").values()
    (fn_id,) = t.find_resources("AWS::Lambda::Function")
    assert check["Properties"]["ServiceToken"] == {"Fn::GetAtt": [fn_id, "Arn"]}
    policies = [k for k, p in t.find_resources("AWS::IAM::Policy").items() if "ControllerRole" in k]
    assert policies and set(policies) <= set(check["DependsOn"])
    referenced = {r["Ref"] for r in check["Properties"]["Templates"]}  # a Ref orders the templates first
    assert referenced == set(t.find_resources("AWS::EC2::LaunchTemplate"))
    assert check_id in teardown["DependsOn"]
    # a new template version or subnet proves it again
    assert len(check["Properties"]["Templates"]) == len(check["Properties"]["Versions"]) == 2
    assert check["Properties"]["Subnets"]


def test_every_node_type_runs_the_agent_and_the_job(cluster):
    cap, t = cluster
    templates = t.find_resources("AWS::EC2::LaunchTemplate")
    assert len(templates) == 2
    for lt in templates.values():
        data = lt["Properties"]["LaunchTemplateData"]
        ud = user_data_text(data)
        assert 'DL_UNITS="dl-nvme-raid0.service dl-efa-env.service dl-node-agent.service dl-job.service"' in ud
        assert f"\n{COMMAND}\n" in ud and 'DL_CLUSTER="llm"' in ud
        tags = {tg["Key"]: tg["Value"] for spec in data["TagSpecifications"] if spec["ResourceType"] == "instance"
                for tg in spec["Tags"]}
        assert "dl-launcher:checkpoint-bucket" in tags and tags["dl-launcher:checkpoint-prefix"] == "jobs/llm"
        assert tags["dl-launcher:cluster"] == "llm"
        assert data["MetadataOptions"]["InstanceMetadataTags"] == "enabled"
        assert data["InstanceInitiatedShutdownBehavior"] == "terminate"


def test_user_data_of_a_p5_with_checkpoints_and_a_job_is_small(cluster):
    cap, t = cluster
    p5 = cap.primary
    assert p5.facts.instance_type == "p5.48xlarge"
    deployed = next(user_data_text(lt["Properties"]["LaunchTemplateData"])
                    for lt in t.find_resources("AWS::EC2::LaunchTemplate").values()
                    if lt["Properties"]["LaunchTemplateData"]["InstanceType"] == "p5.48xlarge")
    # About 7.4 KB deployed, comments included (it was 15.4 KB gzip-compressed, 55.9 KB of text,
    # with the runtime inline): less than half of EC2's 16 KB, whatever the runtime grows to.
    assert len(deployed.encode()) < 8 * 1024
    assert len(deployed.encode()) <= p5.user_data_bytes() < 8 * 1024, "the synth-time bound is an upper bound"


def test_the_runtime_on_the_node_is_the_package_and_runs(cluster, tmp_path):
    import compileall
    import json
    import subprocess
    import sys
    import shutil
    cap, _ = cluster
    out = Path(cdk.Stage.of(cap).outdir)
    manifest = json.loads((out / "Spot.assets.json").read_text())
    (asset,) = [a for a in manifest["files"].values() if a["source"]["packaging"] == "zip"
                and (out / a["source"]["path"] / "install.sh").exists()]  # the other zip is the controller's
    python = tmp_path / "python"
    shutil.copytree(out / asset["source"]["path"] / "python", python)
    runtime = sorted(p.name for p in (python / "constructs_lib" / "runtime").glob("*.py"))
    assert "contract.py" in runtime and len(runtime) >= 10
    assert compileall.compile_dir(str(python), quiet=1)
    r = subprocess.run([sys.executable, "-m", "constructs_lib.runtime", "--help"], capture_output=True, text=True,
                       cwd=str(tmp_path), env={"PYTHONPATH": str(python), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0 and "checkpoint" in r.stdout and "agent" in r.stdout, r.stderr


def test_alerts_route_spot_warnings_to_the_log_group_and_the_topic(cluster):
    _, t = cluster
    (spot,) = t.find_resources("AWS::Events::Rule", {"Properties": {"EventPattern": {
        "source": ["aws.ec2"],
        "detail-type": ["EC2 Spot Instance Interruption Warning", "EC2 Instance Rebalance Recommendation"]}}}).values()
    assert len(spot["Properties"]["Targets"]) == 2, "log group and SNS topic"
    t.has_resource_properties("AWS::Logs::ResourcePolicy", Match.any_value())
    (fn,) = t.find_resources("AWS::Lambda::Function").values()
    assert "LoggingConfig" in fn["Properties"], "the controller logs its transitions to the alerts log group"


def _options(*pairs):
    return [InstanceOption(t, p) for t, p in pairs]


@pytest.mark.parametrize("kwargs,expected", [
    ({"options": _options(("p5.48xlarge", 30), ("p5en.48xlarge", 29)), "nodes": 2}, "p5en.48xlarge cannot replace"),
    ({"options": _options(("p5.48xlarge", 30), ("trn1.32xlarge", 10)), "interchange": "same-count"}, "cannot replace"),
    ({"options": _options(("g6e.8xlarge", 3), ("g6.xlarge", 1)), "nodes": 2}, "cannot replace|needs EFA on every type"),
    ({"options": _options(("g6.xlarge", 1)), "nodes": 2}, "needs EFA on every type; not on g6.xlarge$"),
    ({"options": _options(("p4d.24xlarge", 10)), "max_price": 0}, "max_price must be above zero"),
    ({"options": _options(("p4d.24xlarge", None))}, "no spot price on record: pass max_price"),
    ({"options": _options(("p4d.24xlarge", 10)), "market": "capacity-block"}, "needs capacity_reservation"),
    ({"options": _options(("p4d.24xlarge", 10)), "capacity_reservation": "cr-0123456789abcdef0"}, "on-demand capacity"),
    ({"options": _options(("p4d.24xlarge", 10)), "market": "reserved"}, "allowed spot, on-demand, capacity-block"),
    ({"options": []}, "at least one instance type"),
])
def test_capacity_refuses_wrong_combinations(kwargs, expected):
    app = cdk.App()
    stack = cdk.Stack(app, "S", env=cdk.Environment(region="us-east-1"))
    bucket = CheckpointBucket(stack, "B")
    alerts = InterruptionAlerts(stack, "A")
    with pytest.raises(ConfigurationError, match=expected):
        ClusterCapacity(stack, "Cap", vpc=_vpc(stack), cluster="c", state_bucket=bucket.bucket, state_key="_control/c/capacity-state.json",
                        log_group=alerts.log_group, **kwargs)


@pytest.mark.parametrize("prefix", ["", "../x", "a//b", "sp ace", "jobs/{x}"])
def test_bad_prefix(prefix):
    app = cdk.App()
    stack = cdk.Stack(app, "S")
    bucket = CheckpointBucket(stack, "B")
    role = __import__("aws_cdk.aws_iam", fromlist=["Role"]).Role(
        stack, "R", assumed_by=__import__("aws_cdk.aws_iam", fromlist=["ServicePrincipal"]).ServicePrincipal("ec2.amazonaws.com"))
    with pytest.raises(ConfigurationError, match="bad checkpoint prefix"):
        bucket.grant_read_write(role, prefix)


@pytest.mark.parametrize("market,reservation,expected", [
    ("on-demand", "cr-0123456789abcdef0", {"CapacityReservationSpecification": {
        "CapacityReservationTarget": {"CapacityReservationId": "cr-0123456789abcdef0"}}}),
    ("on-demand", "arn:aws:resource-groups:us-east-1:123456789012:group/p5-blocks", {
        "CapacityReservationSpecification": {"CapacityReservationTarget": {
            "CapacityReservationResourceGroupArn": "arn:aws:resource-groups:us-east-1:123456789012:group/p5-blocks"}}}),
    ("capacity-block", "cr-0123456789abcdef0", {"InstanceMarketOptions": {"MarketType": "capacity-block"}}),
])
def test_reservations_and_capacity_blocks_are_targeted_by_every_template(market, reservation, expected):
    app = cdk.App()
    stack = cdk.Stack(app, "S", env=cdk.Environment(region="us-east-1"))
    bucket = CheckpointBucket(stack, "B")
    alerts = InterruptionAlerts(stack, "A")
    ClusterCapacity(stack, "Cap", vpc=_vpc(stack), cluster="c", nodes=2, market=market, capacity_reservation=reservation,
                    options=_options(("p5e.48xlarge", None)), max_price=40.0, state_bucket=bucket.bucket,
                    state_key="_control/c/capacity-state.json", log_group=alerts.log_group)
    t = Template.from_stack(stack)
    (lt,) = t.find_resources("AWS::EC2::LaunchTemplate").values()
    for key, value in expected.items():
        assert lt["Properties"]["LaunchTemplateData"][key] == value
    assert f'\\"market\\":\\"{market}\\"' in _spec(t)
