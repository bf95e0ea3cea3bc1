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
from tests.cdk_checks import cfn_lint, synth_with_nag
from tests.constructs.userdata_text import user_data_text

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
    cap = SpotCapacity(stack, "Cap", vpc=vpc, instance_types=["p5.48xlarge", "p5en.48xlarge", "p4d.24xlarge"],
                       nodes=3, on_demand_base=1, max_price=40.0)
    bucket = CheckpointBucket(stack, "Ckpt", noncurrent_version_days=14)
    cap.enable_checkpoints(bucket, "jobs/llm")
    cap.configure_job(cluster="llm", command=COMMAND)
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
    bundle = [s for s in s3 if s["Action"] == "s3:GetObject" and "cdk-hnb659fds-assets" in str(s["Resource"])]
    assert len(bundle) == 1, "the node bundle, granted once to the shared role"
    s3 = [s for s in s3 if s not in bundle]
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
    t.resource_count_is("AWS::EC2::SecurityGroup", 1)


def test_every_node_type_runs_the_agent_and_the_job(cluster):
    cap, t = cluster
    templates = t.find_resources("AWS::EC2::LaunchTemplate")
    assert len(templates) == 3
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
    (asset,) = [a for a in manifest["files"].values() if a["source"]["packaging"] == "zip"]
    python = tmp_path / "python"
    shutil.copytree(out / asset["source"]["path"] / "python", python)
    runtime = sorted(p.name for p in (python / "constructs_lib" / "runtime").glob("*.py"))
    assert "contract.py" in runtime and len(runtime) >= 10
    assert compileall.compile_dir(str(python), quiet=1)
    r = subprocess.run([sys.executable, "-m", "constructs_lib.runtime", "--help"], capture_output=True, text=True,
                       cwd=str(tmp_path), env={"PYTHONPATH": str(python), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0 and "checkpoint" in r.stdout and "agent" in r.stdout, r.stderr


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
