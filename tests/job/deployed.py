"""A synthesized training stack "deployed" into moto the way CloudFormation and the CDK CLI would
leave it for a node: the assets published to the staging bucket (directories zipped), the SSM
parameters with their values resolved, the log groups created; then one SimNode booted from a
launch template's real user data."""
from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3

import app
from constructs_lib.runtime import contract
from scripts.simnode import SimNode
from tests.constructs.userdata_text import evaluate, user_data_text

REGION = "us-east-1"


@dataclass
class Deployed:
    out: Path
    stack: str
    template: dict
    user_data: str
    endpoint: str
    bucket: str  # the checkpoint bucket

    @property
    def cluster(self) -> str:
        return self.stack

    def resources(self, kind: str) -> dict[str, dict]:
        return {k: r for k, r in self.template["Resources"].items() if r["Type"] == kind}

    def node(self, root: Path, addr: str = "127.0.0.20", **kw: Any) -> SimNode:
        ec2 = boto3.client("ec2", endpoint_url=self.endpoint, region_name=REGION)
        vpc = ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
        subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.9.0.0/20")["Subnet"]["SubnetId"]
        instance = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1, InstanceType="g6.xlarge",
                                     SubnetId=subnet)["Instances"][0]["InstanceId"]
        tags = {contract.TAG_CLUSTER: self.cluster, contract.TAG_NODES: "1",
                contract.TAG_CHECKPOINT_BUCKET: self.bucket, contract.TAG_CHECKPOINT_PREFIX: f"jobs/{self.stack[3:]}"}
        return SimNode(root, user_data=self.user_data, endpoint=self.endpoint, instance_id=instance, addr=addr,
                       tags=tags, region=REGION, **kw)


def deploy(context: dict, out: Path, endpoint: str) -> Deployed:
    # Into moto on loopback, but not as -c local=true (the stack's real shape is under test): the
    # price approval (tests/test_approval.py) is given here, as a deployer would.
    context = {"approve_hourly": "1000", **context}
    assert app.main(context, outdir=str(out)) == 0
    (stack,) = [p.name[:-len(".template.json")] for p in out.glob("*.template.json")]
    template = json.loads((out / f"{stack}.template.json").read_text())
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name=REGION)
    manifest = json.loads((out / f"{stack}.assets.json").read_text())
    for asset in manifest["files"].values():
        (dest,) = asset["destinations"].values()
        bucket, key = evaluate({"Fn::Sub": dest["bucketName"]}), dest["objectKey"]
        _bucket(s3, bucket)
        src = out / asset["source"]["path"]
        if asset["source"]["packaging"] == "zip":
            body = out / f"{key}.upload"
            with zipfile.ZipFile(body, "w", zipfile.ZIP_DEFLATED) as z:
                for p in sorted(src.rglob("*")):
                    if p.is_file():
                        z.write(p, p.relative_to(src).as_posix())
            s3.upload_file(str(body), bucket, key)
        else:
            s3.upload_file(str(src), bucket, key)
    ssm = boto3.client("ssm", endpoint_url=endpoint, region_name=REGION)
    logs = boto3.client("logs", endpoint_url=endpoint, region_name=REGION)
    for r in template["Resources"].values():
        if r["Type"] == "AWS::SSM::Parameter":
            ssm.put_parameter(Name=r["Properties"]["Name"], Value=evaluate(r["Properties"]["Value"]), Type="String",
                              Overwrite=True)
        elif r["Type"] == "AWS::Logs::LogGroup" and "LogGroupName" in r["Properties"]:
            try:  # a redeploy keeps its group
                logs.create_log_group(logGroupName=r["Properties"]["LogGroupName"])
            except logs.exceptions.ResourceAlreadyExistsException:
                pass
    checkpoints = f"ckpt-{stack}"
    _bucket(s3, checkpoints)
    (lt, *_) = [r for r in template["Resources"].values() if r["Type"] == "AWS::EC2::LaunchTemplate"]
    return Deployed(out, stack, template, user_data_text(lt["Properties"]["LaunchTemplateData"]), endpoint, checkpoints)


def _bucket(s3, name: str) -> None:
    try:
        s3.create_bucket(Bucket=name)
    except s3.exceptions.BucketAlreadyOwnedByYou:
        pass
