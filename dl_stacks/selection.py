"""Settings -> the instance type to launch, the alternates that may replace it, and what the whole
cluster can cost: asked once per synth, pure Python (no CDK).

The cost ceiling is a price per node per hour in the market the job launches in (spot: the pick's
on-demand price, EC2's own default max price, since a spot quote is a dated snapshot and as a max
price it could keep the cluster from ever launching; on-demand: the on-demand price;
capacity-block: the block's published rate where the catalog has one, else what the user paid, as
max_price). `max_price` sets it; on spot EC2 enforces it per node. An alternate must be
interchangeable with the pick for the same job (dl_selector/interchange.py), priced in the market, and at or below the ceiling (on spot
without max_price: at or below the pick's own quote, so no alternate is expected to cost more); every
other candidate keeps the reason it was not taken. Hence the cluster's worst case in its market is
at most nodes x ceiling.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, NamedTuple, Optional

from dl_selector import freshness
from dl_selector.catalog import load_catalog
from dl_selector.errors import UserError
from dl_selector.facts import InstanceFacts
from dl_selector.interchange import interchangeable
from dl_selector.recommend import CAPACITY_BLOCK_ONLY, Candidate, Recommendation, recommend, spot_spread
from dl_selector.record import replace

from .settings import Settings

MAX_ALTERNATES = 4  # launch templates per group stay few; capacity-optimized needs only a handful


def money(v: Optional[float]) -> str:
    return f"${v:,.2f}/h" if v is not None else "unknown"


@dataclass(frozen=True)
class OptionPrice:
    """What one node of a type costs, USD per hour, in the job's region."""

    instance_type: str
    on_demand: Optional[float]  # on record
    spot: Optional[float]  # on record (a typical price: the median across AZs)
    # The most one node costs in the job's market, as far as the record and EC2's caps say
    # (None: unknown); this is what the ceiling is compared with.
    in_market: Optional[float]
    basis: str  # where in_market comes from, in words


class WorstCase(NamedTuple):
    """The whole cluster's worst case, USD per hour, over the pick and its alternates: every node
    on the dearest option. None where an option's price is unknown."""

    on_demand: Optional[float]
    spot: Optional[float]
    market: Optional[float]  # in the market the job launches in: never above nodes x ceiling


