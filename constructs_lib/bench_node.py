"""One short-lived benchmark instance: the candidate's DLAMI, the runner shipped as an asset, and
a hard time limit enforced twice.

1. User data first schedules `shutdown -h +minutes`; the launch template's instance-initiated
   shutdown behaviour is terminate, so whatever hangs (the command, the runner, the upload) the
   instance is gone by then. Spot requests are one-time with terminate on interruption.
2. The runner (dl_selector.bench.runner) kills the command's whole process group at its own
   deadline, minutes less an upload margin, and still uploads a result saying so.

The node runs only the runner: no job supervisor, agent or RAID units (a benchmark keeps nothing).
The DLAMI mounts its first NVMe disk at /opt/dlami/nvme where a type has one; stage data there for
the loader-bound case.
"""
from __future__ import annotations

import os
import shlex
import shutil

import aws_cdk as cdk
import aws_cdk.aws_ec2 as ec2
import aws_cdk.aws_iam as iam
import aws_cdk.aws_s3 as s3
import aws_cdk.aws_s3_assets as s3_assets
from constructs import Construct

from dl_selector.facts import InstanceFacts

from .ami import DeepLearningAmi
from .bundle import acknowledge_asset_parameters, copy_core, staged
from .launch_template import select_subnets

SELECTOR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "dl_selector")
# Where the DLAMI keeps its PyTorch environment (newer lines, then older conda ones): first on PATH,
# so the plan's `python3 -m ...` is the python that has torch.
DLAMI_PYTHON_DIRS = ("/opt/pytorch/bin", "/opt/conda/bin")
# The Neuron multi-framework DLAMI has one venv per framework line (/opt/aws_neuronx_venv_pytorch_2_8,
# ..._2_9): the newest PyTorch one goes first on PATH for trn/inf candidates.
NEURON_VENV_GLOB = "/opt/aws_neuronx_venv_pytorch_[0-9]*"
ROOT_VOLUME_GIB = 120  # the DLAMI needs about 100 GB; a benchmark writes little


def build_runner_asset(dest_dir: str) -> None:
    """dl_selector/__init__.py and dl_selector/bench/*.py (the runner, the contract and the reference
    benchmark) and dl_core/ (the dl-bench line it prints, and the runner's uploads back off as every
    AWS call of the project does): standard library plus boto3/torch (both on the DLAMI)."""
    pkg = os.path.join(dest_dir, "dl_selector")
    os.makedirs(os.path.join(pkg, "bench"))
    shutil.copyfile(os.path.join(SELECTOR, "__init__.py"), os.path.join(pkg, "__init__.py"))
    for name in sorted(os.listdir(os.path.join(SELECTOR, "bench"))):
        if name.endswith(".py"):
            shutil.copyfile(os.path.join(SELECTOR, "bench", name), os.path.join(pkg, "bench", name))
    copy_core(dest_dir)


class RunnerAsset(Construct):
    """The runner package as one S3 asset per stack; `grant_fetch` gives s3:GetObject on that object only."""

    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)
        self.asset = s3_assets.Asset(self, "Asset", path=staged(build_runner_asset),
                                     display_name="dl-launcher benchmark runner")
        acknowledge_asset_parameters(self)

    def grant_fetch(self, grantee: iam.IGrantable) -> iam.Grant:
        return iam.Grant.add_to_principal(grantee=grantee, actions=["s3:GetObject"],
                                          resource_arns=[self.asset.bucket.arn_for_objects(self.asset.s3_object_key)])


def user_data_script(*, asset_url: str, bucket: str, prefix: str, facts: InstanceFacts, minutes: int, market: str,
                     region: str, command: str) -> str:
    """The node's whole user data (tokens allowed in asset_url and bucket)."""
    path = ":".join(DLAMI_PYTHON_DIRS)
    neuron = []
    if facts.sdk == "neuron":
        neuron = [
            f"venv=$(printf '%s\\n' {NEURON_VENV_GLOB} | sort -V | tail -n 1)",
            "if [ -x \"$venv/bin/python3\" ]; then PATH=\"$venv/bin:$PATH\"; fi",
        ]
    runner = " ".join(shlex.quote(x) for x in (
        "python3", "-m", "dl_selector.bench.runner", "--bucket", bucket, "--prefix", prefix,
        "--instance-type", facts.instance_type, "--minutes", str(minutes), "--market", market, "--region", region))
    return "\n".join([
        "#!/bin/bash",
        f"# dl-launcher benchmark node: {facts.instance_type}, at most {minutes} minutes",
        f"shutdown -h +{minutes} 'dl-launcher: benchmark time limit'  # backstop: shutdown terminates this instance",
        "booted=$(date +%s)",
        "exec > >(tee -a \"${DL_BENCH_LOG:-/var/log/dl-bench.log}\") 2>&1",
        "dir=${DL_BENCH_DIR:-/opt/dl-bench}",
        "mkdir -p \"$dir\"",
        "fetched=''",
        "for i in 1 2 3 4 5; do",
        f"  if aws s3 cp --only-show-errors --region {region} {asset_url} \"$dir/runner.zip\"; then fetched=1; break; fi",
        "  sleep $((i * ${DL_BENCH_BACKOFF:-10}))",
        "done",
        "if [ -z \"$fetched\" ]; then echo 'dl-bench: cannot fetch the runner; shutting down'; shutdown -h now; exit 1; fi",
        "python3 -m zipfile -e \"$dir/runner.zip\" \"$dir\"",
        f"export PATH={path}:$PATH PYTHONPATH=\"$dir\"",
        *neuron,
        "cd /opt/dlami/nvme 2>/dev/null || cd /tmp || exit 1",
        f"{runner} --booted-at \"$booted\" -- {shlex.quote(command)}",
        "shutdown -h now",
        "",
    ])


