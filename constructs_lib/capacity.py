"""A cluster of one instance type at a time: launched all-or-nothing, a lost node replaced by the
same type in the same placement group, the whole cluster moved to the next alternate when that
type cannot be had, and no node ever above the cost ceiling. The decisions are made by the
capacity controller (constructs_lib/fleet, deployed by controller.py)."""
from __future__ import annotations

import json

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence

import aws_cdk as cdk
import aws_cdk.aws_ssm as aws_ssm
import aws_cdk.aws_ec2 as ec2
import aws_cdk.aws_iam as iam
import aws_cdk.aws_logs as logs
import aws_cdk.aws_s3 as s3
from constructs import Construct, IConstruct

from dl_core.markets import MARKETS
from dl_selector.facts import InstanceFacts
from dl_selector.interchange import RULES, interchangeable

from .controller import CapacityController
from .facts import InstanceLike, resolve
from .launch_template import GpuLaunchTemplate, select_subnets
from .node_options import NodeOptions
from .runtime import contract
from .validation import ConfigurationError

if TYPE_CHECKING:
    from .checkpoints import CheckpointBucket
    from .fsx import LustreData
    from .job import JobDefinition, JobLogs


@dataclass(frozen=True)
class InstanceOption:
    """An instance type the cluster may run on, and its price per node per hour in the job's
    market (None: no price on record, so it is never used)."""

    instance_type: InstanceLike
    price: Optional[float] = None