@dataclass(frozen=True)
class Selection:
    pick: Candidate
    alternates: tuple[Candidate, ...]  # rank order; each may replace the pick for the whole job
    rejected: tuple[tuple[str, str], ...]  # (instance type, reason) for every other candidate, rank order
    market: str  # "spot" | "on-demand" | "capacity-block"
    ceiling: float  # USD per hour per node, in `market`
    ceiling_source: str  # where the ceiling came from, in words
    prices: Mapping[str, OptionPrice]  # the pick and the alternates, in option order
    interchange: str  # the rule the alternates were held to (dl_selector.interchange.RULES)
    region: str
    recommendation: Recommendation
    max_price: Optional[float] = None  # as the user set it; on spot EC2 enforces it per node

    @property
    def facts(self) -> InstanceFacts:
        return self.pick.facts

    @property
    def options(self) -> tuple[Candidate, ...]:
        """The pick, then the alternates: every type the job may launch on."""
        return (self.pick, *self.alternates)

    def hourly(self, nodes: int) -> tuple[Optional[float], Optional[float]]:
        """The pick alone on every node: (on-demand, spot) USD per hour, None where not on record."""
        od, sp = self.pick.price_per_hour, self.pick.spot_price_per_hour
        return (od * nodes if od else None, sp * nodes if sp else None)

    def pick_cost(self, nodes: int) -> Optional[float]:
        """The pick alone on every node, in the job's market: what the worst case is measured against."""
        v = self.prices[self.pick.instance_type].in_market
        return v * nodes if v is not None else None

    def worst_case(self, nodes: int) -> WorstCase:
        def most(values: list[Optional[float]]) -> Optional[float]:
            known = [v for v in values if v is not None]
            return max(known) * nodes if len(known) == len(values) else None

        opts = list(self.prices.values())
        cap = self.max_price if self.market == "spot" else None  # EC2 enforces it on spot only
        if self.market == "spot":
            # EC2 charges spot at most the max price sent (the ceiling) and at most on-demand: the
            # quotes are only what it is expected to cost.
            in_market = most([min(self.ceiling, o.on_demand) if o.on_demand is not None else self.ceiling
                              for o in opts])
        else:
            in_market = most([o.in_market for o in opts])
        return WorstCase(on_demand=most([o.on_demand for o in opts]),
                         spot=most([_spot_most(o.spot, o.on_demand, cap)[0] for o in opts]),
                         market=in_market)

    def expected_spot(self) -> Optional[str]:
        """On spot, what the pick is expected to cost per node and how far the quote can be trusted:
        '$21.01/h per node (from 1 AZ only: not a market-wide figure; date unknown; SOURCE)'."""
        if self.market != "spot":
            return None
        quote = self.pick.facts.price(self.region)
        if quote is None or quote.spot is None:
            return f"no spot quote on record for {self.pick.instance_type} in {self.region}"
        return (f"{money(quote.spot)} per node ({spot_spread(quote)}; {freshness.describe(quote.spot_date)}; "
                f"{quote.spot_source or quote.source})")

    def describe_ceiling(self) -> str:
        """'$21.01/h per node, spot (p6-b200.48xlarge's spot price in us-east-1, on record)'."""
        return f"{money(self.ceiling)} per node, {self.market} ({self.ceiling_source})"

    def describe_price(self, instance_type: str) -> str:
        """'p6-b200.48xlarge $21.01/h spot (on record; on-demand $113.93/h)'."""
        o = self.prices[instance_type]
        other = f"on-demand {money(o.on_demand)}" if self.market != "on-demand" else f"spot {money(o.spot)}"
        if next(c.facts for c in self.options if c.instance_type == instance_type).capacity_block_only:
            other = "sold only as Capacity Blocks for ML"  # not a gap in our prices: there are none
        return f"{instance_type} {money(o.in_market)} {self.market} ({o.basis}; {other})"

    def describe_options(self) -> tuple[str, ...]:
        return tuple(self.describe_price(c.instance_type) for c in self.options)


def _spot_most(spot: Optional[float], on_demand: Optional[float], cap: Optional[float]) -> tuple[Optional[float], str]:
    """The most one node costs on spot: the price on record; without one, the on-demand price
    (EC2 never charges more for spot, and it is the default max price); EC2 also never charges
    more than a max price it was given (the capacity construct sends max_price as the spot max price)."""
    if spot is not None:
        value, basis = spot, "on record"
    elif on_demand is not None:
        value, basis = on_demand, "no spot price on record: at most its on-demand price"
    else:
        return None, "no spot or on-demand price on record"
    if cap is not None and value > cap:
        value, basis = cap, f"{money(value)} {basis}, above max_price: EC2 launches it only at max_price or less"
    return value, basis


def _price(c: Candidate, market: str, max_price: Optional[float], *, pick: bool) -> OptionPrice:
    od, sp = c.price_per_hour, c.spot_price_per_hour
    if market == "on-demand":
        value, basis = od, "on record" if od is not None else "no on-demand price on record"
    elif market == "spot" and pick:
        # The pick launches whatever its record says, so it may lean on EC2's caps.
        value, basis = _spot_most(sp, od, max_price)
    elif market == "spot":
        # An alternate is only ever added on a spot price on record, never on a bound or a guess.
        value, basis = sp, "on record" if sp is not None else "no spot price on record"
    elif not pick:
        # A Capacity Block reserves one instance type: nothing else can launch into it.
        value, basis = None, "a Capacity Block reserves one instance type"
    elif max_price is not None:
        # What the user paid is the truth; the published rate is only what AWS asked at one time.
        value, basis = max_price, "the Capacity Block's price, as max_price states it"
    elif c.capacity_block_price_per_hour is not None:
        value, basis = c.capacity_block_price_per_hour, "published Capacity Block rate on record"
    else:
        value, basis = None, "no Capacity Block rate on record"
    return OptionPrice(c.instance_type, od, sp, value, basis)


