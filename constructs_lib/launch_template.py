"""A launch template for one accelerated node, right by default: DLAMI, EFA on every card,
NVMe RAID 0, IMDSv2, encrypted gp3 root, SSM Session Manager and no SSH key."""
from __future__ import annotations

from typing import Optional, Sequence

import aws_cdk as cdk
import aws_cdk.aws_ec2 as ec2
import aws_cdk.aws_iam as iam
import jsii
from constructs import Construct, IValidation

from selector.profiles import get_profile
from selector.recommend import recommend

from .ami import DeepLearningAmi
from .efa import EfaNetworking
from .facts import InstanceLike, resolve
from .raid import NvmeRaid0
from .userdata import ETC_DIR, USER_DATA_LIMIT, NodeScript, boot_unit, env_file, user_data_size
from .validation import Finding, NodeRequest, validate


@jsii.implements(IValidation)
class _UserDataLimit:
    def __init__(self, owner: "GpuLaunchTemplate") -> None:
        self.owner = owner

    def validate(self) -> list[str]:
        size = user_data_size(self.owner.render_user_data())
        if size > USER_DATA_LIMIT:
            return [f"user data is {size} bytes, over EC2's {USER_DATA_LIMIT}-byte limit: "
                    "move large scripts to an S3 asset and fetch them at boot"]
        return []


