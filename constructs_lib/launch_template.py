"""A launch template for one accelerated node, right by default: DLAMI, EFA on every card,
NVMe RAID 0, IMDSv2, encrypted gp3 root, SSM Session Manager and no SSH key."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Optional, Sequence

import aws_cdk as cdk
import aws_cdk.aws_ec2 as ec2
import aws_cdk.aws_iam as iam
import jsii
from constructs import Construct, IValidation

from selector.profiles import get_profile
from selector.recommend import recommend

from .ami import DeepLearningAmi
from .efa import EfaNetworking, efa_interfaces
from .facts import InstanceLike, resolve
from .raid import NvmeRaid0
from .userdata import (ETC_DIR, LIB_DIR, USER_DATA_LIMIT, NodeScript, boot_unit, encode_user_data, env_file,
                       gzip_user_data)
from .validation import ConfigurationError, Finding, NodeRequest, validate

if TYPE_CHECKING:
    from .checkpoints import CheckpointBucket

RUNTIME_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runtime")


@jsii.implements(IValidation)
class _UserDataLimit:
    def __init__(self, owner: "GpuLaunchTemplate") -> None:
        self.owner = owner

    def validate(self) -> list[str]:
        size = self.owner.user_data_bytes()
        if size > USER_DATA_LIMIT:
            return [f"user data is {size} bytes (compressed), over EC2's {USER_DATA_LIMIT}-byte limit: "
                    "move large scripts to S3 and fetch them at boot"]
        return []


@jsii.implements(cdk.IStableAnyProducer)
class _UserDataProducer:
    def __init__(self, owner: "GpuLaunchTemplate") -> None:
        self.owner = owner

    def produce(self) -> Any:
        script = self.owner.user_data_script()
        if cdk.Token.is_unresolved(script):
            return {"Fn::Base64": script}  # tokens (from extra user data) cannot be compressed at synth
        return encode_user_data(script)


class GpuLaunchTemplate(Construct):
    """Composes DeepLearningAmi, EfaNetworking and NvmeRaid0 into one launch template.

    Give either `instance_type` or `profile` (the selector's pick for it in `region`).
    Keyword-only props (defaults in brackets):
      vpc: the VPC of the nodes.
      instance_type / profile / region ["us-east-1"].
      multi_node [False]: several nodes; needs EFA (checked) and adds the placement group.
      efa [multi_node]: EFA interfaces on every network card.
      interface_layout ["efa-only"]: see constructs_lib.efa.efa_interfaces.
      machine_image [DeepLearningAmi for the type]: any IMachineImage; set ami_architecture
        when it is not a DeepLearningAmi so the architecture check can run.
      raid [True]: NVMe RAID 0 at `scratch_mount` ["/scratch"]; dlami_mount ["replace"].
      root_volume_gib [200]: encrypted gp3 root volume.
      key_name [None]: no SSH key; use `aws ssm start-session`.
      associate_public_ip [False]: only valid with one interface.
      subnets: the subnets the nodes will use (checked: one AZ with a placement group).
      extra_user_data [()]: bash lines appended after dl-launcher's own steps.
      share_from [None]: another GpuLaunchTemplate of the same cluster whose role, security
        group and placement group this one reuses (capacity alternates).

    Attributes: launch_template (ec2.LaunchTemplate; `.node.default_child` is the escape hatch),
    role, instance_profile, security_group, placement_group, facts, efa (EfaNetworking or None), node_script,
    findings (validator warnings). User data is gzip-compressed at synth (cloud-init unpacks it).
    """

    def __init__(
        self, scope: Construct, construct_id: str, *, vpc: ec2.IVpc, instance_type: Optional[InstanceLike] = None,
        profile: Optional[str] = None, region: str = "us-east-1", multi_node: bool = False, efa: Optional[bool] = None,
        interface_layout: str = "efa-only", machine_image: Optional[ec2.IMachineImage] = None,
        ami_architecture: Optional[str] = None, raid: bool = True, scratch_mount: str = "/scratch",
        dlami_mount: str = "replace", root_volume_gib: int = 200, key_name: Optional[str] = None,
        associate_public_ip: bool = False, subnets: Optional[ec2.SubnetSelection] = None,
        extra_user_data: Sequence[str] = (), share_from: Optional["GpuLaunchTemplate"] = None,
    ) -> None:
        super().__init__(scope, construct_id)
        if (instance_type is None) == (profile is None):
            raise ConfigurationError("GpuLaunchTemplate needs exactly one of instance_type or profile")
        if instance_type is None:
            rec = recommend(get_profile(profile), region=region)
            if rec.pick is None:
                raise ConfigurationError(rec.why)
            instance_type = rec.pick.facts
        self.facts = facts = resolve(instance_type)
        self.scratch_mount = scratch_mount
        efa = facts.efa and multi_node if efa is None else efa

        image = machine_image or DeepLearningAmi(instance=facts)
        self.machine_image = image
        interfaces = len(efa_interfaces(facts, layout=interface_layout)) if efa and facts.efa else 1
        self.findings: list[Finding] = validate(NodeRequest(
            facts=facts, efa=efa, multi_node=multi_node, public_ip=associate_public_ip, interfaces=interfaces,
            ami_architecture=ami_architecture or getattr(image, "architecture", None), raid=raid,
            subnet_azs=_subnet_azs(vpc, subnets), placement_group=bool(efa and multi_node)))
        for f in self.findings:
            cdk.Annotations.of(self).add_warning_v2(f"dl-launcher:{f.rule}", str(f))

        shared_efa = share_from.efa if share_from else None
        self.efa: Optional[EfaNetworking] = (
            EfaNetworking(self, "Efa", vpc=vpc, instance=facts, layout=interface_layout, placement_group=multi_node,
                          share_from=shared_efa) if efa else None)
        if self.efa:
            self.security_group = self.efa.security_group
        elif share_from is not None:
            self.security_group = share_from.security_group
        else:
            self.security_group = ec2.SecurityGroup(self, "Sg", vpc=vpc, allow_all_outbound=False,
                                                    description=f"{facts.instance_type} node: HTTPS out only")
            self.security_group.add_egress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(443),
                                                "AWS APIs (SSM, S3, EC2), container and package mirrors")
        self.placement_group = self.efa.placement_group if self.efa else None
        self.placement_group_name = self.efa.placement_group_name if self.efa else None
        self.role = share_from.role if share_from else self._node_role(facts.instance_type)
        # One instance profile per role: the L2 launch template would make one per template.
        self.instance_profile = (share_from.instance_profile if share_from
                                 else iam.InstanceProfile(self, "Profile", role=self.role))

        self.node_script = NodeScript()
        self.node_script.add_file(f"{ETC_DIR}/node.env", env_file({
            "DL_INSTANCE_TYPE": facts.instance_type, "DL_ACCELERATOR": facts.accelerator,
            "DL_PROCS_PER_NODE": str(facts.processes_per_node), "DL_SDK": facts.sdk, "DL_SCRATCH": scratch_mount,
            "DL_CHECKPOINT_DIR": f"{scratch_mount}/checkpoints"}))
        if raid:
            NvmeRaid0(self, "Raid0", instance=facts, mount_point=scratch_mount, dlami_mount=dlami_mount).add_to(
                self.node_script)
        if self.efa:
            path = self.node_script.add_script("efa_env.sh")
            self.node_script.add_file(f"{ETC_DIR}/efa-sdk.env", env_file({"SDK": facts.sdk}))
            self.node_script.add_unit("dl-efa-env.service", boot_unit(
                "EFA/NCCL environment for jobs", f"/bin/bash {path}", env_files=(f"{ETC_DIR}/efa-sdk.env",)))
        self._extra = list(extra_user_data)
        self._runtime_installed = False

        self.launch_template = ec2.LaunchTemplate(
            self, "Template",
            instance_type=ec2.InstanceType(facts.instance_type),
            machine_image=image,
            instance_profile=self.instance_profile,
            security_group=None if self.efa else self.security_group,
            require_imdsv2=True,
            http_tokens=ec2.LaunchTemplateHttpTokens.REQUIRED,
            http_put_response_hop_limit=2,  # containers on the node can reach IMDSv2 through one hop
            http_endpoint=True,
            instance_metadata_tags=True,    # the node runtime reads its bucket and cluster from tags
            key_name=key_name,
            associate_public_ip_address=None if self.efa else (associate_public_ip or None),
            block_devices=[ec2.BlockDevice(
                device_name=getattr(image, "root_device_name", "/dev/sda1"),
                volume=ec2.BlockDeviceVolume.ebs(root_volume_gib, volume_type=ec2.EbsDeviceVolumeType.GP3,
                                                 encrypted=True, delete_on_termination=True))],
        )
        cfn: ec2.CfnLaunchTemplate = self.launch_template.node.default_child
        # Rendered at synth, so that steps added later (checkpoints, rendezvous) still get in.
        cfn.add_property_override("LaunchTemplateData.UserData", cdk.Lazy.any(_UserDataProducer(self)))
        if self.efa and self.efa.placement_group_name:
            cfn.add_property_override("LaunchTemplateData.Placement.GroupName", self.efa.placement_group_name)
        if self.efa:
            cfn.add_property_override("LaunchTemplateData.NetworkInterfaces", self.efa.network_interfaces())
            cfn.add_property_deletion_override("LaunchTemplateData.SecurityGroupIds")
        self.node.add_validation(_UserDataLimit(self))

    def _node_role(self, instance_type: str) -> iam.Role:
        role = iam.Role(self, "Role", assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
                        description=f"dl-launcher node ({instance_type}): SSM Session Manager")
        role.add_managed_policy(iam.ManagedPolicy.from_aws_managed_policy_name("AmazonSSMManagedInstanceCore"))
        cdk.Validations.of(role).acknowledge(cdk.Acknowledgment(
            id="AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/AmazonSSMManagedInstanceCore]",
            reason="AmazonSSMManagedInstanceCore is AWS's maintained minimum for SSM Session Manager, which "
                   "replaces SSH; a copy would silently miss the changes AWS makes to the agent's needs"))
        return role

    # ---- composition ---------------------------------------------------------------------------
    def add_user_data(self, *lines: str) -> None:
        """Append bash lines (after dl-launcher's own steps)."""
        self._extra.extend(lines)

    def add_tag(self, key: str, value: str) -> None:
        """A tag on the instances and volumes (readable on the node through IMDS)."""
        cdk.Tags.of(self.launch_template).add(key, value)

    def install_runtime(self) -> str:
        """Put constructs_lib.runtime on the node; returns the command that runs it."""
        launcher = f"{LIB_DIR}/dl_runtime.sh"
        if not self._runtime_installed:
            pkg = f"{LIB_DIR}/python/constructs_lib"
            self.node_script.add_file(f"{pkg}/__init__.py", "")
            self.node_script.add_python_package(RUNTIME_DIR, f"{pkg}/runtime")
            self.node_script.add_script("dl_runtime.sh")
            self._runtime_installed = True
        return f"/bin/bash {launcher}"

    def enable_checkpoints(self, bucket: "CheckpointBucket", prefix: str, *, watch_poll_seconds: int = 5) -> None:
        """Checkpoints in S3 for this node: the role may read/write `prefix`, the newest complete
        checkpoint is restored at boot, and the interruption watcher uploads on a spot notice."""
        bucket.grant_read_write(self.role, prefix)
        self.add_tag("dl-launcher:checkpoint-bucket", bucket.bucket.bucket_name)
        self.add_tag("dl-launcher:checkpoint-prefix", prefix)
        self._checkpoint = (bucket, prefix, watch_poll_seconds)
        self._install_checkpoint_units(watch_poll_seconds)

    def _install_checkpoint_units(self, watch_poll_seconds: int) -> None:
        runtime = self.install_runtime()
        envs = (f"{ETC_DIR}/node.env",)
        self.node_script.add_unit("dl-checkpoint-restore.service", boot_unit(
            "restore the newest complete checkpoint from S3", f"{runtime} resume", env_files=envs,
            after="dl-nvme-raid0.service network-online.target"))
        watcher = "\n".join([
            "[Unit]", "Description=dl-launcher: spot interruption watcher (IMDSv2)",
            "After=dl-checkpoint-restore.service network-online.target", "",
            "[Service]", f"EnvironmentFile=-{ETC_DIR}/node.env",
            f"ExecStart={runtime} watch --poll {watch_poll_seconds}", "Restart=always", "RestartSec=5", "",
            "[Install]", "WantedBy=multi-user.target", ""])
        self.node_script.add_unit("dl-interruption-watcher.service", watcher)

    def enable_job(self, *, cluster: str, command: str = "", grant: bool = True) -> None:
        """Rendezvous and the job unit: the node finds its peers (tag dl-launcher:cluster), then
        runs `command` (after the checkpoint restore) with MASTER_ADDR, NODE_RANK, ... set.
        `dl-torchrun script.py` on the node is torchrun with this cluster's rendezvous."""
        if "\n" in command:
            raise ConfigurationError("the job command must be one line")
        self.add_tag("dl-launcher:cluster", cluster)
        if grant:
            self.role.add_to_principal_policy(iam.PolicyStatement(actions=["ec2:DescribeInstances"], resources=["*"]))
            cdk.Validations.of(self.role).acknowledge(cdk.Acknowledgment(
                id="AwsSolutions-IAM5[Resource::*]",
                reason="ec2:DescribeInstances supports no resource-level permissions; nodes use it read-only to "
                       "find their peers by tag"))
        self.install_runtime()
        for script in ("dl_env.sh", "dl_job.sh", "dl_torchrun.sh"):
            self.node_script.add_script(script)
        self.node_script.add_commands(f"ln -sf {LIB_DIR}/dl_torchrun.sh /usr/local/bin/dl-torchrun")
        self.node_script.add_file(f"{ETC_DIR}/job.env", env_file({"DL_COMMAND": command, "DL_CLUSTER": cluster}))
        unit = "\n".join([
            "[Unit]", "Description=dl-launcher: the training job",
            "After=dl-checkpoint-restore.service dl-efa-env.service dl-nvme-raid0.service network-online.target",
            "Wants=network-online.target", "",
            "[Service]", "Type=simple", f"ExecStart=/bin/bash {LIB_DIR}/dl_job.sh",
            "Restart=on-failure", "RestartSec=30", "KillSignal=SIGTERM", "TimeoutStopSec=90", "",
            "[Install]", "WantedBy=multi-user.target", ""])
        self.node_script.add_unit("dl-job.service", unit)

    def enable_checkpoints_like(self, other: "GpuLaunchTemplate") -> None:
        """The same checkpoint setup as `other` (a capacity alternate sharing its role)."""
        self.add_tag("dl-launcher:checkpoint-bucket", other._checkpoint[0].bucket.bucket_name)
        self.add_tag("dl-launcher:checkpoint-prefix", other._checkpoint[1])
        self._install_checkpoint_units(other._checkpoint[2])

    # ---- rendering -----------------------------------------------------------------------------
    def user_data_script(self) -> str:
        return "#!/bin/bash\n" + self.node_script.render() + "".join(line + "\n" for line in self._extra)

    def user_data_bytes(self) -> int:
        script = self.user_data_script()
        if cdk.Token.is_unresolved(script):
            return len(script.encode())
        return len(gzip_user_data(script))

    @property
    def connections(self) -> ec2.Connections:
        return ec2.Connections(security_groups=[self.security_group])


def select_subnets(vpc: ec2.IVpc, selection: ec2.SubnetSelection) -> ec2.SelectedSubnets:
    """vpc.select_subnets for a SubnetSelection value (the Python binding takes only keywords)."""
    return vpc.select_subnets(subnet_group_name=selection.subnet_group_name, subnet_type=selection.subnet_type,
                              availability_zones=selection.availability_zones, subnets=selection.subnets,
                              one_per_az=selection.one_per_az)


def _subnet_azs(vpc: ec2.IVpc, subnets: Optional[ec2.SubnetSelection]) -> tuple[str, ...]:
    if subnets is None:
        return ()
    selected = select_subnets(vpc, subnets).subnets
    return tuple(s.availability_zone for s in selected if not cdk.Token.is_unresolved(s.availability_zone))
