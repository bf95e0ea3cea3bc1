"""Least privilege and safe defaults: the checkpoint grant, the node role's Session Manager policy,
the log group's resource policy for EventBridge, the access-log bucket and the modes of the files
the bootstrap writes. cdk-nag and cfn-lint clean."""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import aws_cdk as cdk
import aws_cdk.aws_ec2 as ec2
import pytest
from aws_cdk.assertions import Template

from constructs_lib import CheckpointBucket, ConfigurationError, InterruptionAlerts
from constructs_lib.identity import SESSION_MANAGER_ACTIONS, NodeIdentity
from tests.cdk_checks import cfn_lint, listify, synth_with_nag

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "jobs/llama-7b"


@pytest.fixture(scope="module")
def synthesized(tmp_path_factory):
    out = tmp_path_factory.mktemp("cdk.out")
    app = cdk.App(outdir=str(out))
    stack = cdk.Stack(app, "Lp", env=cdk.Environment(region="us-east-1"))
    vpc = ec2.Vpc(stack, "Vpc", max_azs=2, nat_gateways=1)
    vpc.add_flow_log("FlowLog")
    bucket = CheckpointBucket(stack, "Ckpt")
    nodes = NodeIdentity(stack, "Nodes", vpc=vpc, label="p5.48xlarge")
    bucket.grant_read_write(nodes, PREFIX)
    nodes.grant_find_peers()
    alerts = InterruptionAlerts(stack, "Alerts")
    assembly = synth_with_nag(app)  # any unacknowledged finding fails here
    cfn_lint([Path(out) / "Lp.template.json"])
    t = Template.from_json(assembly.get_stack_by_name("Lp").template)
    return {"t": t, "json": t.to_json(), "bucket": bucket, "nodes": nodes, "alerts": alerts, "stack": stack}


def _statements(doc):
    return listify(doc["Statement"])


# ---- the checkpoint grant -------------------------------------------------------------------
@pytest.mark.parametrize("prefix", ["*", "jobs/*", "jobs/llama-*", "jobs/?", "jobs/a?b", ".", "..", "jobs/./x",
                                    "jobs/../other", "./jobs", "jobs/x/..", "jobs/it's"])
def test_grant_refuses_wildcards_and_dot_segments(prefix):
    stack = cdk.Stack(cdk.App(), "S")
    bucket = CheckpointBucket(stack, "Ckpt", access_logs=False)
    vpc = ec2.Vpc(stack, "Vpc", max_azs=1, nat_gateways=0)
    nodes = NodeIdentity(stack, "Nodes", vpc=vpc)
    with pytest.raises(ConfigurationError, match="bad checkpoint prefix"):
        bucket.grant_read_write(nodes, prefix)
    # nothing was granted (no policy) and nothing acknowledged for it
    assert not Template.from_stack(stack).find_resources("AWS::IAM::Policy")


def test_grant_covers_exactly_the_prefix(synthesized):
    policies = synthesized["t"].find_resources("AWS::IAM::Policy")
    s3_statements = [s for p in policies.values() for s in _statements(p["Properties"]["PolicyDocument"])
                     if any(a.startswith("s3:") for a in listify(s["Action"]))]
    listing = [s for s in s3_statements if listify(s["Action"]) == ["s3:ListBucket"]]
    assert len(listing) == 1
    assert listing[0]["Condition"] == {"StringLike": {"s3:prefix": [f"{PREFIX}/*", f"{PREFIX}/"]}}
    objects = [s for s in s3_statements if "s3:GetObject" in listify(s["Action"])]
    assert len(objects) == 1
    resources = json.dumps(objects[0]["Resource"])
    assert f"/{PREFIX}/*" in resources and resources.count("*") == 1, resources
    for s in s3_statements:
        assert not any("*" in a for a in listify(s["Action"])), "no wildcard S3 actions"