class ClusterCapacity(Construct):
    """`nodes` instances of one type, the pick first and then each alternate, never mixed.

    Keyword-only props (defaults in brackets):
      vpc, cluster: the VPC and the cluster id (tag dl-launcher:cluster on every node).
      options: the pick, then its alternates, each an InstanceOption; every alternate must be
        interchangeable with the pick under `interchange` (dl_selector.interchange).
      nodes [1]: a cluster of more than one node needs EFA on every type and gets one cluster
        placement group, one AZ.
      market ["spot"]: "spot", "on-demand" or "capacity-block" (with capacity_reservation).
      max_price [the pick's price]: the ceiling per node per hour. An option priced above it, or
        with no price, is never used; for spot it is also the maximum price sent to EC2.
      capacity_reservation [None]: a Capacity Reservation (cr-...) or a resource group ARN of
        reservations that every launch targets first (on-demand or capacity-block).
      interchange ["same-accelerator"]: the rule alternates must meet (dl_selector.interchange.RULES).
      replace_within [10 minutes]: how long a lost node may wait for the same type before the
        whole cluster moves to the next option.
      subnets [the VPC's private subnets in its first AZ]: one AZ.
      state_bucket, state_key: where the controller keeps its state (one JSON object).
      log_group: where the controller logs every transition with its reason.
      teardown [True]: terminate the cluster on stack delete (off for the local moto deploy).
      node_options [NodeOptions()]: how every node is set up whatever its type (root volume, RAID, AMI, ...).

    Attributes: templates (GpuLaunchTemplate per usable type, pick first), primary, controller
    (CapacityController), controller_log_group, spec (the controller's), spec_json (as the controller reads it), state_bucket, state_key, ceiling, unused
    (type -> why it will never be used), role, security_group, placement_group.
    """

    def __init__(self, scope: Construct, construct_id: str, *, vpc: ec2.IVpc, cluster: str,
                 options: Sequence[InstanceOption], state_bucket: s3.IBucket, state_key: str,
                 log_group: logs.ILogGroup, nodes: int = 1, market: str = "spot", max_price: Optional[float] = None,
                 capacity_reservation: Optional[str] = None, interchange: str = "same-accelerator",
                 replace_within: cdk.Duration = cdk.Duration.minutes(10), subnets: Optional[ec2.SubnetSelection] = None,
                 teardown: bool = True, node_options: Optional[NodeOptions] = None) -> None:
        super().__init__(scope, construct_id)
        if not options:
            raise ConfigurationError("ClusterCapacity needs at least one instance type")
        if nodes < 1:
            raise ConfigurationError(f"nodes must be at least 1, got {nodes}")
        if market not in MARKETS:
            raise ConfigurationError(f"market {market!r}: allowed {', '.join(MARKETS)}")
        if market == "capacity-block" and not capacity_reservation:
            raise ConfigurationError("market capacity-block needs capacity_reservation (the block's cr- id)")
        if market == "spot" and capacity_reservation:
            raise ConfigurationError("a capacity reservation is on-demand capacity: use market on-demand or "
                                     "capacity-block with it")
        if interchange not in RULES:
            raise ConfigurationError(f"interchange {interchange!r}: allowed {', '.join(RULES)}")
        if max_price is not None and max_price <= 0:
            raise ConfigurationError(f"max_price must be above zero, got {max_price}")
        self.ceiling, usable, self.unused = usable_options(
            self, options, market=market, max_price=max_price, interchange=interchange, multi_node=nodes > 1)

        self.cluster = cluster
        self.nodes = nodes
        self._build_templates(vpc, subnets, [f for _o, f in usable], multi_node=nodes > 1, nodes=str(nodes),
                              options=node_options, capacity_reservation=capacity_reservation,
                              capacity_block=market == "capacity-block")

        self.subnet_ids = select_subnets(vpc, self.subnets).subnet_ids
        self.state_bucket, self.state_key = state_bucket, state_key
        self.spec = self._spec(usable, nodes=nodes, market=market, ceiling=self.ceiling,
                               capacity_reservation=capacity_reservation, replace_within=replace_within)
        self._add_controller(self.spec, log_group=log_group, teardown=teardown)

    # ---- the pieces, shared with ChoiceCapacity ----------------------------------------------
    def _build_templates(self, vpc: ec2.IVpc, subnets: Optional[ec2.SubnetSelection], facts: Sequence[InstanceFacts], *,
                         multi_node: bool, nodes: str, options: Optional[NodeOptions] = None,
                         capacity_reservation: Optional[str] = None, capacity_block: bool = False) -> None:
        """One GpuLaunchTemplate per type (EFA layouts differ: p5 has 32 cards, p4d 4), sharing
        the first one's role, instance profile, security group and placement group."""
        self.subnets = subnets or ec2.SubnetSelection(subnet_type=_private_type(vpc),
                                                      availability_zones=[vpc.availability_zones[0]])
        self.templates: list[GpuLaunchTemplate] = []
        for i, f in enumerate(facts):
            # The first makes them (None: GpuLaunchTemplate's defaults); the alternates share its.
            first = self.templates[0] if self.templates else None
            t = GpuLaunchTemplate(self, "Node" if i == 0 else f"Alt{i}", vpc=vpc, instance_type=f,
                                  multi_node=multi_node, subnets=self.subnets, options=options,
                                  capacity_reservation=capacity_reservation, capacity_block=capacity_block,
                                  role=first.role if first else None,
                                  instance_profile=first.instance_profile if first else None,
                                  security_group=first.security_group if first else None,
                                  placement_group=first.placement_group if first else None)
            t.add_tag(contract.TAG_NODES, nodes)
            t.add_tag(contract.TAG_CLUSTER, self.cluster)
            t.add_tag(contract.TAG_STACK, cdk.Stack.of(self).stack_id)
            self.templates.append(t)
            if i == 0:
                self.primary = t
        self.role = self.primary.role
        self.security_group = self.primary.security_group
        self.placement_group = self.primary.placement_group

    def _template(self, instance_type: str) -> GpuLaunchTemplate:
        return next(t for t in self.templates if t.facts.instance_type == instance_type)

    def _spec(self, usable: Sequence[tuple[InstanceOption, InstanceFacts]], *, nodes, market: str, ceiling: float,
              capacity_reservation: Optional[str], replace_within: cdk.Duration) -> dict:
        """The controller's spec (constructs_lib.fleet.spec.ClusterSpec's JSON fields)."""
        return {
            "cluster": self.cluster, "nodes": nodes, "market": market, "max_price": ceiling,
            "capacity_reservation": capacity_reservation, "subnet_ids": self.subnet_ids,
            "replace_within_seconds": int(replace_within.to_seconds()),
            "state_bucket": self.state_bucket.bucket_name, "state_key": self.state_key,
            "stack": cdk.Stack.of(self).stack_id,  # its tags (cost allocation) go on every node and volume
            "options": [{"instance_type": f.instance_type,
                         "launch_template_id": self._template(f.instance_type).launch_template.launch_template_id,
                         "launch_template_version": self._template(f.instance_type).launch_template.latest_version_number,
                         "price": o.price} for o, f in usable],
        }

    def _add_controller(self, spec, *, log_group: logs.ILogGroup, teardown: bool) -> None:
        self.controller_log_group = log_group
        # What the controller reads as DL_CLUSTER_SPEC (a rendered token); the idle guard gets the same.
        self.spec_json = spec if isinstance(spec, str) else cdk.Stack.of(self).to_json_string(spec)
        protect: list[IConstruct] = [*(t.launch_template for t in self.templates), self.security_group]
        if self.placement_group is not None:
            protect.append(self.placement_group)
        self.controller = CapacityController(self, "Controller", spec=spec, cluster=self.cluster, node_role=self.role,
                                             state_bucket=self.state_bucket, state_key=self.state_key,
                                             log_group=log_group, teardown=teardown, protect=protect)
        self.controller.confine_launches(launch_templates=[t.launch_template for t in self.templates],
                                         subnet_ids=self.subnet_ids, security_groups=[self.security_group])
        self._deny_nodes_the_control_prefix()

    def _deny_nodes_the_control_prefix(self) -> None:
        """The controller's state and lease under contract.CONTROL_DIR: the node role is denied
        every S3 action there in the bucket's own policy, whatever else it is granted later (a
        node that could write the lease could keep its cluster from ever being stopped)."""
        if not cdk.Token.is_unresolved(self.state_key) and not self.state_key.startswith(contract.CONTROL_DIR + "/"):
            raise ConfigurationError(f"state_key {self.state_key!r}: the controller's state must live under "
                                     f"{contract.CONTROL_DIR}/ (contract.capacity_state_key), where nodes are denied")
        result = self.state_bucket.add_to_resource_policy(iam.PolicyStatement(
            sid="NodesNeverTouchTheControllersState", effect=iam.Effect.DENY, actions=["s3:*"],
            # An IPrincipal, to jsii; its stub names a parameter differently from the interface's (aws/jsii#4541).
            principals=[iam.ArnPrincipal(self.role.role_arn)],  # pyright: ignore[reportArgumentType]  # jsii stub: aws/jsii#4541
            resources=[self.state_bucket.arn_for_objects(f"{contract.CONTROL_DIR}/*")]))
        if not result.statement_added:
            raise ConfigurationError("the state bucket takes no policy (an imported bucket): pass the stack's own "
                                     "bucket, so that the nodes can be denied the controller's state")

    def add_tag(self, key: str, value: str) -> None:
        """A tag on every node, readable on the node through IMDS."""
        for t in self.templates:
            t.add_tag(key, value)

    def configure_job(self, *, command: str = "", definition: Optional["JobDefinition"] = None,
                      logs: Optional["JobLogs"] = None, on_end: str = "stop") -> None:
        """Rendezvous and the job unit on every node type (see GpuLaunchTemplate.enable_job): a
        `command` written at boot, or a `definition` (code, setup, env, secrets, image), and the
        job's output to `logs`. A job with a command ends when it finishes or fails for good:
        `on_end` "stop" terminates the cluster then (checkpoints stay), "keep" keeps its nodes for
        debugging; either way nothing is launched again (needs enable_checkpoints, before or after)."""
        if command and definition is not None:
            raise ConfigurationError("configure_job: pass the command inside the JobDefinition, not beside it")
        has_command = bool(command) or (definition is not None and definition.command is not None)
        self._job_end = on_end if has_command else None
        self._end_with_job()
        self.job_logs = logs
        for t in self.templates:
            t.enable_job(cluster=self.cluster, command=command, grant=t is self.primary)
            if definition is not None:
                t.enable_job_definition(definition, grant=t is self.primary)
            if logs is not None:
                t.enable_logs(logs, grant=t is self.primary)

    def enable_monitoring(self) -> "aws_ssm.StringParameter":
        """The CloudWatch agent and the node monitor on every node type (GpuLaunchTemplate), the
        cluster id as the metrics' Job dimension. The agent's configuration is one SSM parameter
        (/dl-launcher/<cluster>/cloudwatch-agent) that every node's agent fetches; returned."""
        from .runtime.cwagent_config import agent_config

        gpu = all(t.facts.sdk == "cuda" for t in self.templates)
        # A cluster id that is a token (a product's JobName, held to [a-z0-9-] by its pattern) goes in
        # where the agent configuration names the job; the configuration itself is checked with a stand-in.
        stand_in = "dl-launcher-job" if cdk.Token.is_unresolved(self.cluster) else self.cluster
        logs = getattr(self, "job_logs", None)
        config = json.dumps(agent_config(job=stand_in, gpu=gpu,
                                         log_group=contract.job_log_group(stand_in) if logs is not None else None),
                            separators=(",", ":"), sort_keys=True)
        config = config.replace(stand_in, self.cluster) if stand_in != self.cluster else config
        self.agent_config = aws_ssm.StringParameter(
            self, "AgentConfig", parameter_name=contract.agent_parameter(self.cluster), string_value=config,
            simple_name=False,  # a path (its ARN has no extra '/'), also where the cluster is a token
            description=f"CloudWatch agent configuration of the {self.cluster} nodes (dl-launcher)")
        for t in self.templates:
            t.enable_monitoring(job=self.cluster, grant=t is self.primary, agent_config=self.agent_config)
        return self.agent_config

    def enable_health_gate(self, level: str = contract.HEALTH_CHECK_DEFAULT,
                           collective: str = contract.COLLECTIVE_CHECK_DEFAULT, *, hang: Optional[int] = None,
                           first_step: Optional[int] = None) -> None:
        """Every node type checks itself before it joins its first generation, each generation's
        members their all-reduce before it trains, and every node its steps while it trains
        (GpuLaunchTemplate.enable_health_gate)."""
        for t in self.templates:
            t.enable_health_gate(level, collective, hang=hang, first_step=first_step)

    def enable_data_file_system(self, lustre: "LustreData") -> None:
        """Every node mounts `lustre` (constructs_lib.fsx) at DL_DATA_DIR before setup; Lustre's
        ports open between the nodes and the file system, nothing else."""
        lustre.allow_from(self.security_group)
        for t in self.templates:
            t.bootstrap.set_env(**lustre.node_env())

    def enable_checkpoints(self, bucket: "CheckpointBucket", prefix: str) -> None:
        """Checkpoints in `bucket` under `prefix` on every node type (see GpuLaunchTemplate)."""
        for t in self.templates:
            t.enable_checkpoints(bucket, prefix, grant=t is self.primary)
        self._checkpoints = (bucket, prefix)
        self._end_with_job()

    def _end_with_job(self) -> None:
        """The controller acts on the job's end once both the job and its checkpoints are known."""
        on_end, where = getattr(self, "_job_end", None), getattr(self, "_checkpoints", None)
        if on_end is None or where is None or getattr(self, "_ends_with_job", False):
            return
        self._ends_with_job = True
        self.controller.end_with_job(bucket=where[0].bucket, prefix=where[1], on_end=on_end)


