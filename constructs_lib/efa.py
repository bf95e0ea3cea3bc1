"""EFA on every network card: the launch-template interfaces, laid out as AWS's current EFA
guidance says with counts from the selector's catalog, the cluster placement group that keeps
the nodes on one spine, and the EFA/NCCL environment the node's unit sets up."""
from __future__ import annotations

from typing import Any, Optional, Union

import aws_cdk.aws_ec2 as ec2
from constructs import Construct

from dl_selector.facts import InstanceFacts

from .bundle import EFA_SDK_ENV, EFA_UNIT
from .facts import InstanceLike, resolve
from .runtime import contract
from .userdata import SettingsFile
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


def placement_group_name(group: ec2.IPlacementGroup) -> str:
    """Ref of a group made in this app, not GetAtt: the same value, and CloudFormation emulators
    that do not model placement groups can still resolve it."""
    child = group.node.default_child
    return child.ref if isinstance(child, ec2.CfnPlacementGroup) else group.placement_group_name


class EfaNetworking(Construct):
    """The cluster network of EFA nodes: one EFA interface per network card, all in the nodes'
    security group, and the cluster placement group.

    Keyword-only props (defaults in brackets):
      instance: type name or InstanceFacts (from the selector's catalog).
      security_group: the group on every interface; EFA needs one that allows all traffic to and
        from itself (NodeIdentity(efa=True) makes it).
      layout ["efa-only"]: see `efa_interfaces`.
      placement_group [True]: True for a new cluster placement group (all nodes in one AZ, on one
        spine), a group to share one between the templates of a cluster, False for none.

    Attributes: facts, interfaces (without groups), security_group, placement_group (or None),
    placement_group_name, UNIT (the unit that sets up the EFA/NCCL environment) and settings (the
    SettingsFile the node's user data writes for it).
    """

    UNIT = EFA_UNIT

    def __init__(self, scope: Construct, construct_id: str, *, instance: InstanceLike,
                 security_group: ec2.ISecurityGroup, layout: str = "efa-only",
                 placement_group: Union[bool, ec2.IPlacementGroup] = True) -> None:
        super().__init__(scope, construct_id)
        self.facts = resolve(instance)
        self.interfaces = efa_interfaces(self.facts, layout=layout)
        self.security_group = security_group
        if isinstance(placement_group, bool):
            group = (ec2.PlacementGroup(self, "Cluster", strategy=ec2.PlacementGroupStrategy.CLUSTER)
                     if placement_group else None)
        else:
            group = placement_group
        self.placement_group: Optional[ec2.IPlacementGroup] = group
        self.settings = SettingsFile("EFA settings", f"$DL_ETC_DIR/{EFA_SDK_ENV}",
                                     contract.env_text({"SDK": self.facts.sdk}))

    @property
    def placement_group_name(self) -> Optional[str]:
        return placement_group_name(self.placement_group) if self.placement_group else None

    def network_interfaces(self) -> list[dict[str, Any]]:
        """CloudFormation NetworkInterfaces for the launch template (PascalCase, groups set)."""
        return [{**i, "Groups": [self.security_group.security_group_id], "DeleteOnTermination": True}
                for i in self.interfaces]
