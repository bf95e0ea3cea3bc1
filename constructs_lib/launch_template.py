"""A launch template for one accelerated node, right by default: DLAMI, EFA on every card,
NVMe RAID 0, IMDSv2, encrypted gp3 root, SSM Session Manager and no SSH key."""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Optional, Sequence, cast

import aws_cdk as cdk
import aws_cdk.aws_ec2 as ec2
import aws_cdk.aws_iam as iam
from constructs import Construct

from dl_selector import allreduce_baselines
from dl_selector.facts import InstanceFacts
from dl_selector.profiles import get_profile
from dl_selector.recommend import recommend

from .ami import DeepLearningAmi
from .bootstrap import NodeBootstrap
from .efa import EfaNetworking, efa_interfaces, placement_group_name
from .facts import InstanceLike, resolve
from .identity import NodeIdentity
from .nag import resource_of
from .node_options import NodeOptions
from .raid import NvmeRaid0
from .runtime import contract
from .runtime.busbw import format_baseline
from .validation import WARNING, ConfigurationError, Finding, NodeRequest, validate

if TYPE_CHECKING:
    import aws_cdk.aws_ssm as ssm
    from .checkpoints import CheckpointBucket
    from .job import JobDefinition, JobLogs


class GpuLaunchTemplate(Construct):
    """One launch template composed of a NodeIdentity, EfaNetworking (with EFA), NodeBootstrap,
    NvmeRaid0 and the DeepLearningAmi.

    Give either `instance_type` or `profile` (the selector's pick for it in `region`).
    Keyword-only props (defaults in brackets):
      vpc: the VPC of the nodes.
      instance_type / profile / region [the stack's region, else us-east-1]: a name
        ("p5.48xlarge") or ec2.InstanceType; with `profile`, the selector's pick for it in that region.
      multi_node [False]: several nodes; needs EFA (checked) and adds the placement group.
      efa [multi_node]: EFA interfaces on every network card.
      options [NodeOptions()]: root volume, RAID, AMI, SSH key, extra user data, ...; the props of
        the same names below replace its fields when given: root_volume_gib, raid, scratch_mount,
        dlami_mount, interface_layout, key_name, associate_public_ip, machine_image,
        ami_architecture, extra_user_data.
      subnets [the VPC's private subnets]: the subnets the nodes will use (checked: one AZ with a
        placement group, so a multi-node template on a multi-AZ VPC needs them).
      identity [a NodeIdentity made here]: the role (granted s3:GetObject on the node bundle),
        instance profile and security group; or give any of role, instance_profile and
        security_group instead, and the rest is made here.
      placement_group [a new cluster placement group for multi-node EFA nodes, else none].
      Share identity and placement_group between the templates of one cluster (capacity alternates).
      capacity_reservation [None]: launch into this Capacity Reservation (cr-...) or any of a
        resource group's (an ARN) first; capacity_block [False]: the reservation is a Capacity
        Block for ML (market type capacity-block).

    Attributes: launch_template (ec2.LaunchTemplate; `.node.default_child` is the escape hatch),
    identity, role, instance_profile, security_group, placement_group, placement_group_name,
    facts, options (NodeOptions as applied), machine_image, scratch_mount, efa (EfaNetworking when
    the nodes use EFA, else None), raid (NvmeRaid0 or None), bootstrap (NodeBootstrap), bundle
    (NodeBundle), findings (validator warnings, and notes: facts of the type for the summary).

    The instance-initiated shutdown behaviour is terminate: a node whose bootstrap cannot fetch
    the bundle shuts itself down and its capacity replaces it.
    """

    def __init__(
        self, scope: Construct, construct_id: str, *, vpc: ec2.IVpc, instance_type: Optional[InstanceLike] = None,
        profile: Optional[str] = None, region: Optional[str] = None, multi_node: bool = False, efa: Optional[bool] = None,
        options: Optional[NodeOptions] = None, interface_layout: Optional[str] = None,
        machine_image: Optional[ec2.IMachineImage] = None, ami_architecture: Optional[str] = None,
        raid: Optional[bool] = None, scratch_mount: Optional[str] = None, dlami_mount: Optional[str] = None,
        root_volume_gib: Optional[int] = None, key_name: Optional[str] = None,
        associate_public_ip: Optional[bool] = None, subnets: Optional[ec2.SubnetSelection] = None,
        extra_user_data: Optional[Sequence[str]] = None, identity: Optional[NodeIdentity] = None,
        role: Optional[iam.IRole] = None, instance_profile: Optional[iam.IInstanceProfile] = None,
        security_group: Optional[ec2.ISecurityGroup] = None, placement_group: Optional[ec2.IPlacementGroup] = None,
        capacity_reservation: Optional[str] = None, capacity_block: bool = False,
    ) -> None:
        super().__init__(scope, construct_id)
        if (instance_type is None) == (profile is None):
            raise ConfigurationError("GpuLaunchTemplate needs exactly one of instance_type or profile")
        if capacity_block and not capacity_reservation:
            raise ConfigurationError("capacity_block needs capacity_reservation: the Capacity Block's cr- id")
        if identity is not None and (role or instance_profile or security_group):
            raise ConfigurationError("give identity, or role, instance_profile and security_group: not both")
        given = dict(root_volume_gib=root_volume_gib, raid=raid, scratch_mount=scratch_mount, dlami_mount=dlami_mount,
                     interface_layout=interface_layout, key_name=key_name, associate_public_ip=associate_public_ip,
                     machine_image=machine_image, ami_architecture=ami_architecture, extra_user_data=extra_user_data)
        self.options = opts = dataclasses.replace(options or NodeOptions(),
                                                  **{k: v for k, v in given.items() if v is not None})
        # profile is set wherever instance_type is not: the first check took exactly one of them.
        self.facts = facts = resolve(instance_type) if instance_type is not None else _pick(self, cast(str, profile), region)
        self.scratch_mount = opts.scratch_mount
        efa = facts.efa and multi_node if efa is None else efa

        self.machine_image = image = opts.machine_image or DeepLearningAmi(instance=facts)
        self.findings: list[Finding] = validate(NodeRequest(
            facts=facts, efa=efa, multi_node=multi_node, public_ip=opts.associate_public_ip,
            interfaces=len(efa_interfaces(facts, layout=opts.interface_layout)) if efa and facts.efa else 1,
            ami_architecture=opts.ami_architecture or getattr(image, "architecture", None), raid=opts.raid,
            subnet_azs=_subnet_azs(vpc, subnets), placement_group=bool(efa and multi_node)))
        for f in self.findings:
            if f.level == WARNING:
                cdk.Annotations.of(self).add_warning_v2(f"dl-launcher:{f.rule}", str(f))

        # "Default": the pieces keep the logical ids they had when this template made them itself.
        self.identity = identity or NodeIdentity(
            self, "Default", vpc=vpc, efa=efa, label=facts.instance_type, role=role,
            instance_profile=instance_profile, security_group=security_group)
        if efa and self.identity.efa is False:
            raise ConfigurationError("the identity's security group allows HTTPS out only, and EFA needs all "
                                     "traffic within the group: make it with NodeIdentity(efa=True)")
        self.role = self.identity.role
        self.instance_profile = self.identity.instance_profile
        self.security_group = self.identity.security_group
        self.efa: Optional[EfaNetworking] = EfaNetworking(
            self, "Efa", instance=facts, security_group=self.security_group, layout=opts.interface_layout,
            placement_group=multi_node if placement_group is None else placement_group) if efa else None
        self.placement_group = self.efa.placement_group if self.efa else placement_group
        self.placement_group_name = placement_group_name(self.placement_group) if self.placement_group else None

        self.raid = NvmeRaid0(self, "Raid0", instance=facts, mount_point=opts.scratch_mount,
                              dlami_mount=opts.dlami_mount) if opts.raid else None
        self.bootstrap = NodeBootstrap(self, "Bootstrap", instance=facts, role=self.role,
                                       scratch_mount=opts.scratch_mount, extra_user_data=opts.extra_user_data)
        self.bundle = self.bootstrap.bundle
        for part in (self.raid, self.efa):
            if part is not None:
                self.bootstrap.add_unit(part.UNIT, part.settings)

        self.launch_template = ec2.LaunchTemplate(
            self, "Template",
            instance_type=ec2.InstanceType(facts.instance_type),
            machine_image=image,
            instance_profile=self.instance_profile,
            # EFA nodes carry the group on each interface instead.
            security_group=None if self.efa else self.security_group,
            require_imdsv2=True,
            http_tokens=ec2.LaunchTemplateHttpTokens.REQUIRED,
            http_put_response_hop_limit=2,  # containers on the node can reach IMDSv2 through one hop
            http_endpoint=True,
            instance_metadata_tags=True,    # the node runtime reads its bucket and cluster from tags
            # A node whose bootstrap fails shuts itself down; terminated, its capacity replaces it.
            instance_initiated_shutdown_behavior=ec2.InstanceInitiatedShutdownBehavior.TERMINATE,
            key_pair=ec2.KeyPair.from_key_pair_name(self, "KeyPair", opts.key_name) if opts.key_name else None,
            associate_public_ip_address=None if self.efa else (opts.associate_public_ip or None),
            block_devices=[ec2.BlockDevice(
                device_name=getattr(image, "root_device_name", "/dev/sda1"),
                volume=ec2.BlockDeviceVolume.ebs(opts.root_volume_gib, volume_type=ec2.EbsDeviceVolumeType.GP3,
                                                 encrypted=True, delete_on_termination=True))],
            user_data=self.bootstrap.user_data,
        )
        cfn = resource_of(self.launch_template)
        if self.placement_group_name:
            cfn.add_property_override("LaunchTemplateData.Placement.GroupName", self.placement_group_name)
        if capacity_reservation:
            key = "CapacityReservationResourceGroupArn" if capacity_reservation.startswith("arn:") else "CapacityReservationId"
            cfn.add_property_override("LaunchTemplateData.CapacityReservationSpecification",
                                      {"CapacityReservationTarget": {key: capacity_reservation}})
        if capacity_block:
            cfn.add_property_override("LaunchTemplateData.InstanceMarketOptions", {"MarketType": "capacity-block"})
        if self.efa:
            cfn.add_property_override("LaunchTemplateData.NetworkInterfaces", self.efa.network_interfaces())
            cfn.add_property_deletion_override("LaunchTemplateData.SecurityGroupIds")

    # ---- composition ---------------------------------------------------------------------------
    def add_user_data(self, *lines: str) -> None:
        """Append bash lines, run after dl-launcher's bootstrap (tokens are fine)."""
        self.bootstrap.add_user_data(*lines)

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
        self.bootstrap.enable_checkpoints()

    def enable_job(self, *, cluster: str, command: str = "", grant: bool = True) -> None:
        """Rendezvous and the job unit: the node finds its peers (tag dl-launcher:cluster), and
        the job supervisor runs `command` with MASTER_ADDR, NODE_RANK, ... set. `command` is a
        bash script body, written verbatim to the contract's job_command file: variables, quotes
        and several lines are fine; only the heredoc marker (userdata.HEREDOC) is refused.
        `dl-torchrun script.py` on the node is torchrun with this cluster's rendezvous.
        grant [True]: let the role find peers (ec2:DescribeInstances)."""
        self.bootstrap.enable_job(cluster=cluster, command=command)
        self.add_tag(contract.TAG_CLUSTER, cluster)
        if grant:
            self.identity.grant_find_peers()

    def enable_job_definition(self, definition: "JobDefinition", *, grant: bool = True) -> None:
        """The job unit runs `definition` (code, setup, env, secrets, image: constructs_lib.job)
        instead of a command written at boot; call enable_job(cluster=...) without a command too.
        grant [True]: let the role read exactly the definition, its code, secrets and image."""
        self.bootstrap.enable_job_definition(definition.node_env())
        if grant:
            definition.grant_run(self.role)

    def enable_logs(self, logs: "JobLogs", *, grant: bool = True) -> None:
        """The job's output, setup's and the supervisor's lines to `logs` (one stream per node)."""
        self.bootstrap.enable_logs(log_group=logs.log_group_name)
        if grant:
            logs.grant_write(self.role)

    def enable_monitoring(self, *, job: str, grant: bool = True,
                          agent_config: Optional["ssm.IStringParameter"] = None) -> None:
        """The CloudWatch agent and the node monitor (see NodeBootstrap.enable_monitoring), with
        PutMetricData to dl-launcher's namespaces and the node's own health tag.
        agent_config [None]: an SSM parameter holding the agent's configuration (the agent fetches
          it; the role may read it); None: the node writes it from node.env.
        grant [True]: False when a sibling template sharing the role already did."""
        self.bootstrap.enable_monitoring(job=job, agent_parameter=_literal_name(agent_config) if agent_config else None)
        if grant:
            self.identity.grant_monitoring(job)
            if agent_config is not None:
                agent_config.grant_read(self.role)

    def enable_health_gate(self, level: str = contract.HEALTH_CHECK_DEFAULT,
                           collective: str = contract.COLLECTIVE_CHECK_DEFAULT, *, hang: Optional[int] = None,
                           first_step: Optional[int] = None) -> None:
        """What the boot health gate (runtime/health_gate.py) checks this node against: the
        catalog's GPUs, the EFA interfaces this template attaches, the instance-store NVMe its RAID
        spans; and the DCGM diagnostic's depth (contract.HEALTH_CHECKS). And the all-reduce each
        generation runs first (runtime/collective_check.py, contract.COLLECTIVE_CHECKS), on NVIDIA
        nodes with EFA (a multi-node cluster), against the selector's baseline for this type.
        hang / first_step: seconds without a step that are a hang while training (runtime/stall.py)
        [None: its defaults]."""
        if level not in contract.HEALTH_CHECKS:
            raise ConfigurationError(f"health check {level!r}: allowed {', '.join(contract.HEALTH_CHECKS)}")
        if collective not in contract.COLLECTIVE_CHECKS:
            raise ConfigurationError(f"collective check {collective!r}: allowed {', '.join(contract.COLLECTIVE_CHECKS)}")
        if self.efa and self.facts.sdk == "cuda":
            self.bootstrap.set_env(**{contract.ENV_COLLECTIVE_CHECK: collective, contract.ENV_ALLREDUCE_BASELINE:
                                      format_baseline(allreduce_baselines.for_type(self.facts.instance_type))})
        efa = sum(1 for i in self.efa.interfaces if i["InterfaceType"] != "interface") if self.efa else 0
        nvme = self.facts.nvme.total_gb if self.raid is not None and self.facts.nvme else 0
        self.bootstrap.set_env(**{"DL_EXPECTED_GPUS": str(self.facts.accelerator_count if self.facts.sdk == "cuda" else 0),
                                  contract.ENV_EXPECTED_EFA: str(efa), contract.ENV_EXPECTED_SCRATCH_GB: str(nvme),
                                  contract.ENV_HEALTH_CHECK: level})
        stall = {contract.ENV_HANG_SECONDS: hang, contract.ENV_FIRST_STEP_SECONDS: first_step}
        self.bootstrap.set_env(**{k: str(int(v)) for k, v in stall.items() if v is not None})

    # ---- rendering -----------------------------------------------------------------------------
    def node_env(self) -> str:
        """node.env: this node's facts, its units and where its bundle is (tokens until deploy)."""
        return self.bootstrap.node_env()

    def user_data_parts(self) -> list[tuple[str, str]]:
        """(label, text) of each part of the user data, in order (for the size check)."""
        return self.bootstrap.user_data_parts()

    def user_data_script(self) -> str:
        """The user data as it will be deployed, with tokens where CloudFormation fills them in."""
        return self.bootstrap.user_data_script()

    def user_data_bytes(self) -> int:
        """Its size, exact for text and at most userdata.TOKEN_BYTES for each token."""
        return self.bootstrap.user_data_bytes()

    @property
    def connections(self) -> ec2.Connections:
        return self.identity.connections


