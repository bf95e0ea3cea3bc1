"""A launch template for one accelerated node, right by default: DLAMI, EFA on every card,
NVMe RAID 0, IMDSv2, encrypted gp3 root, SSM Session Manager and no SSH key."""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

import aws_cdk as cdk
import aws_cdk.aws_ec2 as ec2
import aws_cdk.aws_iam as iam
import jsii
from constructs import Construct, IValidation

from selector.profiles import get_profile
from selector.recommend import recommend

from .ami import DeepLearningAmi
from .bundle import AGENT_UNIT, EFA_SDK_ENV, EFA_UNIT, JOB_UNIT, UNITS, NodeBundle
from .efa import EfaNetworking, efa_interfaces
from .facts import InstanceLike, resolve
from .raid import NvmeRaid0
from .runtime import contract
from .userdata import SettingsFile, limit_problem, upper_bound, user_data_parts
from .validation import ConfigurationError, Finding, NodeRequest, validate

if TYPE_CHECKING:
    from .checkpoints import CheckpointBucket


@jsii.implements(IValidation)
class _UserDataLimit:
    def __init__(self, owner: "GpuLaunchTemplate") -> None:
        self.owner = owner

    def validate(self) -> list[str]:
        problem = limit_problem(self.owner.user_data_parts())
        return [problem] if problem else []


@jsii.implements(cdk.IStableStringProducer)
class _UserDataProducer:
    def __init__(self, owner: "GpuLaunchTemplate") -> None:
        self.owner = owner

    def produce(self) -> str:
        return self.owner.user_data_script()


