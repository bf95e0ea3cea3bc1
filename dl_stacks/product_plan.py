"""What one profile's Service Catalog product offers, decided at synth from the selector and the
team's limits (pure Python, no CDK): the instance types a user may pick, the markets, the most
nodes, and for every (type, market) the capacity it launches on and the most nodes the team's
cluster $/hour cap allows there.

The cap is held against the worst case: every node at the ceiling of its choice (on-demand: the
chosen type's price; spot: its on-demand price, EC2's default maximum, which is what EC2 may
charge), so nodes x ceiling <= cap.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from dl_core.markets import OPEN_MARKETS as MARKETS
from dl_selector.errors import UserError, closest
from dl_selector.profiles import Profile
from dl_selector.recommend import recommend
from dl_selector.record import replace

from .portfolio_settings import DEFAULT_BUDGET_HOURS, MAX_TYPES, ProductLimits
from .selection import Selection, money, select
from .settings import Settings


@dataclass(frozen=True)
class Choice:
    """One (instance type, market) a user may pick: its selection (options and ceiling), and the
    most nodes the cap allows (0: none; the choice is refused by a rule)."""

    instance_type: str
    market: str
    selection: Optional[Selection]  # None: not launchable in this market (why says why)
    max_nodes: int
    why: str = ""

    @property
    def ceiling(self) -> Optional[float]:
        return self.selection.ceiling if self.selection else None


@dataclass(frozen=True)
class ProductPlan:
    profile: Profile
    region: str
    limits: ProductLimits
    instance_types: tuple[str, ...]  # rank order: the default first
    markets: tuple[str, ...]
    default_market: str
    max_nodes: int
    choices: tuple[Choice, ...]
    candidates: tuple[str, ...]  # the selector's, rank order (what instance_types was drawn from)
    catalog_as_of: str

    @property
    def multi_node(self) -> bool:
        return self.max_nodes > 1

    @property
    def launchable(self) -> tuple[Choice, ...]:
        return tuple(c for c in self.choices if c.selection is not None and c.max_nodes > 0)

    def worst_cluster_per_hour(self) -> float:
        """The dearest cluster a user can launch: the most nodes allowed times the ceiling, over the choices."""
        return max(c.max_nodes * c.ceiling for c in self.launchable)

    def monthly_budget(self) -> float:
        if self.limits.monthly_budget_usd is not None:
            return self.limits.monthly_budget_usd
        return round(self.worst_cluster_per_hour() * DEFAULT_BUDGET_HOURS, 2)


def _settings(profile: Profile, region: str, instance_type: str, market: str, nodes: int) -> Settings:
    return Settings(profile=profile, instance_type=instance_type, nodes=nodes, spot=market == "spot", region=region,
                    vpc_id=None, subnet_ids=(), availability_zone=None, command="", job=profile.name[:40],
                    max_price=None, local=False, market=market)


def plan_product(profile: Profile, limits: ProductLimits, region: str, *, source: str = "built-in") -> ProductPlan:
    """The product for `profile`; a limit that leaves nothing to launch is a UserError naming it."""
    where = f"{source}: [products.{profile.name}]"
    max_nodes = limits.max_nodes if limits.max_nodes is not None else profile.nodes
    shaped = replace(profile, multi_node=True) if max_nodes > 1 else profile
    markets = ("spot",) if limits.spot_only else MARKETS
    default_market = "spot" if "spot" in markets and profile.workload == "training" else markets[-1]
    rec = recommend(shaped, region=region, market=default_market)
    # Capacity Blocks are bought for one type and reserved ahead: not a self-service choice.
    candidates = tuple(c.instance_type for c in rec.candidates if not c.facts.capacity_block_only)
    if not candidates:
        raise UserError(f"{where}: profile {profile.name} has no candidate in {region} ({rec.why})")
    if limits.instance_types is not None:
        for t in limits.instance_types:
            if t not in candidates:
                near = closest(t, candidates, n=1)
                raise UserError(f"{where}.instance_types names {t}, which is not a candidate of profile {profile.name} "
                                f"in {region}{' for ' + str(max_nodes) + ' nodes' if max_nodes > 1 else ''}"
                                + (f"; closest: {near[0]}" if near else "") + f"; candidates: {', '.join(candidates)}")
        if len(limits.instance_types) > MAX_TYPES:
            raise UserError(f"{where}.instance_types names {len(limits.instance_types)} types: at most {MAX_TYPES} "
                            "(each is a launch template in the product)")
        types = tuple(t for t in candidates if t in limits.instance_types)  # rank order, the pick first
    else:
        types = candidates[:MAX_TYPES]
    cap = limits.max_cluster_usd_per_hour
    choices = []
    for t in types:
        for m in markets:
            try:
                sel = select(_settings(shaped, region, t, m, max_nodes))
            except UserError as e:
                choices.append(Choice(t, m, None, 0, str(e)))
                continue
            # Alternates too stay within what the team allows.
            sel = replace(sel, alternates=tuple(a for a in sel.alternates if a.instance_type in types))
            allowed = max_nodes if cap is None else min(max_nodes, math.floor(cap / sel.ceiling + 1e-9))
            why = "" if allowed == max_nodes else (
                f"{t} {m} costs up to {money(sel.ceiling)} per node: the cap {money(cap)} per cluster allows "
                + (f"at most {allowed} node{'s' if allowed > 1 else ''}" if allowed else "not one node"))
            choices.append(Choice(t, m, sel, allowed, why))
    plan = ProductPlan(profile=profile, region=region, limits=limits, instance_types=types, markets=markets,
                       default_market=default_market, max_nodes=max_nodes, choices=tuple(choices),
                       candidates=candidates, catalog_as_of=rec.catalog_as_of)
    if not plan.launchable:
        raise UserError(f"{where}: nothing can launch: " + "; ".join(c.why for c in choices)[:600])
    # Types a user could pick but never launch are dropped: AllowedValues is what can launch.
    usable = tuple(t for t in types if any(c.instance_type == t for c in plan.launchable))
    return replace(plan, instance_types=usable, choices=tuple(c for c in choices if c.instance_type in usable))