# ---- the node role -------------------------------------------------------------------------
def _node_role(synthesized):
    roles = synthesized["t"].find_resources("AWS::IAM::Role")
    (role,) = [r for r in roles.values()
               if "ec2.amazonaws.com" in json.dumps(r["Properties"]["AssumeRolePolicyDocument"])]
    return role["Properties"]


def test_node_role_has_no_managed_policy_and_no_parameter_access(synthesized):
    role = _node_role(synthesized)
    assert "ManagedPolicyArns" not in role, "no AmazonSSMManagedInstanceCore (ssm:GetParameter* on everything)"
    everything = json.dumps(synthesized["json"])
    assert "AmazonSSMManagedInstanceCore" not in everything
    assert "ssm:GetParameter" not in everything


def test_node_role_session_manager_policy_is_exactly_what_the_agent_needs(synthesized):
    role = _node_role(synthesized)
    (inline,) = role["Policies"]
    (stmt,) = _statements(inline["PolicyDocument"])
    assert stmt["Effect"] == "Allow" and stmt["Resource"] == "*"
    assert sorted(listify(stmt["Action"])) == sorted(SESSION_MANAGER_ACTIONS)
    assert sorted(SESSION_MANAGER_ACTIONS) == sorted([
        "ssmmessages:CreateControlChannel", "ssmmessages:CreateDataChannel", "ssmmessages:OpenControlChannel",
        "ssmmessages:OpenDataChannel", "ssm:UpdateInstanceInformation", "ec2messages:AcknowledgeMessage",
        "ec2messages:DeleteMessage", "ec2messages:FailMessage", "ec2messages:GetEndpoint",
        "ec2messages:GetMessages", "ec2messages:SendReply"])
    assert not any("*" in a for a in SESSION_MANAGER_ACTIONS), "every action named"


# ---- the log group's resource policy ---------------------------------------------------------
def test_logs_resource_policy_is_eventbridge_only_with_source_conditions(synthesized):
    t, stack = synthesized["t"], synthesized["stack"]
    (policy,) = t.find_resources("AWS::Logs::ResourcePolicy").values()
    rendered = stack.resolve(synthesized["alerts"].node.find_child("EventsMayWrite").policy_document)
    assert rendered == policy["Properties"]["PolicyDocument"]
    text = json.dumps(rendered)
    assert "delivery.logs.amazonaws.com" not in text
    assert text.count("amazonaws.com") == text.count("events.amazonaws.com") == 2, "EventBridge, in both statements"
    assert text.count("aws:SourceAccount") == 2, "every statement held to this account"
    assert "AWS::AccountId" in text
    assert text.count("aws:SourceArn") == 1, "log events only from the spot rule"
    (rule_id,) = t.find_resources("AWS::Events::Rule").keys()
    assert rule_id in text, "the condition names the rule's ARN"


# ---- the access-log bucket -----------------------------------------------------------------
def test_access_log_bucket_is_versioned_or_says_why_not(synthesized):
    t = synthesized["t"]
    buckets = t.find_resources("AWS::S3::Bucket")
    assert len(buckets) == 2
    (logs_bucket,) = [b for b in buckets.values() if "LoggingConfiguration" not in b["Properties"]]
    versioned = logs_bucket["Properties"].get("VersioningConfiguration", {}).get("Status") == "Enabled"
    skips = logs_bucket.get("Metadata", {}).get("checkov", {}).get("skip", [])
    reasons = [s["comment"] for s in skips if s.get("id") == "CKV_AWS_21"]
    assert versioned or (reasons and len(reasons[0]) > 40), logs_bucket
    assert logs_bucket["DeletionPolicy"] == "Retain"


# ---- modes of the files the bootstrap writes ----------------------------------------------------
def _dl_put_function() -> str:
    text = (ROOT / "constructs_lib" / "scripts" / "bootstrap.sh").read_text()
    m = re.search(r"^dl_put\(\) \{\n.*?^\}\n", text, flags=re.S | re.M)
    assert m, "bootstrap.sh defines dl_put"
    return m.group(0)


