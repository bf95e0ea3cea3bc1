"""What a node may read for its job, read from the synthesized template: exactly the bundle, the
job definition and the code objects, the named secrets (and their keys, through Secrets Manager
and SSM only), the named image repository, its own job parameter, and its own log group. The
template passes cdk-nag (app.main runs it), cfn-lint and checkov."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import app
from constructs_lib.runtime import contract
from tests.cdk_checks import cfn_lint, checkov
from tests.constructs.userdata_text import evaluate

FULL = "arn:aws:secretsmanager:us-east-1:123456789012:secret:hf-token-AbCdEf"
PARTIAL = "arn:aws:secretsmanager:us-east-1:123456789012:secret:team/wandb"
PARAM = "arn:aws:ssm:us-east-1:123456789012:parameter/team/db-password"
KEY = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
ECR = "123456789012.dkr.ecr.us-east-1.amazonaws.com/team/train:v3"


@pytest.fixture(scope="module")
def synthesized(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("role")
    (tmp / "proj").mkdir()
    (tmp / "proj" / "train.py").write_text("print('x')\n")
    out = tmp / "cdk.out"
    assert app.main({"profile": "multi-node-training", "job": "role", "code": str(tmp / "proj"), "image": ECR,
                     "secrets": f"HF_TOKEN={FULL},WANDB_API_KEY={PARTIAL},DB_PASSWORD={PARAM}", "secrets_kms": KEY,
                     "env": "EPOCHS=3", "command": "dl-torchrun train.py", "approve_hourly": "1000"}, outdir=str(out)) == 0
    template = json.loads((out / "dl-role.template.json").read_text())
    manifest = json.loads((out / "dl-role.assets.json").read_text())
    return out, template, manifest


def _role_statements(template: dict) -> list[dict]:
    roles = {k for k, r in template["Resources"].items() if r["Type"] == "AWS::IAM::Role"
             and "ec2.amazonaws.com" in json.dumps(r["Properties"]["AssumeRolePolicyDocument"])}
    (role,) = roles
    out = []
    for r in template["Resources"].values():
        if r["Type"] == "AWS::IAM::Policy" and {"Ref": role} in r["Properties"]["Roles"]:
            out += r["Properties"]["PolicyDocument"]["Statement"]
    return out


def _actions(s: dict) -> list[str]:
    return s["Action"] if isinstance(s["Action"], list) else [s["Action"]]


def _resources(s: dict) -> list[str]:
    rs = s["Resource"] if isinstance(s["Resource"], list) else [s["Resource"]]
    return [evaluate(r) if not isinstance(r, str) else r for r in rs]


def test_the_node_reads_exactly_its_assets_secrets_and_image(synthesized):
    out, template, manifest = synthesized
    st = _role_statements(template)
    by_action: dict[str, list[str]] = {}
    for s in st:
        assert s["Effect"] == "Allow"
        for a in _actions(s):
            by_action.setdefault(a, []).extend(_resources(s))
    staging = "arn:aws:s3:::cdk-hnb659fds-assets-123456789012-us-east-1"
    # the three objects a node fetches: its bundle, the job definition and the code, each by its hash
    assets = {a["source"]["path"]: next(iter(a["destinations"].values()))["objectKey"]
              for a in manifest["files"].values() if not a["source"]["path"].endswith(".template.json")}

    def holds(path: str, name: str) -> bool:
        return (out / path / name).exists()
    node_side = [k for p, k in assets.items() if p.endswith(".json") or holds(p, "install.sh") or holds(p, "train.py")]
    assert len(node_side) == 3 and len(assets) > 3, "the bundle, the definition and the code; the functions' code besides"
    staged = sorted(r for r in by_action["s3:GetObject"] if r.startswith(staging))
    assert staged == sorted(f"{staging}/{key}" for key in node_side), "never the functions' code or anything else"
    assert all("*" not in r for r in staged)
    # secrets: the two secrets (the one named without its suffix matched by exactly six characters), the parameter
    assert sorted(by_action["secretsmanager:GetSecretValue"]) == sorted([FULL, PARTIAL + "-??????"])
    assert PARAM in by_action["ssm:GetParameter"]
    assert [r for r in by_action["ssm:GetParameter"] if r != PARAM and "parameter/dl-launcher/dl-role/" not in r
            and "<" not in r] == []
    (kms,) = [s for s in st if "kms:Decrypt" in _actions(s)]
    assert _resources(kms) == [KEY] and set(kms["Condition"]["StringEquals"]["kms:ViaService"]) == {
        "secretsmanager.us-east-1.amazonaws.com", "ssm.us-east-1.amazonaws.com"}
    # the image: pulls from its one repository; the token call has no resource-level permission
    repo = "arn:aws:ecr:us-east-1:123456789012:repository/team/train"
    for a in ("ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"):
        assert by_action[a] == [repo.replace("arn:aws:", "arn:<AWS::Partition>:")] or by_action[a] == [repo]
    assert by_action["ecr:GetAuthorizationToken"] == ["*"]
    # logs: its own group only
    for a in ("logs:CreateLogStream", "logs:PutLogEvents"):
        assert by_action[a] == ["<JobLogsGroup32215572.Arn>"] or len(by_action[a]) == 1
    # and nothing else is readable: every action the role has, accounted for
    expected = {"s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload",
                "s3:ListMultipartUploadParts", "s3:ListBucket", "ec2:DescribeInstances", "ec2:DescribeTags",
                "ec2:CreateTags", "cloudwatch:PutMetricData", "ssm:GetParameter", "ssm:GetParameters",
                "ssm:DescribeParameters", "ssm:GetParameterHistory", "secretsmanager:GetSecretValue", "kms:Decrypt",
                "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability",
                "ecr:GetAuthorizationToken", "logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"}
    assert set(by_action) == expected, set(by_action) ^ expected
    # the job parameter is readable, not writable, by the node: only CloudFormation changes the revision
    assert not [a for a in by_action if a.startswith("ssm:Put") or a.startswith("ssm:Delete")]


def test_the_job_parameter_names_the_revision_the_assets_hold(synthesized):
    out, template, manifest = synthesized
    (param,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::SSM::Parameter"
                and r["Properties"]["Name"] == contract.job_parameter("dl-role")]
    revision = json.loads(evaluate(param["Properties"]["Value"]))
    (definition,) = [a for a in manifest["files"].values() if a["source"]["path"].endswith(".json")
                     and not a["source"]["path"].endswith(".template.json")]
    import hashlib
    data = (out / definition["source"]["path"]).read_bytes()
    assert revision["sha256"] == hashlib.sha256(data).hexdigest()
    assert revision["definition"].endswith("/" + next(iter(definition["destinations"].values()))["objectKey"])
    body = json.loads(data)
    assert body["image"] == ECR and body["env"] == {"EPOCHS": "3"} and body["command"] == "dl-torchrun train.py"
    assert body["secrets"] == {"HF_TOKEN": FULL, "WANDB_API_KEY": PARTIAL, "DB_PASSWORD": PARAM}


def test_the_log_group_is_encrypted_kept_three_months_and_linted(synthesized):
    out, template, manifest = synthesized
    (group,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::Logs::LogGroup"
                and r["Properties"].get("LogGroupName") == contract.job_log_group("dl-role")]
    assert group["Properties"]["RetentionInDays"] == 90 and "KmsKeyId" in group["Properties"]
    outputs = template["Outputs"]
    assert outputs["LogsCommand"]["Value"] == "dl-launcher logs role --follow --region us-east-1"
    assert outputs["JobLogGroup"]["Value"] == contract.job_log_group("dl-role")
    cfn_lint([Path(out) / "dl-role.template.json"])
    checkov([Path(out) / "dl-role.template.json"])
