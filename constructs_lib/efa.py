"""EFA on every network card: the security group, the cluster placement group and the
launch-template interfaces, laid out as AWS's current EFA guidance says, with counts from the
selector's catalog."""
from __future__ import annotations

from typing import Any, Optional

import aws_cdk.aws_ec2 as ec2
from constructs import Construct

from selector.facts import InstanceFacts

from .facts import InstanceLike, resolve
from .validation import ConfigurationError

LAYOUTS = ("efa-only", "efa")


def efa_interfaces(facts: InstanceFacts, *, layout: str = "efa-only") -> list[dict[str, Any]]:
    """The NetworkInterfaces of a launch template for `facts`, without security groups.

    layout "efa-only" (AWS's guidance since EFA-only interfaces arrived, 2024-10): an ENA
      primary at card 0 device 0 (the one with an IP address); an efa-only interface at card 0
      device 1 if card 0 carries EFA; an efa-only interface at device 0 of every other card.
      On types with fewer EFA interfaces than cards (p6-b300: 17 cards, 16 EFA) card 0 is ENA only.
    layout "efa" (the older layout eksctl, Karpenter and AWS PCS recipes still use): an
      EFA-with-ENA interface on every card, card 0 at device 0, the others at device 1.
    """
    if layout not in LAYOUTS:
        raise ConfigurationError(f"unknown EFA interface layout {layout!r}; allowed: {', '.join(LAYOUTS)}")
    if not facts.efa:
        raise ConfigurationError(f"{facts.instance_type} has no EFA")
    cards = facts.network_cards
    card0_efa = facts.max_efa_interfaces >= cards
    efa_cards = list(range(0 if card0_efa else 1, cards))[: facts.max_efa_interfaces]
    if layout == "efa":
        out = [{"NetworkCardIndex": 0, "DeviceIndex": 0, "InterfaceType": "efa" if card0_efa else "interface"}]
        out += [{"NetworkCardIndex": c, "DeviceIndex": 1, "InterfaceType": "efa"} for c in efa_cards if c != 0]
        return out
    out = [{"NetworkCardIndex": 0, "DeviceIndex": 0, "InterfaceType": "interface"}]
    out += [{"NetworkCardIndex": c, "DeviceIndex": 1 if c == 0 else 0, "InterfaceType": "efa-only"} for c in efa_cards]
    return out


class EfaNetworking(Construct):
    """Security group, cluster placement group and interfaces for EFA nodes.

    Keyword-only props (defaults in brackets):
      vpc: where the nodes run.
      instance: type name or InstanceFacts (from the selector's catalog).
      layout ["efa-only"]: see `efa_interfaces`.
      placement_group [True]: a cluster placement group (all nodes in one AZ, one spine).
      https_egress [True]: let nodes reach AWS APIs, S3 and package mirrors over 443.
      share_from [None]: reuse another EfaNetworking's security group and placement group
        (types that must talk EFA to each other and sit on one spine).

    Attributes: security_group, placement_group (or None), facts, interfaces (without groups).
    """

    def __init__(self, scope: Construct, construct_id: str, *, vpc: ec2.IVpc, instance: InstanceLike,
                 layout: str = "efa-only", placement_group: bool = True, https_egress: bool = True,
                 share_from: Optional["EfaNetworking"] = None) -> None:
        super().__init__(scope, construct_id)
        self.facts = resolve(instance)
        self.interfaces = efa_interfaces(self.facts, layout=layout)
        if share_from is not None:
            # Another type in the same cluster (a capacity alternate): same group, same spine.
            self.security_group = share_from.security_group
            self.placement_group = share_from.placement_group
            return
        self.security_group = ec2.SecurityGroup(
            self, "Sg", vpc=vpc, allow_all_outbound=False,
            description=f"EFA nodes ({self.facts.instance_type}): all traffic within the group")
        # EFA's OS-bypass traffic needs every protocol to and from the group itself.
        self.security_group.add_ingress_rule(self.security_group, ec2.Port.all_traffic(), "EFA and NCCL between nodes")
        self.security_group.add_egress_rule(self.security_group, ec2.Port.all_traffic(), "EFA and NCCL between nodes")
        if https_egress:
            self.security_group.add_egress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(443),
                                                "AWS APIs (SSM, S3, EC2), container and package mirrors")
        self.placement_group: Optional[ec2.PlacementGroup] = (
            ec2.PlacementGroup(self, "Cluster", strategy=ec2.PlacementGroupStrategy.CLUSTER)
            if placement_group else None)

    @property
    def placement_group_name(self) -> Optional[str]:
        """Ref of the placement group (its name). Ref, not GetAtt: the same value, and
        CloudFormation emulators that do not model placement groups can still resolve it."""
        if self.placement_group is None:
            return None
        return self.placement_group.node.default_child.ref

    def network_interfaces(self) -> list[dict[str, Any]]:
        """CloudFormation NetworkInterfaces for the launch template (PascalCase, groups set)."""
        return [{**i, "Groups": [self.security_group.security_group_id], "DeleteOnTermination": True}
                for i in self.interfaces]