def test_bootstrap_writes_settings_root_only(tmp_path):
    etc, other = tmp_path / "etc", tmp_path / "elsewhere"
    script = ("log() { :; }\nproblems=()\n" + _dl_put_function() +
              'printf "DL_CLUSTER=x\\n" | dl_put "$DL_ETC_DIR/node.env"\n'
              'printf "secret-token\\n" | dl_put "$DL_ETC_DIR/job.sh"\n'
              'printf "K=V\\n" | dl_put "$DL_ETC_DIR/efa.env"\n'
              'printf "public\\n" | dl_put "$OTHER/readme"\n'
              '[ ${#problems[@]} -eq 0 ]\n')
    r = subprocess.run(["bash", "-c", script], env={"PATH": "/usr/bin:/bin", "DL_ETC_DIR": str(etc),
                                                    "OTHER": str(other)}, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    for name in ("node.env", "job.sh", "efa.env"):
        assert (etc / name).stat().st_mode & 0o777 == 0o600, name
    assert (etc / "job.sh").read_text() == "secret-token\n"
    assert (other / "readme").stat().st_mode & 0o777 == 0o644
    assert not list(etc.glob("*.??????")), "no temporary files left"


# ---- the controller's gone records ----------------------------------------------------------
@pytest.mark.parametrize("encryption", ["s3-managed", "kms"])
def test_the_controller_writes_gone_records_and_uses_a_buckets_key_only_to_write_them(encryption):
    """PutObject on <prefix>/_cluster/gone/* and nothing else in the job's prefix; with an SSE-KMS
    bucket (a caller's own; CheckpointBucket is SSE-S3) the data key that PutObject needs, from that
    key alone: no Decrypt, no other key."""
    import aws_cdk.aws_iam as iam
    import aws_cdk.aws_kms as kms
    import aws_cdk.aws_logs as logs
    import aws_cdk.aws_s3 as s3

    from constructs_lib.controller import CapacityController
    from constructs_lib.nag import resource_of
    from tests.cdk_checks import role_statements

    stack = cdk.Stack(cdk.App(), "S", env=cdk.Environment(region="us-east-1"))
    key = kms.Key(stack, "Key", enable_key_rotation=True) if encryption == "kms" else None
    bucket = s3.Bucket(stack, "B", encryption=s3.BucketEncryption.KMS if key else s3.BucketEncryption.S3_MANAGED,
                       encryption_key=key, enforce_ssl=True)
    node_role = iam.Role(stack, "Nodes", assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"))  # pyright: ignore[reportArgumentType]  # jsii stub: aws/jsii#4541
    ctl = CapacityController(stack, "Ctl", spec="{}", cluster="c", node_role=node_role, state_bucket=bucket,
                             state_key="_control/c/capacity-state.json", log_group=logs.LogGroup(stack, "L"),
                             teardown=False)
    ctl.end_with_job(bucket=bucket, prefix="jobs/c")
    t = Template.from_stack(stack).to_json()
    statements = role_statements(t, stack.get_logical_id(resource_of(ctl.role)))
    puts = sorted(json.dumps(st["Resource"]) for st in statements if "s3:PutObject" in listify(st["Action"]))
    bucket_id = stack.get_logical_id(resource_of(bucket))
    assert puts == sorted(json.dumps({"Fn::Join": ["", [{"Fn::GetAtt": [bucket_id, "Arn"]}, path]]})
                          for path in ("/_control/c/capacity-state.json", "/jobs/c/_cluster/gone/*")), puts
    keyed = [st for st in statements if any(a.startswith("kms:") for a in listify(st["Action"]))]
    if key is None:
        assert keyed == []
    else:
        (st,) = keyed
        key_id = stack.get_logical_id(resource_of(key))
        assert listify(st["Action"]) == ["kms:GenerateDataKey"] and st["Resource"] == {"Fn::GetAtt": [key_id, "Arn"]}
