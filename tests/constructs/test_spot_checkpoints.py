"""CheckpointBucket, SpotCapacity and InterruptionAlerts: what gets deployed, and that it is
cdk-nag and cfn-lint clean."""
from __future__ import annotations

from pathlib import Path

import aws_cdk as cdk
import aws_cdk.aws_ec2 as ec2
import aws_cdk.aws_sns as sns
import pytest
from aws_cdk.assertions import Match, Template

from constructs_lib import CheckpointBucket, ConfigurationError, InterruptionAlerts, SpotCapacity
from constructs_lib.userdata import decode_user_data
from tests.cdk_checks import cfn_lint, synth_with_nag


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
    cap = SpotCapacity(stack, "Cap", vpc=vpc, instance_types=["p5.48xlarge", "p5en.48xlarge", "p4d.24xlarge"],
                       nodes=3, on_demand_base=1, max_price=40.0)
    bucket = CheckpointBucket(stack, "Ckpt", noncurrent_version_days=14)
    cap.enable_checkpoints(bucket, "jobs/llm")
    topic = sns.Topic(stack, "Ops", enforce_ssl=True, master_key=None)
    cdk.Validations.of(topic).acknowledge(cdk.Acknowledgment(id="AwsSolutions-SNS2", reason="test topic"))
    InterruptionAlerts(stack, "Alerts", group=cap.auto_scaling_group, topic=topic)
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
    assert len(s3) == 2
    listing = next(s for s in s3 if s["Action"] == "s3:ListBucket")
    assert listing["Condition"] == {"StringLike": {"s3:prefix": ["jobs/llm/*", "jobs/llm/"]}}
    objects = next(s for s in s3 if s is not listing)
    assert objects["Resource"]["Fn::Join"][1][-1] == "/jobs/llm/*"
    assert "s3:*" not in str(s3) and "s3:DeleteBucket" not in str(s3)


def test_capacity_optimized_spot_across_alternates_with_their_own_templates(cluster):
    cap, t = cluster
    (asg,) = t.find_resources("AWS::AutoScaling::AutoScalingGroup").values()
    p = asg["Properties"]
    assert (p["MinSize"], p["MaxSize"], p["DesiredCapacity"]) == ("3", "3", "3")
    mip = p["MixedInstancesPolicy"]
    d = mip["InstancesDistribution"]
    assert d["SpotAllocationStrategy"] == "capacity-optimized-prioritized"
    assert (d["OnDemandBaseCapacity"], d["OnDemandPercentageAboveBaseCapacity"], d["SpotMaxPrice"]) == (1, 0, "40.0000")
    overrides = mip["LaunchTemplate"]["Overrides"]
    assert [o["InstanceType"] for o in overrides] == ["p5.48xlarge", "p5en.48xlarge", "p4d.24xlarge"]
    assert "LaunchTemplateSpecification" not in overrides[0]
    assert all("LaunchTemplateSpecification" in o for o in overrides[1:]), "EFA layouts differ per type"
    assert "PlacementGroup" in p and len(p["VPCZoneIdentifier"]) == 1, "one AZ, one placement group"
    templates = t.find_resources("AWS::EC2::LaunchTemplate")
    counts = sorted(len(lt["Properties"]["LaunchTemplateData"]["NetworkInterfaces"]) for lt in templates.values())
    assert counts == [5, 17, 33]
    t.resource_count_is("AWS::EC2::PlacementGroup", 1)
    node_roles = t.find_resources("AWS::IAM::Role", {"Properties": {"AssumeRolePolicyDocument": {"Statement": [
        Match.object_like({"Principal": {"Service": "ec2.amazonaws.com"}})]}}})
    assert len(node_roles) == 1, "one role shared by every node type"
    t.resource_count_is("AWS::IAM::InstanceProfile", 1)


def test_nodes_restore_at_boot_and_watch_for_interruptions(cluster):
    cap, t = cluster
    for lt in t.find_resources("AWS::EC2::LaunchTemplate").values():
        data = lt["Properties"]["LaunchTemplateData"]
        ud = decode_user_data(data["UserData"])
        for needle in ("dl-checkpoint-restore.service", "dl-interruption-watcher.service",
                       "/usr/local/lib/dl-launcher/python/constructs_lib/runtime/store.py", "resume\n", " watch --poll 5"):
            assert needle in ud, needle
        tags = {tg["Key"]: tg["Value"] for spec in data["TagSpecifications"] if spec["ResourceType"] == "instance"
                for tg in spec["Tags"]}
        assert "dl-launcher:checkpoint-bucket" in tags and tags["dl-launcher:checkpoint-prefix"] == "jobs/llm"
        assert data["MetadataOptions"]["InstanceMetadataTags"] == "enabled"


