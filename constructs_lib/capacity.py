"""Nodes on spot (or on-demand) across the selector's interchangeable alternates, in one AZ and
one cluster placement group, with every interruption visible to operators."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Sequence

import aws_cdk as cdk
import aws_cdk.aws_autoscaling as autoscaling
import aws_cdk.aws_ec2 as ec2
import aws_cdk.aws_events as events
import aws_cdk.aws_logs as logs
import jsii
from constructs import Construct

if TYPE_CHECKING:
    import aws_cdk.aws_sns as sns

    from .checkpoints import CheckpointBucket

from .facts import InstanceLike, resolve
from .launch_template import GpuLaunchTemplate, select_subnets
from .runtime import contract
from .validation import ConfigurationError

SPOT_EVENTS = ["EC2 Spot Instance Interruption Warning", "EC2 Instance Rebalance Recommendation"]
ASG_EVENTS = ["EC2 Instance Launch Successful", "EC2 Instance Launch Unsuccessful",
              "EC2 Instance Terminate Successful", "EC2 Instance Terminate Unsuccessful"]


class SpotCapacity(Construct):
    """`nodes` instances of `instance_types[0]`, falling back across the rest.

    Keyword-only props (defaults in brackets):
      vpc, instance_types: the pick first, then alternates with the same accelerators per node
        and architecture (stacks get them from the selector); each EFA type gets its own launch
        template, sharing one role, instance profile, security group and placement group.
      nodes [1]: instances kept running; the Auto Scaling group replaces any that AWS reclaims.
      spot [True]: capacity-optimized spot across all the types; False: on-demand only.
      on_demand_base [0]: this many nodes always on-demand (e.g. 1 keeps rank 0 steady).
      max_price [None]: a spot price ceiling in USD/hour per node (default: up to on-demand).
      subnets [the VPC's private subnets in its first AZ]: must be one AZ when nodes > 1.
      template_props [{}]: passed to every GpuLaunchTemplate (root_volume_gib, dlami_mount, ...).

    Attributes: templates (GpuLaunchTemplate per type, pick first), primary, auto_scaling_group
    (CfnAutoScalingGroup), role, security_group, placement_group.
    """

    def __init__(self, scope: Construct, construct_id: str, *, vpc: ec2.IVpc, instance_types: Sequence[InstanceLike],
                 nodes: int = 1, spot: bool = True, on_demand_base: int = 0, max_price: Optional[float] = None,
                 subnets: Optional[ec2.SubnetSelection] = None, template_props: Optional[dict[str, Any]] = None) -> None:
        super().__init__(scope, construct_id)
        if not instance_types:
            raise ConfigurationError("SpotCapacity needs at least one instance type")
        if nodes < 1 or not 0 <= on_demand_base <= nodes:
            raise ConfigurationError(f"nodes must be >= 1 and on_demand_base between 0 and nodes; got {nodes}, {on_demand_base}")
        if max_price is not None and max_price <= 0:
            raise ConfigurationError(f"max_price must be above zero, got {max_price}")
        facts = [resolve(t) for t in instance_types]
        pick = facts[0]
        for f in facts[1:]:
            if (f.processes_per_node, f.architecture, f.sdk) != (pick.processes_per_node, pick.architecture, pick.sdk):
                raise ConfigurationError(
                    f"alternate {f.instance_type} is not interchangeable with {pick.instance_type}: the job's world "
                    "size, AMI and stack must stay valid (same accelerators per node, architecture and SDK)")
        multi = nodes > 1
        if multi:
            no_efa = [f.instance_type for f in facts if not f.efa]
            if no_efa:
                raise ConfigurationError(f"multi-node capacity needs EFA on every type; not on {', '.join(no_efa)}")
        subnets = subnets or ec2.SubnetSelection(subnet_type=_private_type(vpc),
                                                 availability_zones=[vpc.availability_zones[0]])
        props = dict(template_props or {})
        self.primary = GpuLaunchTemplate(self, "Node", vpc=vpc, instance_type=pick, multi_node=multi, subnets=subnets,
                                         **props)
        # One role, profile, security group and placement group for the whole cluster.
        shared = dict(role=self.primary.role, instance_profile=self.primary.instance_profile,
                      security_group=self.primary.security_group, placement_group=self.primary.placement_group)
        self.templates: list[GpuLaunchTemplate] = [self.primary, *(
            GpuLaunchTemplate(self, f"Alt{i}", vpc=vpc, instance_type=f, multi_node=multi, subnets=subnets,
                              **{**props, **shared})
            for i, f in enumerate(facts[1:], start=1))]
        self.role = self.primary.role
        self.security_group = self.primary.security_group
        self.placement_group = self.primary.placement_group
        self.nodes = nodes

        first = self.primary.launch_template
        overrides = [autoscaling.CfnAutoScalingGroup.LaunchTemplateOverridesProperty(
            instance_type=t.facts.instance_type,
            # EFA layouts differ per type (p5: 33 interfaces, p4d: 5), so each type brings its own template.
            launch_template_specification=autoscaling.CfnAutoScalingGroup.LaunchTemplateSpecificationProperty(
                launch_template_id=t.launch_template.launch_template_id,
                version=t.launch_template.latest_version_number) if t is not self.primary else None)
            for t in self.templates]
        distribution = autoscaling.CfnAutoScalingGroup.InstancesDistributionProperty(
            on_demand_base_capacity=on_demand_base if spot else nodes,
            on_demand_percentage_above_base_capacity=0 if spot else 100,
            on_demand_allocation_strategy="prioritized",
            spot_allocation_strategy="capacity-optimized-prioritized",
            spot_max_price=f"{max_price:.4f}" if max_price else None)
        selected = select_subnets(vpc, subnets)
        self.auto_scaling_group = autoscaling.CfnAutoScalingGroup(
            self, "Group", min_size=str(nodes), max_size=str(nodes), desired_capacity=str(nodes),
            vpc_zone_identifier=selected.subnet_ids,
            mixed_instances_policy=autoscaling.CfnAutoScalingGroup.MixedInstancesPolicyProperty(
                launch_template=autoscaling.CfnAutoScalingGroup.LaunchTemplateProperty(
                    launch_template_specification=autoscaling.CfnAutoScalingGroup.LaunchTemplateSpecificationProperty(
                        launch_template_id=first.launch_template_id, version=first.latest_version_number),
                    overrides=overrides),
                instances_distribution=distribution),
            placement_group=self.primary.placement_group_name,
            # A replaced node must not take a half-finished job's place in the rendezvous before
            # it is ready: health comes from EC2, the job decides about itself.
            health_check_type="EC2",
            capacity_rebalance=False,
            tags=[autoscaling.CfnAutoScalingGroup.TagPropertyProperty(key=contract.TAG_NODES, value=str(nodes),
                                                                     propagate_at_launch=True)])
        cdk.Validations.of(self.auto_scaling_group).acknowledge(
            cdk.Acknowledgment(id="AwsSolutions-AS3", reason=(
                "launch and terminate events go to EventBridge (InterruptionAlerts routes them with the spot "
                "warnings to a log group or topic); ASG notifications would need an SNS topic of their own")),
            cdk.Acknowledgment(id="AwsSolutions-EC26", reason=(
                "volumes come from the launch templates, which encrypt every EBS volume; the rule cannot read "
                "through a launch-template reference")))

    def add_tag(self, key: str, value: str) -> None:
        """A tag on every node, readable on the node through IMDS."""
        for t in self.templates:
            t.add_tag(key, value)

    def configure_job(self, *, cluster: str, command: str = "") -> None:
        """Rendezvous and the job unit on every node type (see GpuLaunchTemplate.enable_job)."""
        for t in self.templates:
            t.enable_job(cluster=cluster, command=command, grant=t is self.primary)

    def enable_checkpoints(self, bucket: "CheckpointBucket", prefix: str) -> None:
        """Checkpoints in `bucket` under `prefix` on every node type (see GpuLaunchTemplate)."""
        for t in self.templates:
            t.enable_checkpoints(bucket, prefix, grant=t is self.primary)


def _private_type(vpc: ec2.IVpc) -> ec2.SubnetType:
    for kind in (ec2.SubnetType.PRIVATE_WITH_EGRESS, ec2.SubnetType.PRIVATE_ISOLATED):
        try:
            if vpc.select_subnets(subnet_type=kind).subnet_ids:
                return kind
        except Exception:  # CDK raises when a VPC has no subnet of that kind
            continue
    raise ConfigurationError("the VPC has no private subnets: EFA nodes have several interfaces and cannot "
                             "take public IPs; give it private subnets (with a NAT or VPC endpoints)")


class InterruptionAlerts(Construct):
    """Every spot interruption warning and rebalance recommendation, and the group's launches and
    terminations, to a log group (and an SNS topic if given).

    EventBridge cannot filter spot warnings by tag, so the log group receives those for the whole
    account and region; each carries its instance id, and the group's own launch/terminate events
    (filtered by group name) say which ids are this stack's.
    """

    def __init__(self, scope: Construct, construct_id: str, *, group: autoscaling.CfnAutoScalingGroup,
                 topic: Optional["sns.ITopic"] = None, retention: logs.RetentionDays = logs.RetentionDays.THREE_MONTHS) -> None:
        super().__init__(scope, construct_id)
        self.log_group = logs.LogGroup(self, "Log", retention=retention, removal_policy=cdk.RemovalPolicy.DESTROY)
        # The L2 log-group target installs its resource policy with a Lambda-backed custom
        # resource; a plain resource policy does the same with nothing to run.
        logs.CfnResourcePolicy(self, "EventsMayWrite", policy_name=f"{cdk.Names.unique_id(self)[-200:]}-events",
                               policy_document=cdk.Stack.of(self).to_json_string({
                                   "Version": "2012-10-17",
                                   "Statement": [{
                                       "Effect": "Allow",
                                       "Principal": {"Service": ["events.amazonaws.com", "delivery.logs.amazonaws.com"]},
                                       "Action": ["logs:CreateLogStream", "logs:PutLogEvents"],
                                       "Resource": self.log_group.log_group_arn}]}))
        self.spot_rule = events.Rule(self, "Spot", description="EC2 spot interruption warnings and rebalance recommendations",
                                     event_pattern=events.EventPattern(source=["aws.ec2"], detail_type=SPOT_EVENTS))
        self.group_rule = events.Rule(self, "Group", description="launches and terminations of the training nodes",
                                      event_pattern=events.EventPattern(
                                          source=["aws.autoscaling"], detail_type=ASG_EVENTS,
                                          detail={"AutoScalingGroupName": [group.ref]}))
        for rule in (self.spot_rule, self.group_rule):
            rule.add_target(_LogGroupTarget(self.log_group))
            if topic is not None:
                import aws_cdk.aws_events_targets as targets  # only with a topic: a costly import
                rule.add_target(targets.SnsTopic(topic))


@jsii.implements(events.IRuleTarget)
class _LogGroupTarget:
    def __init__(self, log_group: logs.ILogGroup) -> None:
        self.log_group = log_group

    def bind(self, rule: events.IRule, id: Optional[str] = None) -> events.RuleTargetConfig:
        return events.RuleTargetConfig(arn=self.log_group.log_group_arn)