@jsii.implements(cdk.IStableStringProducer)
class _RenderedUserData:
    def __init__(self, owner: "GpuLaunchTemplate") -> None:
        self.owner = owner

    def produce(self) -> str:
        return "#!/bin/bash\n" + self.owner.render_user_data()


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

    Attributes: launch_template (ec2.LaunchTemplate; `.node.default_child` is the escape hatch),
    role, security_group, placement_group, facts, efa (EfaNetworking or None), node_script,
    findings (validator warnings).
    """

    def __init__(
        self, scope: Construct, construct_id: str, *, vpc: ec2.IVpc, instance_type: Optional[InstanceLike] = None,
        profile: Optional[str] = None, region: str = "us-east-1", multi_node: bool = False, efa: Optional[bool] = None,
        interface_layout: str = "efa-only", machine_image: Optional[ec2.IMachineImage] = None,
        ami_architecture: Optional[str] = None, raid: bool = True, scratch_mount: str = "/scratch",
        dlami_mount: str = "replace", root_volume_gib: int = 200, key_name: Optional[str] = None,
        associate_public_ip: bool = False, subnets: Optional[ec2.SubnetSelection] = None,
        extra_user_data: Sequence[str] = (),
    ) -> None:
        super().__init__(scope, construct_id)
        if (instance_type is None) == (profile is None):
            from .validation import ConfigurationError
            raise ConfigurationError("GpuLaunchTemplate needs exactly one of instance_type or profile")
        if instance_type is None:
            rec = recommend(get_profile(profile), region=region)
            if rec.pick is None:
                from .validation import ConfigurationError
                raise ConfigurationError(rec.why)
            instance_type = rec.pick.facts
        self.facts = facts = resolve(instance_type)
        efa = facts.efa and multi_node if efa is None else efa

        image = machine_image or DeepLearningAmi(instance=facts)
        arch = ami_architecture or getattr(image, "architecture", None)
        interfaces = 1
        if efa and facts.efa:
            from .efa import efa_interfaces
            interfaces = len(efa_interfaces(facts, layout=interface_layout))
        azs: tuple[str, ...] = ()
        if subnets is not None:
            azs = tuple(s.availability_zone for s in vpc.select_subnets(subnet_group_name=subnets.subnet_group_name,
                                                                        subnet_type=subnets.subnet_type,
                                                                        availability_zones=subnets.availability_zones,
                                                                        subnets=subnets.subnets,
                                                                        one_per_az=subnets.one_per_az).subnets
                        if not cdk.Token.is_unresolved(s.availability_zone))
        self.findings: list[Finding] = validate(NodeRequest(
            facts=facts, efa=efa, multi_node=multi_node, public_ip=associate_public_ip, interfaces=interfaces,
            ami_architecture=arch, raid=raid, subnet_azs=azs, placement_group=bool(efa and multi_node)))
        for f in self.findings:
            cdk.Annotations.of(self).add_warning_v2(f"dl-launcher:{f.rule}", str(f))

        self.efa: Optional[EfaNetworking] = (
            EfaNetworking(self, "Efa", vpc=vpc, instance=facts, layout=interface_layout, placement_group=multi_node)
            if efa else None)
        if self.efa:
            self.security_group = self.efa.security_group
        else:
            self.security_group = ec2.SecurityGroup(self, "Sg", vpc=vpc, allow_all_outbound=False,
                                                    description=f"{facts.instance_type} node: HTTPS out only")
            self.security_group.add_egress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(443),
                                                "AWS APIs (SSM, S3, EC2), container and package mirrors")
        self.placement_group = self.efa.placement_group if self.efa else None

        self.role = iam.Role(self, "Role", assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
                             description=f"dl-launcher node ({facts.instance_type}): SSM Session Manager")
        self.role.add_managed_policy(iam.ManagedPolicy.from_aws_managed_policy_name("AmazonSSMManagedInstanceCore"))
        cdk.Validations.of(self.role).acknowledge(cdk.Acknowledgment(
            id="AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/AmazonSSMManagedInstanceCore]",
            reason="AmazonSSMManagedInstanceCore is AWS's maintained minimum for SSM Session Manager, which "
                   "replaces SSH; a copy would silently miss the changes AWS makes to the agent's needs"))

        self.node_script = NodeScript()
        self.node_script.add_file(f"{ETC_DIR}/node.env", env_file({
            "DL_INSTANCE_TYPE": facts.instance_type, "DL_ACCELERATOR": facts.accelerator,
            "DL_PROCS_PER_NODE": str(facts.processes_per_node), "DL_SDK": facts.sdk, "DL_SCRATCH": scratch_mount}))
        if raid:
            NvmeRaid0(self, "Raid0", instance=facts, mount_point=scratch_mount, dlami_mount=dlami_mount).add_to(
                self.node_script)
        if self.efa:
            path = self.node_script.add_script("efa_env.sh")
            self.node_script.add_file(f"{ETC_DIR}/efa-sdk.env", env_file({"SDK": facts.sdk}))
            self.node_script.add_unit("dl-efa-env.service", boot_unit(
                "EFA/NCCL environment for jobs", f"/bin/bash {path}", env_files=(f"{ETC_DIR}/efa-sdk.env",)))
        self._extra = list(extra_user_data)

        root = getattr(image, "root_device_name", "/dev/sda1")
        self.launch_template = ec2.LaunchTemplate(
            self, "Template",
            instance_type=ec2.InstanceType(facts.instance_type),
            machine_image=image,
            # Rendered at synth, so constructs added later (checkpoints, rendezvous) still get in.
            user_data=ec2.UserData.custom(cdk.Lazy.string(_RenderedUserData(self))),
            role=self.role,
            security_group=None if self.efa else self.security_group,
            require_imdsv2=True,
            http_tokens=ec2.LaunchTemplateHttpTokens.REQUIRED,
            http_put_response_hop_limit=2,  # containers on the node can reach IMDSv2 through one hop
            http_endpoint=True,
            instance_metadata_tags=True,
            key_name=key_name,
            associate_public_ip_address=None if self.efa else (associate_public_ip or None),
            placement_group=self.placement_group,
            block_devices=[ec2.BlockDevice(device_name=root, volume=ec2.BlockDeviceVolume.ebs(
                root_volume_gib, volume_type=ec2.EbsDeviceVolumeType.GP3, encrypted=True, delete_on_termination=True))],
        )
        if self.efa:
            cfn: ec2.CfnLaunchTemplate = self.launch_template.node.default_child
            cfn.add_property_override("LaunchTemplateData.NetworkInterfaces", self.efa.network_interfaces())
            cfn.add_property_deletion_override("LaunchTemplateData.SecurityGroupIds")
        self.node.add_validation(_UserDataLimit(self))

    def add_user_data(self, *lines: str) -> None:
        """Append bash lines (after dl-launcher's own steps)."""
        self._extra.extend(lines)

    def render_user_data(self) -> str:
        return self.node_script.render() + "".join(line + "\n" for line in self._extra)

    @property
    def connections(self) -> ec2.Connections:
        return ec2.Connections(security_groups=[self.security_group])