def _choose_pick(settings: Settings, rec: Recommendation) -> Candidate:
    if settings.instance_type:
        chosen = [c for c in rec.candidates if c.instance_type == settings.instance_type]
        if not chosen:
            why = next((e.reasons for e in rec.excluded if e.instance_type == settings.instance_type), ())
            raise UserError(
                f"instance_type {settings.instance_type} does not fit profile {rec.profile.name}"
                f"{' with ' + str(settings.nodes) + ' nodes' if settings.multi_node else ''}: {'; '.join(why)}"
                + (f"; the profile's pick is {rec.pick.instance_type}" if rec.pick else ""))
        return chosen[0]
    if rec.pick is None:
        raise UserError(f"{rec.why}; try another profile or region")
    return rec.pick


# Spot prices move by tens of percent over weeks, not by half: a ceiling under half of the lowest
# quote on record is a mistake (a misplaced decimal point), not a bet on a dip.
SPOT_FLOOR = 0.5
# Without a spot quote on record, AWS's own bound: spot saves "up to 90%" off on-demand, so a
# ceiling under a tenth of the on-demand price can never be met.
SPOT_MAX_DISCOUNT = 0.9


def _ceiling(settings: Settings, pick: Candidate, price: OptionPrice) -> tuple[float, str]:
    name, market, region = pick.instance_type, settings.market, settings.region
    if pick.facts.capacity_block_only and market != "capacity-block":
        raise UserError(f"{name} is {CAPACITY_BLOCK_ONLY}")
    if settings.max_price is not None:
        if market == "on-demand" and price.on_demand is not None and price.on_demand > settings.max_price:
            # EC2 enforces a max price on spot only: an on-demand node simply costs its price.
            raise UserError(f"max_price {money(settings.max_price)} is below {name}'s on-demand price "
                            f"{money(price.on_demand)} in {region}: raise it, or pin a cheaper instance_type")
        quote = pick.facts.price(region)
        lowest = (quote.spot_min or quote.spot) if quote else None
        if market == "spot" and lowest is not None and settings.max_price < SPOT_FLOOR * lowest:
            # Under the spot price, a cluster waits for a dip (documented, allowed); under half of the
            # lowest quote on record, in any AZ, it waits for ever, never training: refused, as the
            # on-demand case is.
            raise UserError(f"max_price ${settings.max_price:g}/h is under half of every spot price on record for {name} "
                            f"in {region} (the lowest, in any AZ: {money(lowest)}{_as_of(quote.spot_date)}): the "
                            f"cluster would never launch; raise it to at least {money(SPOT_FLOOR * lowest)} (at "
                            f"{money(lowest)} it launches at today's prices), or pin a cheaper instance_type")
        on_demand = quote.on_demand if quote else None
        if (market == "spot" and lowest is None and on_demand is not None
                and settings.max_price < (1 - SPOT_MAX_DISCOUNT) * on_demand):
            raise UserError(f"max_price ${settings.max_price:g}/h is under a tenth of {name}'s on-demand price "
                            f"{money(on_demand)} in {region}, and spot is at most 90% off on-demand (no spot quote is "
                            f"on record to go by): the cluster would never launch; raise it to at least "
                            f"{money((1 - SPOT_MAX_DISCOUNT) * on_demand)}, or pin a cheaper instance_type")
        return settings.max_price, "max_price, as you set it"
    if market == "capacity-block" and price.in_market is None:
        raise UserError(f"market capacity-block: the catalog holds no Capacity Block rate for {name} in {region}; "
                        f"pass -c max_price=USD/h, what one {name} of your block costs per hour")
    if market == "spot" and price.on_demand is not None:
        # A spot quote is a snapshot (often undated, sometimes one AZ): as EC2's max price it can
        # sit below the market for good, and the cluster never launches. EC2's own default is the
        # on-demand price, and spot never costs more than that.
        return max(price.on_demand, price.in_market or 0.0), (
            f"{name}'s on-demand price in {region}, EC2's default spot max price: a stale or one-AZ "
            "quote cannot keep the cluster from launching")
    if price.in_market is None:
        raise UserError(f"{name} has no {market} price on record in {region}: pass -c max_price=USD/h "
                        "(the most one node may cost), or choose another market or instance_type")
    return price.in_market, f"{name}'s {market} price in {region}, {price.basis}"