class BenchNode(Construct):
    """One instance of `facts`' type that runs `command` once under the runner and terminates.

    Keyword-only props:
      facts: the candidate's catalog entry (architecture and SDK pick the DLAMI).
      vpc, subnets: where it runs (private subnets).
      role, instance_profile, security_group: shared by every node of the benchmark (pass them).
      results: the bucket the runner writes to; prefix: the plan's prefix in it.
      runner: the RunnerAsset.
      minutes: the hard limit; market: "spot" (one-time, terminate) or "on-demand";
      max_price [None]: the spot request's maximum price per hour (EC2's default, on-demand, if None).
      tags: added to the instance and its volume.
    """

    def __init__(self, scope: Construct, construct_id: str, *, facts: InstanceFacts, vpc: ec2.IVpc,
                 subnets: ec2.SubnetSelection, role: iam.IRole, instance_profile: iam.IInstanceProfile,
                 security_group: ec2.ISecurityGroup, results: s3.IBucket, prefix: str, runner: RunnerAsset,
                 minutes: int, market: str, command: str, region: str, max_price: float | None = None,
                 tags: dict[str, str] | None = None) -> None:
        super().__init__(scope, construct_id)
        image = DeepLearningAmi(instance=facts)
        script = user_data_script(asset_url=runner.asset.s3_object_url, bucket=results.bucket_name, prefix=prefix,
                                  facts=facts, minutes=minutes, market=market, region=region, command=command)
        market_options = None
        if market == "spot":
            market_options = ec2.LaunchTemplateSpotOptions(
                request_type=ec2.SpotRequestType.ONE_TIME,
                interruption_behavior=ec2.SpotInstanceInterruption.TERMINATE,
                max_price=max_price)
        self.launch_template = ec2.LaunchTemplate(
            self, "Template", instance_type=ec2.InstanceType(facts.instance_type), machine_image=image,
            instance_profile=instance_profile, security_group=security_group,
            require_imdsv2=True, http_tokens=ec2.LaunchTemplateHttpTokens.REQUIRED, http_endpoint=True,
            http_put_response_hop_limit=2,
            instance_initiated_shutdown_behavior=ec2.InstanceInitiatedShutdownBehavior.TERMINATE,
            spot_options=market_options,
            block_devices=[ec2.BlockDevice(
                device_name=getattr(image, "root_device_name", "/dev/sda1"),
                volume=ec2.BlockDeviceVolume.ebs(ROOT_VOLUME_GIB, volume_type=ec2.EbsDeviceVolumeType.GP3,
                                                 encrypted=True, delete_on_termination=True))],
            user_data=ec2.UserData.custom(script))
        subnet_ids = select_subnets(vpc, subnets).subnet_ids
        # Image, type, user data and shutdown behaviour are given on the instance as well (the same
        # values): CloudFormation lets them override the template's, so they hold whatever a later
        # template version says, and moto's CloudFormation, which ignores launch templates, gets them.
        self.instance = ec2.CfnInstance(
            self, "Instance", subnet_id=subnet_ids[0], image_id=image.get_image(self).image_id,
            instance_type=facts.instance_type, user_data=cdk.Fn.base64(script),
            instance_initiated_shutdown_behavior="terminate",
            launch_template=ec2.CfnInstance.LaunchTemplateSpecificationProperty(
                launch_template_id=self.launch_template.launch_template_id,
                version=self.launch_template.latest_version_number),
            tags=[cdk.CfnTag(key=k, value=v) for k, v in (tags or {}).items()])
        self.instance.add_metadata("checkov", {"skip": [
            {"id": "CKV_AWS_79", "comment": "IMDSv2 is required by the launch template (HttpTokens required)"},
            {"id": "CKV_AWS_8", "comment": "the root volume is encrypted in the launch template"},
            {"id": "CKV_AWS_126", "comment": "a benchmark instance lives minutes; detailed monitoring would cost more "
                                             "than it tells"},
            {"id": "CKV_AWS_135", "comment": "EBS optimisation is the default on every accelerated type"},
        ]})
        for rule, reason in (
                ("AwsSolutions-EC28", ("a benchmark instance lives minutes and reports its own figures; detailed "
                                       "monitoring would cost more than it tells")),
                ("AwsSolutions-EC29", ("the instance must terminate itself at its time limit: termination protection "
                                       "or an ASG that replaces it would defeat the cost bound"))):
            cdk.Validations.of(self.instance).acknowledge(cdk.Acknowledgment(id=rule, reason=reason))
        for tag_key, value in (tags or {}).items():
            cdk.Tags.of(self.launch_template).add(tag_key, value)
        self.user_data = script