class GpuLaunchTemplate(Construct):
    """Composes DeepLearningAmi, EfaNetworking, NvmeRaid0 and the node bundle into one launch template.

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
      extra_user_data [()]: bash lines run after dl-launcher's bootstrap (not if the bootstrap
        fails: the node then shuts down). Tokens are fine.
      role [a new role with SSM Session Manager]: the nodes' role; it is granted s3:GetObject on
        the node bundle either way.
      instance_profile [a new one for `role`].
      security_group [EFA: all traffic within the group, HTTPS out; otherwise HTTPS out only].
      placement_group [a new cluster placement group for multi-node EFA nodes, else none].
      Pass the last four to share them between the templates of one cluster (capacity alternates).

    Attributes: launch_template (ec2.LaunchTemplate; `.node.default_child` is the escape hatch),
    role, instance_profile, security_group, placement_group, placement_group_name, facts, efa
    (EfaNetworking when this template made the EFA security group, else None), raid (NvmeRaid0 or
    None), bundle (NodeBundle), findings (validator warnings).

    User data is a small bootstrap (see constructs_lib/userdata.py): it writes this node's
    settings, fetches the node bundle from S3 and installs its units. The template's
    instance-initiated shutdown behaviour is terminate: a node whose bootstrap cannot fetch the
    bundle shuts itself down and its capacity replaces it.
    """

    def __init__(
        self, scope: Construct, construct_id: str, *, vpc: ec2.IVpc, instance_type: Optional[InstanceLike] = None,
        profile: Optional[str] = None, region: str = "us-east-1", multi_node: bool = False, efa: Optional[bool] = None,
        interface_layout: str = "efa-only", machine_image: Optional[ec2.IMachineImage] = None,
        ami_architecture: Optional[str] = None, raid: bool = True, scratch_mount: str = "/scratch",
        dlami_mount: str = "replace", root_volume_gib: int = 200, key_name: Optional[str] = None,
        associate_public_ip: bool = False, subnets: Optional[ec2.SubnetSelection] = None,
        extra_user_data: Sequence[str] = (), role: Optional[iam.IRole] = None,
        instance_profile: Optional[iam.IInstanceProfile] = None, security_group: Optional[ec2.ISecurityGroup] = None,
        placement_group: Optional[ec2.IPlacementGroup] = None,
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
        interfaces = efa_interfaces(facts, layout=interface_layout) if efa and facts.efa else None
        self.findings: list[Finding] = validate(NodeRequest(
            facts=facts, efa=efa, multi_node=multi_node, public_ip=associate_public_ip,
            interfaces=len(interfaces) if interfaces else 1,
            ami_architecture=ami_architecture or getattr(image, "architecture", None), raid=raid,
            subnet_azs=_subnet_azs(vpc, subnets), placement_group=bool(efa and multi_node)))
        for f in self.findings:
            cdk.Annotations.of(self).add_warning_v2(f"dl-launcher:{f.rule}", str(f))

        self.efa: Optional[EfaNetworking] = None
        if efa and security_group is None:
            self.efa = EfaNetworking(self, "Efa", vpc=vpc, instance=facts, layout=interface_layout,
                                     placement_group=multi_node and placement_group is None)
        self.security_group = security_group or (self.efa.security_group if self.efa else self._https_only(vpc))
        if placement_group is None and self.efa is not None:
            placement_group = self.efa.placement_group
        elif placement_group is None and efa and multi_node:
            placement_group = ec2.PlacementGroup(self, "Cluster", strategy=ec2.PlacementGroupStrategy.CLUSTER)
        self.placement_group = placement_group
        self.placement_group_name = _placement_group_name(placement_group) if placement_group else None
        self.role = role or self._node_role(facts.instance_type)
        # One instance profile per role: the L2 launch template would make one per template.
        self.instance_profile = instance_profile or iam.InstanceProfile(self, "Profile", role=self.role)

        self.bundle = NodeBundle.of(self)
        self.bundle.grant_fetch(self.role)
        self._env: dict[str, str] = {}
        self._set_env(DL_INSTANCE_TYPE=facts.instance_type, DL_ACCELERATOR=facts.accelerator,
                      DL_PROCS_PER_NODE=str(facts.processes_per_node), DL_SDK=facts.sdk, DL_SCRATCH=scratch_mount,
                      DL_CHECKPOINT_DIR=f"{scratch_mount}/checkpoints")
        self._units: set[str] = set()
        self._files: list[SettingsFile] = []
        self._job: Optional[SettingsFile] = None
        self.raid = NvmeRaid0(self, "Raid0", instance=facts, mount_point=scratch_mount,
                              dlami_mount=dlami_mount) if raid else None
        if self.raid:
            self._files.append(self.raid.settings)
            self._units.add(self.raid.UNIT)
        if interfaces:
            self._files.append(SettingsFile("EFA settings", f"$DL_ETC_DIR/{EFA_SDK_ENV}",
                                            contract.env_text({"SDK": facts.sdk})))
            self._units.add(EFA_UNIT)
        self._extra = list(extra_user_data)

        self.launch_template = ec2.LaunchTemplate(
            self, "Template",
            instance_type=ec2.InstanceType(facts.instance_type),
            machine_image=image,
            instance_profile=self.instance_profile,
            security_group=None if interfaces else self.security_group,
            require_imdsv2=True,
            http_tokens=ec2.LaunchTemplateHttpTokens.REQUIRED,
            http_put_response_hop_limit=2,  # containers on the node can reach IMDSv2 through one hop
            http_endpoint=True,
            instance_metadata_tags=True,    # the node runtime reads its bucket and cluster from tags
            # A node whose bootstrap fails shuts itself down; terminated, its capacity replaces it.
            instance_initiated_shutdown_behavior=ec2.InstanceInitiatedShutdownBehavior.TERMINATE,
            key_name=key_name,
            associate_public_ip_address=None if interfaces else (associate_public_ip or None),
            block_devices=[ec2.BlockDevice(
                device_name=getattr(image, "root_device_name", "/dev/sda1"),
                volume=ec2.BlockDeviceVolume.ebs(root_volume_gib, volume_type=ec2.EbsDeviceVolumeType.GP3,
                                                 encrypted=True, delete_on_termination=True))],
            # Rendered at synth, so that what is enabled later (checkpoints, the job) still gets in.
            user_data=ec2.UserData.custom(cdk.Lazy.string(_UserDataProducer(self))),
        )
        cfn: ec2.CfnLaunchTemplate = self.launch_template.node.default_child
        if self.placement_group_name:
            cfn.add_property_override("LaunchTemplateData.Placement.GroupName", self.placement_group_name)
        if interfaces:
            cfn.add_property_override("LaunchTemplateData.NetworkInterfaces", [
                {**i, "Groups": [self.security_group.security_group_id], "DeleteOnTermination": True}
                for i in interfaces])
            cfn.add_property_deletion_override("LaunchTemplateData.SecurityGroupIds")
        self.node.add_validation(_UserDataLimit(self))

    def _https_only(self, vpc: ec2.IVpc) -> ec2.SecurityGroup:
        sg = ec2.SecurityGroup(self, "Sg", vpc=vpc, allow_all_outbound=False,
                               description=f"{self.facts.instance_type} node: HTTPS out only")
        sg.add_egress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(443), "AWS APIs (SSM, S3, EC2), container and package mirrors")
        return sg

    def _node_role(self, instance_type: str) -> iam.Role:
        role = iam.Role(self, "Role", assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
                        description=f"dl-launcher node ({instance_type}): SSM Session Manager")
        role.add_managed_policy(iam.ManagedPolicy.from_aws_managed_policy_name("AmazonSSMManagedInstanceCore"))
        cdk.Validations.of(role).acknowledge(cdk.Acknowledgment(
            id="AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/AmazonSSMManagedInstanceCore]",
            reason="AmazonSSMManagedInstanceCore is AWS's maintained minimum for SSM Session Manager, which "
                   "replaces SSH; a copy would silently miss the changes AWS makes to the agent's needs"))
        return role

    def _set_env(self, **values: str) -> None:
        contract.env_text(values)  # refuses, now, a value that would change meaning in node.env
        self._env.update(values)

    # ---- composition ---------------------------------------------------------------------------
    def add_user_data(self, *lines: str) -> None:
        """Append bash lines, run after dl-launcher's bootstrap (tokens are fine)."""
        self._extra.extend(lines)

    def add_tag(self, key: str, value: str) -> None:
        """A tag on the instances and volumes (readable on the node through IMDS)."""
        cdk.Tags.of(self.launch_template).add(key, value)

    def enable_checkpoints(self, bucket: "CheckpointBucket", prefix: str, *, grant: bool = True) -> None:
        """Checkpoints in S3 for this node: the node agent uploads new complete saves under
        `prefix` (and at once on a spot notice); the job supervisor restores from there.
        grant [True]: give the role read/write on `prefix` (False when a sibling template
        sharing the role already did)."""
        if grant:
            bucket.grant_read_write(self.role, prefix)
        self.add_tag(contract.TAG_CHECKPOINT_BUCKET, bucket.bucket.bucket_name)
        self.add_tag(contract.TAG_CHECKPOINT_PREFIX, prefix)
        self._units.add(AGENT_UNIT)

    def enable_job(self, *, cluster: str, command: str = "", grant: bool = True) -> None:
        """Rendezvous and the job unit: the node finds its peers (tag dl-launcher:cluster), and
        the job supervisor runs `command` with MASTER_ADDR, NODE_RANK, ... set. `command` is a
        bash script body, written verbatim to the contract's job_command file: variables, quotes
        and several lines are fine; only the heredoc marker (userdata.HEREDOC) is refused.
        `dl-torchrun script.py` on the node is torchrun with this cluster's rendezvous.
        grant [True]: let the role find peers (ec2:DescribeInstances)."""
        job = SettingsFile("the job command", "$DL_JOB_COMMAND_FILE", command) if command else None
        self._set_env(DL_CLUSTER=cluster)
        self.add_tag(contract.TAG_CLUSTER, cluster)
        if grant:
            self.role.add_to_principal_policy(iam.PolicyStatement(actions=["ec2:DescribeInstances"], resources=["*"]))
            cdk.Validations.of(self.role).acknowledge(cdk.Acknowledgment(
                id="AwsSolutions-IAM5[Resource::*]",
                reason="ec2:DescribeInstances supports no resource-level permissions; nodes use it read-only to "
                       "find their peers by tag"))
        self._job = job
        self._units.add(JOB_UNIT)

    # ---- rendering -----------------------------------------------------------------------------
    def node_env(self) -> str:
        """node.env: this node's facts, its units and where its bundle is (tokens until deploy)."""
        units = " ".join(u for u in UNITS if u in self._units)
        # Tokens cannot go through env_text (their ${Token[..]} markers hold a $); what
        # CloudFormation puts in their place, a bucket name and key and a region, holds no
        # quote, $ or backslash.
        return (contract.env_text({**self._env, "DL_UNITS": units})
                + f'DL_BUNDLE_URL="{self.bundle.url}"\nDL_REGION="{cdk.Stack.of(self).region}"\n')

    def user_data_parts(self) -> list[tuple[str, str]]:
        """(label, text) of each part of the user data, in order (for the size check)."""
        files = [SettingsFile("node settings (node.env)", "$DL_NODE_ENV_FILE", self.node_env()), *self._files]
        if self._job:
            files.append(self._job)
        return user_data_parts(files, self._extra)

    def user_data_script(self) -> str:
        """The user data as it will be deployed, with tokens where CloudFormation fills them in."""
        return "".join(text for _, text in self.user_data_parts())

    def user_data_bytes(self) -> int:
        """Its size, exact for text and at most userdata.TOKEN_BYTES for each token."""
        return upper_bound(self.user_data_script())

    @property
    def connections(self) -> ec2.Connections:
        return ec2.Connections(security_groups=[self.security_group])


def _placement_group_name(group: ec2.IPlacementGroup) -> str:
    """Ref of a group made here, not GetAtt: the same value, and CloudFormation emulators that do
    not model placement groups can still resolve it."""
    child = group.node.default_child
    return child.ref if isinstance(child, ec2.CfnPlacementGroup) else group.placement_group_name


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