def _alternate_bound(settings: Settings, pick_price: OptionPrice, ceiling: float) -> tuple[float, str]:
    """The most an alternate may be expected to cost per node: the ceiling, except on spot without
    max_price, where the ceiling is the pick's on-demand price (EC2's max price) but no alternate
    may be expected to cost more than the pick itself, as quoted."""
    if settings.market == "spot" and settings.max_price is None and pick_price.in_market is not None:
        return min(ceiling, pick_price.in_market), "the pick's own spot price"
    return ceiling, "the ceiling"


def _why_not(c: Candidate, pick: Candidate, price: OptionPrice, settings: Settings,
             bound: tuple[float, str]) -> Optional[str]:
    """None when `c` may be an alternate; else why not, one line."""
    reason = interchangeable(pick.facts, c.facts, multi_node=settings.multi_node, rule=settings.interchange)
    if reason:
        return f"not interchangeable: {reason}"
    if settings.market == "capacity-block":
        return "a Capacity Block reserves one instance type: nothing else launches into it"
    if price.in_market is None:
        if c.facts.capacity_block_only and settings.market != "capacity-block":
            return f"no price on record in {settings.region} for {settings.market}: {CAPACITY_BLOCK_ONLY}"
        return f"no price on record in {settings.region} for {settings.market}"
    if price.in_market > bound[0]:
        return f"price {money(price.in_market)} {settings.market} is above {bound[1]} {money(bound[0])}"
    return None


def select(settings: Settings, max_alternates: int = MAX_ALTERNATES) -> Selection:
    profile = settings.profile
    if settings.multi_node and not profile.multi_node:
        profile = replace(profile, multi_node=True)  # several nodes need EFA and a cluster placement group
    rec = recommend(profile, region=settings.region, market=settings.market, catalog=load_catalog())
    pick = _choose_pick(settings, rec)
    prices = {pick.instance_type: _price(pick, settings.market, settings.max_price, pick=True)}
    ceiling, source = _ceiling(settings, pick, prices[pick.instance_type])
    bound = _alternate_bound(settings, prices[pick.instance_type], ceiling)

    alternates: list[Candidate] = []
    rejected: list[tuple[str, str]] = []
    for c in rec.candidates:
        if c.instance_type == pick.instance_type:
            continue
        price = _price(c, settings.market, settings.max_price, pick=False)
        reason = _why_not(c, pick, price, settings, bound)
        if reason is None and len(alternates) >= max_alternates:
            reason = f"interchangeable and within the ceiling, but the first {max_alternates} alternates were taken"
        if reason:
            rejected.append((c.instance_type, reason))
        else:
            alternates.append(c)
            prices[c.instance_type] = price
    return Selection(pick=pick, alternates=tuple(alternates), rejected=tuple(rejected), market=settings.market,
                     ceiling=ceiling, ceiling_source=source, prices=prices, interchange=settings.interchange,
                     region=settings.region, recommendation=rec, max_price=settings.max_price)


def _as_of(date: str) -> str:
    return f", as of {date}" if date and date != "unknown" else ""