def _literal_name(parameter: "ssm.IStringParameter") -> str:
    """The parameter's name as written, where it was given (a Ref token costs the user data 256
    bytes of its 16 KB in the size check; the name is known at synth)."""
    name = parameter.parameter_name
    cfn = getattr(parameter.node, "default_child", None)
    given = getattr(cfn, "name", None)
    if cdk.Token.is_unresolved(name) and isinstance(given, str) and not cdk.Token.is_unresolved(given):
        return given
    return name


def _pick(scope: Construct, profile: str, region: Optional[str]) -> InstanceFacts:
    """The selector's pick for `profile` in `region`, else the stack's, else us-east-1."""
    stack_region = cdk.Stack.of(scope).region
    region = region or (stack_region if not cdk.Token.is_unresolved(stack_region) else "us-east-1")
    rec = recommend(get_profile(profile), region=region)
    if rec.pick is None:
        raise ConfigurationError(rec.why)
    return rec.pick.facts


def select_subnets(vpc: ec2.IVpc, selection: ec2.SubnetSelection) -> ec2.SelectedSubnets:
    """vpc.select_subnets for a SubnetSelection value (the Python binding takes only keywords)."""
    return vpc.select_subnets(subnet_group_name=selection.subnet_group_name, subnet_type=selection.subnet_type,
                              availability_zones=selection.availability_zones, subnets=selection.subnets,
                              one_per_az=selection.one_per_az)


def _subnet_azs(vpc: ec2.IVpc, subnets: Optional[ec2.SubnetSelection]) -> tuple[str, ...]:
    """The AZs of the nodes' subnets; without `subnets`, of the VPC's private subnets, where EFA
    nodes go (so a placement group on a multi-AZ VPC is caught here, not at launch)."""
    if subnets is None:
        for kind in (ec2.SubnetType.PRIVATE_WITH_EGRESS, ec2.SubnetType.PRIVATE_ISOLATED):
            try:
                picked = vpc.select_subnets(subnet_type=kind).subnets
            except Exception:  # noqa: BLE001 - CDK raises when the VPC has no subnet of that kind
                continue
            if picked:
                return tuple(s.availability_zone for s in picked if not cdk.Token.is_unresolved(s.availability_zone))
        return ()
    selected = select_subnets(vpc, subnets).subnets
    return tuple(s.availability_zone for s in selected if not cdk.Token.is_unresolved(s.availability_zone))