def test_the_runtime_on_the_node_is_the_package_and_compiles(cluster, tmp_path):
    import compileall
    import re
    cap, _ = cluster
    script = cap.primary.user_data_script()
    files = re.findall(r"cat > (/usr/local/lib/dl-launcher/python/\S+\.py) <<'DL_LAUNCHER_EOF'\n(.*?)DL_LAUNCHER_EOF",
                       script, flags=re.S)
    assert len(files) >= 10
    for path, body in files:
        target = tmp_path / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(body)
    assert compileall.compile_dir(str(tmp_path), quiet=1)
    import subprocess, sys
    r = subprocess.run([sys.executable, "-m", "constructs_lib.runtime", "--help"], capture_output=True, text=True,
                       env={"PYTHONPATH": str(tmp_path / "usr/local/lib/dl-launcher/python"), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0 and "checkpoint" in r.stdout, r.stderr


def test_alerts_route_spot_warnings_and_group_events(cluster):
    _, t = cluster
    t.has_resource_properties("AWS::Events::Rule", {"EventPattern": {
        "source": ["aws.ec2"],
        "detail-type": ["EC2 Spot Instance Interruption Warning", "EC2 Instance Rebalance Recommendation"]}})
    t.has_resource_properties("AWS::Events::Rule", {"EventPattern": {
        "source": ["aws.autoscaling"], "detail": {"AutoScalingGroupName": [Match.any_value()]}}})
    for rule in t.find_resources("AWS::Events::Rule").values():
        assert len(rule["Properties"]["Targets"]) == 2, "log group and SNS topic"
    t.resource_count_is("AWS::Lambda::Function", 0)
    t.has_resource_properties("AWS::Logs::ResourcePolicy", Match.any_value())


@pytest.mark.parametrize("kwargs,expected", [
    ({"instance_types": ["p5.48xlarge", "trn1.32xlarge"]}, "not interchangeable"),
    ({"instance_types": ["g6e.8xlarge", "g6.xlarge"], "nodes": 2}, "needs EFA on every type; not on g6.xlarge$"),
    ({"instance_types": ["p4d.24xlarge"], "nodes": 2, "on_demand_base": 3}, "on_demand_base between 0 and nodes"),
    ({"instance_types": ["p4d.24xlarge"], "max_price": 0}, "max_price must be above zero"),
    ({"instance_types": []}, "at least one instance type"),
])
def test_capacity_refuses_wrong_combinations(kwargs, expected):
    app = cdk.App()
    stack = cdk.Stack(app, "S", env=cdk.Environment(region="us-east-1"))
    with pytest.raises(ConfigurationError, match=expected):
        SpotCapacity(stack, "Cap", vpc=_vpc(stack), **kwargs)


@pytest.mark.parametrize("prefix", ["", "../x", "a//b", "sp ace", "jobs/{x}"])
def test_bad_prefix(prefix):
    app = cdk.App()
    stack = cdk.Stack(app, "S")
    bucket = CheckpointBucket(stack, "B")
    role = __import__("aws_cdk.aws_iam", fromlist=["Role"]).Role(
        stack, "R", assumed_by=__import__("aws_cdk.aws_iam", fromlist=["ServicePrincipal"]).ServicePrincipal("ec2.amazonaws.com"))
    with pytest.raises(ConfigurationError, match="bad checkpoint prefix"):
        bucket.grant_read_write(role, prefix)


def test_on_demand_only():
    app = cdk.App()
    stack = cdk.Stack(app, "S", env=cdk.Environment(region="us-east-1"))
    SpotCapacity(stack, "Cap", vpc=_vpc(stack), instance_types=["g6e.xlarge"], spot=False)
    (asg,) = Template.from_stack(stack).find_resources("AWS::AutoScaling::AutoScalingGroup").values()
    d = asg["Properties"]["MixedInstancesPolicy"]["InstancesDistribution"]
    assert (d["OnDemandBaseCapacity"], d["OnDemandPercentageAboveBaseCapacity"]) == (1, 100)
