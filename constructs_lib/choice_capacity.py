"""A cluster whose instance type and market are chosen when the stack is deployed (CloudFormation
parameters, e.g. a Service Catalog product), among choices prepared at synth: one launch template
per type that any choice may use, and the capacity controller's spec picked by a condition."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Union

import aws_cdk as cdk
import aws_cdk.aws_ec2 as ec2
import aws_cdk.aws_logs as logs
import aws_cdk.aws_s3 as s3
from constructs import Construct

from dl_core.markets import MARKETS
from dl_selector.facts import InstanceFacts
from dl_selector.interchange import RULES

from .capacity import ClusterCapacity, InstanceOption, usable_options
from .launch_template import select_subnets
from .node_options import NodeOptions
from .validation import ConfigurationError


@dataclass(frozen=True)
class CapacityChoice:
    """What the cluster runs on while `condition` holds: `options` (the chosen type first, then
    the alternates that may replace it) in `market`, no node above `max_price` [the chosen type's
    price]. Exactly one choice's condition must hold in a deployment (e.g. AllowedValues on the
    parameters it tests); the last choice may leave its condition out: it holds when no other does."""

    condition: Optional[cdk.CfnCondition]  # None: otherwise (the last choice only)
    options: Sequence[InstanceOption]
    market: str
    max_price: Optional[float] = None


class ChoiceCapacity(ClusterCapacity):
    """ClusterCapacity for several choices decided at deploy time.

    Keyword-only props (defaults in brackets):
      vpc, cluster, state_bucket, state_key, log_group, interchange, replace_within, subnets,
        teardown, node_options: as ClusterCapacity (cluster may be a token, e.g. a parameter).
      choices: CapacityChoice values; every type they name gets a launch template (shared role,
        security group and placement group), made once.
      nodes: the node count, a number or a number token (a Number parameter's value_as_number).
      max_nodes: the most nodes any deployment may ask for; above 1 every type must have EFA,
        and the nodes get EFA interfaces and one cluster placement group.
    Capacity Reservations and Capacity Blocks are not offered here: they are bought for one type.

    Attributes: as ClusterCapacity; spec is the first choice's (the one in force is in the
    controller's DL_CLUSTER_SPEC), specs ({condition logical id, None for the otherwise: spec}).
    """

    def __init__(self, scope: Construct, construct_id: str, *, vpc: ec2.IVpc, cluster: str,
                 choices: Sequence[CapacityChoice], nodes: Union[int, float], max_nodes: int,
                 state_bucket: s3.IBucket, state_key: str, log_group: logs.ILogGroup,
                 interchange: str = "same-accelerator", replace_within: cdk.Duration = cdk.Duration.minutes(10),
                 subnets: Optional[ec2.SubnetSelection] = None, teardown: bool = True,
                 node_options: Optional[NodeOptions] = None) -> None:
        Construct.__init__(self, scope, construct_id)
        if not choices:
            raise ConfigurationError("ChoiceCapacity needs at least one choice")
        if max_nodes < 1:
            raise ConfigurationError(f"max_nodes must be at least 1, got {max_nodes}")
        if interchange not in RULES:
            raise ConfigurationError(f"interchange {interchange!r}: allowed {', '.join(RULES)}")
        if any(c.condition is None for c in choices[:-1]):
            raise ConfigurationError("only the last choice may go without a condition (it is the otherwise)")
        for c in choices:
            if c.market not in MARKETS or c.market == "capacity-block":
                raise ConfigurationError(f"market {c.market!r}: allowed spot, on-demand")
        multi = max_nodes > 1
        resolved = []
        for c in choices:
            ceiling, usable, unused = usable_options(self, c.options, market=c.market, max_price=c.max_price,
                                                     interchange=interchange, multi_node=multi)
            resolved.append((c, ceiling, usable))
        types, facts = [], []
        for _c, _ceiling, usable in resolved:
            for _o, f in usable:
                if f.instance_type not in types:
                    types.append(f.instance_type)
                    facts.append(f)
        self.unused = {}
        self.cluster = cluster
        self.nodes = nodes
        self.max_nodes = max_nodes
        nodes_text = str(nodes) if isinstance(nodes, int) else cdk.Token.as_string(nodes)
        self._build_templates(vpc, subnets, facts, multi_node=multi, nodes=nodes_text, options=node_options)
        self.subnet_ids = select_subnets(vpc, self.subnets).subnet_ids
        self.state_bucket, self.state_key = state_bucket, state_key
        self._resolved = [(c.condition.logical_id if c.condition else None, usable) for c, _ceiling, usable in resolved]
        self.specs = {(c.condition.logical_id if c.condition else None): self._spec(usable, nodes=nodes, market=c.market, ceiling=ceiling,
                                                         capacity_reservation=None, replace_within=replace_within)
                      for c, ceiling, usable in resolved}
        self.spec = next(iter(self.specs.values()))
        self.ceiling = max(ceiling for _c, ceiling, _u in resolved)
        self._add_controller(self._chosen_spec(), log_group=log_group, teardown=teardown)

    def per_choice(self, value: Callable[[InstanceOption, InstanceFacts], Union[str, float]]) -> str:
        """A string token: `value(option, facts)` of the chosen type (each choice's first option),
        picked by the same conditions as the spec (wrap in cdk.Token.as_number for a number)."""
        return _chosen([(cid, str(value(*usable[0]))) for cid, usable in self._resolved])

    def _chosen_spec(self) -> str:
        """The spec in force, as the controller reads it. Where no condition holds (the last
        choice has one and the parameters fall outside them all) the variable is left out and the
        controller refuses to act, naming it."""
        stack = cdk.Stack.of(self)
        return _chosen([(cid, stack.to_json_string(spec)) for cid, spec in self.specs.items()])


def _chosen(values: Sequence[tuple[Optional[str], str]]) -> str:
    """Fn::If over (condition logical id, value) in order; a last entry without a condition is the
    otherwise, else AWS::NoValue is."""
    *first, (last_id, last) = values
    chosen = last if last_id is None else cdk.Token.as_string(cdk.Fn.condition_if(last_id, last, cdk.Aws.NO_VALUE))
    for cid, value in reversed(first):
        chosen = cdk.Token.as_string(cdk.Fn.condition_if(cid, value, chosen))
    return chosen