def usable_options(scope: Construct, options: Sequence[InstanceOption], *, market: str, max_price: Optional[float],
                   interchange: str, multi_node: bool) -> tuple[float, list[tuple[InstanceOption, InstanceFacts]], dict[str, str]]:
    """(ceiling, [(option, facts)] that may be used, {type: why not} for the rest): every
    alternate interchangeable with the pick, EFA on every type of a multi-node cluster, and no
    option without a price or above the ceiling. Warnings go on `scope`."""
    facts = [resolve(o.instance_type) for o in options]
    pick = facts[0]
    for f in facts[1:]:
        why = interchangeable(pick, f, multi_node=multi_node, rule=interchange)
        if why:
            raise ConfigurationError(f"alternate {f.instance_type} cannot replace {pick.instance_type}: {why}")
    if multi_node:
        no_efa = [f.instance_type for f in facts if not f.efa]
        if no_efa:
            raise ConfigurationError(f"a cluster of several nodes needs EFA on every type; not on {', '.join(no_efa)}")
    ceiling = max_price if max_price is not None else options[0].price
    if ceiling is None:
        raise ConfigurationError(f"{pick.instance_type} has no {market} price on record: pass max_price "
                                 "(USD per node per hour), the ceiling no node may exceed")
    unused: dict[str, str] = {}
    usable = []
    if options[0].price is None and max_price is not None:
        # The deployer named a ceiling for a pick with no price on record (a Capacity Block,
        # a private rate): the pick is used, billed at most the ceiling. Alternates are not.
        options = [InstanceOption(options[0].instance_type, max_price), *options[1:]]
        cdk.Annotations.of(scope).add_warning_v2(
            "dl-launcher:unpriced-pick", f"{pick.instance_type} has no {market} price on record: "
            f"max_price ${max_price:.2f}/h stands for it. Fix: check that figure against your bill or block price")
    for o, f in zip(options, facts):
        if o.price is None:
            unused[f.instance_type] = f"no {market} price on record: never used silently"
        elif o.price > ceiling:
            unused[f.instance_type] = f"${o.price:.2f}/h is above the ceiling ${ceiling:.2f}/h"
        else:
            usable.append((o, f))
    for t, why in unused.items():
        fix = "raise max_price to at least its price" if "above the ceiling" in why else "pass max_price for it"
        cdk.Annotations.of(scope).add_warning_v2(f"dl-launcher:unused-{t}",
                                                 f"{t} will not be used: {why}. Fix: {fix}, or drop it from the options")
    if not usable:
        raise ConfigurationError(f"no option is priced at or below the ceiling ${ceiling:.2f}/h: "
                                 + "; ".join(f"{t}: {w}" for t, w in unused.items()))
    return ceiling, usable, unused


def _private_type(vpc: ec2.IVpc) -> ec2.SubnetType:
    for kind in (ec2.SubnetType.PRIVATE_WITH_EGRESS, ec2.SubnetType.PRIVATE_ISOLATED):
        try:
            if vpc.select_subnets(subnet_type=kind).subnet_ids:
                return kind
        except Exception:  # CDK raises when a VPC has no subnet of that kind
            continue
    raise ConfigurationError("the VPC has no private subnets: EFA nodes have several interfaces and cannot "
                             "take public IPs; give it private subnets (with a NAT or VPC endpoints)")
