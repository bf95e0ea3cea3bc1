"""recommend(profile) -> Recommendation: filter by hard requirements, estimate, rank, explain."""
from __future__ import annotations

import functools
from typing import Any, Callable, Iterable, Optional, Union

from . import freshness
from .accelerators import AcceleratorSpec, load_accelerators
from .calibration import Calibration, calibrate
from .catalog import Catalog, load_catalog
from .errors import unknown
from .facts import InstanceFacts, Price
from .profiles import Profile, get_profile
from .record import field, record, replace
from .requirements import MARKETS, Context, Filters, fails, failures, rules_for
from .throughput import Estimate, Measurement, model

DEFAULT_REGION = "us-east-1"
# What to say about a type AWS sells only as Capacity Blocks, where no on-demand or spot price exists.
CAPACITY_BLOCK_ONLY = ("sold only as Capacity Blocks for ML (no on-demand or spot price): rank it with "
                       "--capacity-block; reserve one and pass -c capacity_reservation=cr-... -c market=capacity-block")

Market = Union[bool, str]  # True/False (spot or on-demand, the older API) or one of MARKETS


# The Candidate field holding each market's price.
_PRICE_FIELD = {"on-demand": "price_per_hour", "spot": "spot_price_per_hour",
                "capacity-block": "capacity_block_price_per_hour"}


def market_name(market: Market) -> str:
    if isinstance(market, bool):
        return "spot" if market else "on-demand"
    return market


# Not frozen, though nothing outside this module changes one: a frozen record's __init__ sets
# each of its 17 fields through object.__setattr__, and a ranking builds one per survivor (20% of
# ranking the catalog). Compared by value, never hashed.
@record
class Candidate:
    facts: InstanceFacts
    rank: int
    price_per_hour: Optional[float]
    spot_price_per_hour: Optional[float]
    samples_per_second: float
    throughput_source: str
    capacity_block_price_per_hour: Optional[float] = None
    # The model's stated uncertainty for this figure (0.15 = +-15%); 0 for measured figures.
    uncertainty: float = 0.0
    throughput_basis: str = ""
    # The spot price is shown but not ranked on (see SUSPECT_SPOT_FRACTION).
    spot_untrusted: bool = False
    # The ranking's uncertainty bands and this candidate's place in them: tied_with is read from
    # them when asked (a --top 5 table asks five times; the whole catalog may hold 1,000 tied pairs).
    _bands: Optional["_Bands"] = field(repr=False, default=None, compare=False)
    _index: int = field(repr=False, default=-1, compare=False)
    # What the reasons are made of; the sentences are written only when someone reads them
    # (a --top 5 table reads five), which keeps ranking the whole catalog cheap.
    _explanation: Any = field(repr=False, default="", compare=False)  # the sentence, or a function that writes it
    _region: str = field(repr=False, default="")
    _measured: Optional[Measurement] = field(repr=False, default=None)

    @property
    def tied_with(self) -> tuple[str, ...]:
        """Candidates whose figure's uncertainty band overlaps this one's: a flag ("measure these to
        decide"), not a reordering. Empty when the candidate stands alone."""
        return self._bands.partners(self._index) if self._bands is not None else ()

    @property
    def reasons(self) -> tuple[str, ...]:
        facts, region, m = self.facts, self._region, self._measured
        price = facts.price(region)
        out = [_meets(facts), self._explanation() if callable(self._explanation) else self._explanation]
        if price:
            out.append(price_line(price, region))
        elif facts.capacity_block_only:
            out.append(CAPACITY_BLOCK_ONLY)
        else:
            out.append(f"no price on record for {region}: ranked after priced types on cost objectives")
        block = facts.capacity_block_prices.get(region)
        if block:
            out.append(f"Capacity Block rate {_fmt_price(block.usd_per_hour)} in {region} "
                       f"({freshness.describe(block.as_of)}; {block.source})")
        if m and (m.price_per_hour or m.spot_price_per_hour):
            out.append(f"prices from {m.source}")
        spot, on_demand = self.spot_price_per_hour, self.price_per_hour
        # recommend() flags only a spot quote it compared with an on-demand price on record.
        if self.spot_untrusted and price and spot is not None and on_demand:
            out.append(f"spot ${spot:.2f}/h is one AZ's quote ({price.spot_as_of or 'undated'}) at "
                       f"{spot / on_demand:.0%} of on-demand, below the "
                       f"{SUSPECT_SPOT_FRACTION:.0%} this ranking trusts without a current quote: ranked as unpriced "
                       "on spot; confirm it with --live, or rank on it with --trust-single-az-spot")
        if self.tied_with:
            out.append(f"ties with {', '.join(self.tied_with)}: their uncertainty bands overlap, so the model cannot "
                       "tell them apart; measure these to decide (ranked by the objective's expected value)")
        return tuple(out)

    @property
    def instance_type(self) -> str:
        return self.facts.instance_type

    @property
    def samples_per_dollar(self) -> Optional[float]:
        return _per_dollar(self.samples_per_second, self.price_per_hour)

    @property
    def spot_samples_per_dollar(self) -> Optional[float]:
        return _per_dollar(self.samples_per_second, self.spot_price_per_hour)

    @property
    def spot_single_az(self) -> bool:
        """The spot price ranked on is one AZ's quote (not overridden by a measured price)."""
        p = self.facts.price(self._region)
        return (self.spot_price_per_hour is not None and p is not None and p.spot_azs == 1
                and not (self._measured and self._measured.spot_price_per_hour))

    def hourly(self, market: Market) -> Optional[float]:
        """The price the ranking uses in `market` (True/False: spot/on-demand)."""
        return getattr(self, _PRICE_FIELD.get(market_name(market), "price_per_hour"))

    def per_dollar(self, market: Market) -> Optional[float]:
        return _per_dollar(self.samples_per_second, self.hourly(market))

    def ranked_hourly(self, market: Market) -> Optional[float]:
        """The price the ranking uses: hourly(), less a spot quote it does not trust."""
        return ranked_price(market)(self)

    def ranked_per_dollar(self, market: Market) -> Optional[float]:
        return _ranked_per_dollar(market)(self)

    def to_dict(self) -> dict[str, Any]:
        f = self.facts
        price = f.price(self._region)
        block = f.capacity_block_prices.get(self._region)
        return {
            "instance_type": f.instance_type,
            "rank": self.rank,
            "accelerator": f.accelerator,
            "accelerator_vendor": f.accelerator_vendor,
            "accelerator_count": f.accelerator_count,
            "accelerator_fraction": f.accelerator_fraction,
            "accelerator_memory_gib": f.accelerator_memory_gib,
            "accelerator_memory_total_gib": f.accelerator_memory_total_gib,
            "interconnect": f.interconnect,
            "efa": f.efa,
            "max_efa_interfaces": f.max_efa_interfaces,
            "network_gbps": f.network_gbps,
            "efa_gbps": f.efa_gbps,
            "ena_gbps": f.ena_gbps,
            "nvme_disks": {"count": f.nvme.count, "size_gb": f.nvme.size_gb} if f.nvme else None,
            "vcpus": f.vcpus,
            "memory_gib": f.memory_gib,
            "architecture": f.architecture,
            "price_per_hour": self.price_per_hour,
            "spot_price_per_hour": self.spot_price_per_hour,
            "capacity_block_price_per_hour": self.capacity_block_price_per_hour,
            "price": price_dict(price, self._measured),
            "capacity_block_price": ({"usd_per_hour": block.usd_per_hour, "as_of": block.as_of,
                                      "age_days": freshness.age_days(block.as_of), "source": block.source}
                                     if block else None),
            "samples_per_second": self.samples_per_second,
            "samples_per_dollar": _round(self.samples_per_dollar),
            "spot_samples_per_dollar": _round(self.spot_samples_per_dollar),
            "capacity_block_samples_per_dollar": _round(self.per_dollar("capacity-block")),
            "throughput_source": self.throughput_source,
            "throughput_basis": self.throughput_basis,
            "throughput_uncertainty": self.uncertainty,
            "tied_with": list(self.tied_with),
            "spot_untrusted": self.spot_untrusted,
            "reasons": list(self.reasons),
        }


def price_line(price: Price, region: str) -> str:
    """One sentence: both prices, each with its date, age and source; spot with its spread."""
    od = f"{_fmt_price(price.on_demand)} on-demand in {region} ({freshness.describe(price.as_of)}; {price.source})"
    if price.spot is None:
        return od + "; no spot price on record"
    return od + f"; {_fmt_price(price.spot)} spot, {spot_spread(price)} ({freshness.describe(price.spot_date)}" \
        + (f"; {price.spot_source}" if price.spot_source else "") + ")"


def spot_spread(price: Price) -> str:
    """'median of 4 AZs, $6.90-$9.10' / 'from 1 AZ only: not a market-wide figure' / 'AZ count not recorded'."""
    if price.spot_azs == 1:
        return "from 1 AZ only: not a market-wide figure"
    if price.spot_azs > 1:
        spread = (f", {_fmt_price(price.spot_min)}-{_fmt_price(price.spot_max)}"
                  if price.spot_min is not None and price.spot_max is not None else "")
        return f"median of {price.spot_azs} AZs{spread}"
    return "AZ count not recorded"


def price_dict(price: Optional[Price], measured: Optional[Measurement] = None) -> Optional[dict[str, Any]]:
    if price is None:
        return None
    return {
        "on_demand": {"usd_per_hour": price.on_demand, "as_of": price.as_of,
                      "age_days": freshness.age_days(price.as_of), "source": price.source},
        "spot": None if price.spot is None else {
            "usd_per_hour": price.spot, "min": price.spot_min, "max": price.spot_max, "azs": price.spot_azs or None,
            "single_az": price.spot_azs == 1, "as_of": price.spot_date,
            "age_days": freshness.age_days(price.spot_date), "source": price.spot_source or price.source},
        "note": price.note,
        "overridden_by": measured.source if measured and (measured.price_per_hour or measured.spot_price_per_hour) else None,
    }


@record(frozen=True)
class Excluded:
    """A type that fails a hard requirement. Every reason it fails is written when read (the
    ranking only needs to know that one rule failed)."""
    instance_type: str
    _why: Any = field(repr=False, compare=False)  # () -> the reasons

    @functools.cached_property
    def reasons(self) -> tuple[str, ...]:  # noqa: D401 (cached in the instance's __dict__, frozen or not)
        return tuple(self._why())

    def to_dict(self) -> dict[str, Any]:
        return {"instance_type": self.instance_type, "reasons": list(self.reasons)}


@record(frozen=True)
class Recommendation:
    profile: Profile
    region: str
    spot: bool
    catalog_as_of: str
    candidates: tuple[Candidate, ...]
    excluded: tuple[Excluded, ...]
    why: str
    notes: tuple[str, ...] = field(default=())
    market: str = ""  # one of MARKETS; "" = from `spot`
    calibration: Optional[Calibration] = None

    def __post_init__(self) -> None:
        if not self.market:
            object.__setattr__(self, "market", "spot" if self.spot else "on-demand")

    @property
    def pick(self) -> Optional[Candidate]:
        return self.candidates[0] if self.candidates else None

    @property
    def alternates(self) -> tuple[Candidate, ...]:
        return self.candidates[1:]

    def to_dict(self) -> dict[str, Any]:
        return {
            "profile": self.profile.name,
            "region": self.region,
            "spot": self.spot,
            "market": self.market,
            "objective": self.profile.objective,
            "catalog_as_of": self.catalog_as_of,
            "prices": price_summary(self.candidates, self.region),
            "why": self.why,
            "candidates": [c.to_dict() for c in self.candidates],
            "excluded": [e.to_dict() for e in self.excluded],
            "notes": list(self.notes),
            "calibration": self.calibration.to_dict() if self.calibration else None,
        }


def price_summary(candidates: Iterable[Candidate], region: str) -> list[dict[str, Any]]:
    """Each distinct price source behind the shown candidates, with its date and age: what the
    table's footer says and what --json carries, so nobody reads an old figure as today's."""
    seen: dict[tuple[str, str, str], int] = {}
    for c in candidates:
        p = c.facts.price(region)
        if p is None:
            continue
        for kind, as_of, source in (("on-demand", p.as_of, p.source),
                                    ("spot", p.spot_date, p.spot_source or p.source)):
            if kind == "spot" and p.spot is None:
                continue
            key = (kind, as_of, source)
            seen[key] = seen.get(key, 0) + 1
        block = c.facts.capacity_block_prices.get(region)
        if block:
            key = ("capacity-block", block.as_of, block.source)
            seen[key] = seen.get(key, 0) + 1
    return [{"kind": k, "as_of": a, "age_days": freshness.age_days(a), "source": s, "types": n}
            for (k, a, s), n in seen.items()]


def _per_dollar(sps: float, price: Optional[float]) -> Optional[float]:
    # samples per dollar = samples per second x 3600 / price per hour
    return sps * 3600 / price if price else None


def _round(x: Optional[float]) -> Optional[float]:
    return round(x, 1) if x is not None else None


_MISSING = float("inf")

# A spot figure that is one AZ's quote, undated or more than SPOT_QUOTE_FRESH_DAYS old, and below this
# fraction of on-demand is not trusted to decide a ranking: AWS GPU spot prices in a healthy market
# sit at 30-70% of on-demand across AZs, and the quotes below a quarter that the catalog holds
# (p6-b200.48xlarge at 18% in us-east-1, p5en.48xlarge at 14% in Seoul) are single AZs on undated
# snapshots. Such a type ranks as unpriced on spot until --live confirms the quote (a quote from today's
# market) or the user passes --trust-single-az-spot.
SUSPECT_SPOT_FRACTION = 0.25
SPOT_QUOTE_FRESH_DAYS = 2


def ranked_price(market: Market) -> Callable[[Candidate], Optional[float]]:
    """candidate -> the price a ranking in `market` uses: hourly(), less a spot quote it does not
    trust. A function of the market, made once per ranking: the sort calls it for every candidate."""
    m = market_name(market)
    if m == "spot":
        return lambda c: None if c.spot_untrusted else c.spot_price_per_hour
    attr = _PRICE_FIELD.get(m, "price_per_hour")
    return lambda c: getattr(c, attr)


def _sort_key(objective: str, market: str):
    """The ranking's sort key: the objective's own figure first, then the tie-breaks.

    Exact ties are real: types of one family that are two of the same box (g4dn.metal and
    g4dn.12xlarge, g6e.48xlarge and g6e.24xlarge) cost exactly twice as much for twice the
    throughput, so their samples per dollar are the same float. Under max_samples_per_dollar an
    equal figure goes to the faster type: the same work costs the same on either, and the faster
    one finishes it sooner (fewer hours exposed to a spot interruption, results earlier). Then
    the name, so equal figures always rank the same way. max_throughput breaks its ties on the
    lower price, min_price on the higher throughput, max_accelerator_memory on throughput and
    then price; an unknown price or figure sorts last (_MISSING).
    """
    ranked = ranked_price(market)

    def price(c: Candidate) -> float:
        p = ranked(c)
        return p if p is not None else _MISSING

    ranked_per_dollar = _ranked_per_dollar(market)

    def per_dollar(c: Candidate) -> float:
        v = ranked_per_dollar(c)
        return -v if v is not None else _MISSING

    keys = {
        "max_throughput": lambda c: (-c.samples_per_second, price(c), c.instance_type),
        "max_samples_per_dollar": lambda c: (per_dollar(c), -c.samples_per_second, c.instance_type),
        "min_price": lambda c: (price(c), -c.samples_per_second, c.instance_type),
        "max_accelerator_memory": lambda c: (-c.facts.accelerator_memory_total_gib, -c.samples_per_second, price(c), c.instance_type),
    }
    return keys[objective]


def _ranked_per_dollar(market: Market) -> Callable[[Candidate], Optional[float]]:
    price = ranked_price(market)
    return lambda c: _per_dollar(c.samples_per_second, price(c))


# Objectives whose ranking rests on the throughput figure, and so on its uncertainty:
# objective -> market -> (candidate -> the figure ranked on), made once per ranking.
_MODEL_METRICS = {
    "max_throughput": lambda market: (lambda c: c.samples_per_second),
    "max_samples_per_dollar": _ranked_per_dollar,
}


@record(frozen=True)
class _Bands:
    """One ranking's figures with their uncertainty intervals, v x (1 +- u), in rank order (the
    metric descending). Two candidates tie when their intervals overlap. A measured figure (u = 0)
    is a point: it ties with a modelled one whose band holds it, with another measured one only if
    equal. An unknown or zero figure (no price, not a training device) ties with none."""
    names: tuple[str, ...]
    values: tuple[Optional[float], ...]
    lows: tuple[Optional[float], ...]
    highs: tuple[Optional[float], ...]
    widest: float

    def partners(self, i: int) -> tuple[str, ...]:
        low, high, values, lows, highs = self.lows[i], self.highs[i], self.values, self.lows, self.highs
        if low is None or high is None:  # a figure has both ends of its band or neither
            return ()
        out = []
        for j in range(i - 1, -1, -1):  # above: larger figures
            v, lo, hi = values[j], lows[j], highs[j]
            if v is not None and v * (1 - self.widest) > high:
                break  # every figure further up is larger still: its band starts above this one's
            if lo is not None and hi is not None and hi >= low and high >= lo:
                out.append(j)
        for j in range(i + 1, len(values)):  # below: smaller figures
            v, lo, hi = values[j], lows[j], highs[j]
            if v is None or v * (1 + self.widest) < low:
                break
            if lo is not None and hi is not None and hi >= low and high >= lo:
                out.append(j)
        return tuple(self.names[j] for j in sorted(out))


def _tie_groups(ranked: list[Candidate], objective: str, market: str) -> list[Candidate]:
    """Give the ranking its uncertainty bands, from which each candidate's ties are read. A tie is a
    flag ("measure these to decide"), never a reordering: the ranking stays by the objective's own
    expected value (a cheaper type does not jump a faster one under max_throughput, nor one with
    fewer samples per dollar a better one)."""
    metric_for = _MODEL_METRICS.get(objective)
    if metric_for is None:
        return ranked
    metric = metric_for(market)
    values = tuple(metric(c) for c in ranked)
    bands = _Bands(names=tuple(c.instance_type for c in ranked), values=values,
                   lows=tuple(v * (1 - c.uncertainty) if v else None for c, v in zip(ranked, values)),
                   highs=tuple(v * (1 + c.uncertainty) if v else None for c, v in zip(ranked, values)),
                   widest=max((c.uncertainty for c in ranked), default=0.0))
    for i, c in enumerate(ranked):  # made by this call: set once, before anyone else sees them
        object.__setattr__(c, "_bands", bands)
        object.__setattr__(c, "_index", i)
    return ranked


def _estimate(facts: InstanceFacts, profile: Profile, accelerators: dict[str, AcceleratorSpec],
              measured: dict[str, Measurement], scale: Optional[Calibration] = None) -> Estimate:
    m = measured.get(facts.instance_type)
    if m is not None:
        return Estimate(m.samples_per_second, "measured", f"measured: {m.samples_per_second:g} samples/s ({m.source})")
    est = model(facts, profile, accelerators)
    if scale is None:
        return est
    return replace(est, samples_per_second=est.samples_per_second * scale.scale, source="calibrated",
                   _explain=lambda: f"{est.explanation}; x {scale.scale:.3g} into your measurements' units "
                                    f"(calibrated: {scale.describe()})")


def _fmt_price(v: Optional[float]) -> str:
    return f"${v:,.2f}/h" if v is not None else "no price"


def _why(profile: Profile, ranked: list[Candidate], market: str, region: str) -> str:
    if not ranked:
        return f"no instance type meets every hard requirement of {profile.name} in {region}"
    top = ranked[0]
    kind = market
    if len(ranked) == 1:
        return f"{top.instance_type} is the only type that meets every hard requirement"
    second = ranked[1]
    o = profile.objective
    u = max(top.uncertainty, second.uncertainty)
    if top.tied_with and o in _MODEL_METRICS and u > 0:
        what = "throughput" if o == "max_throughput" else f"{kind} samples per dollar"
        fig = (lambda c: f"{c.samples_per_second:,.0f} samples/s") if o == "max_throughput" else (
            lambda c: f"{c.per_dollar(market) or 0:,.0f} samples per dollar")
        return (f"{top.instance_type} leads on modelled {what} ({fig(top)} vs {fig(second)} for "
                f"{second.instance_type}) but ties with {_some(top.tied_with)}: their uncertainty bands "
                f"overlap (±{u:.0%}); measure these to decide")
    if o == "max_throughput":
        if top.samples_per_second == second.samples_per_second:
            a, b = top.hourly(market), second.hourly(market)
            return (f"{top.instance_type} ties with {second.instance_type} on throughput "
                    f"({top.samples_per_second:,.0f} samples/s) and is cheaper ({kind}): {_fmt_price(a)} vs {_fmt_price(b)}")
        return (f"{top.instance_type} wins on throughput: {top.samples_per_second:,.0f} samples/s "
                f"vs {second.samples_per_second:,.0f} for {second.instance_type}")
    if o == "max_samples_per_dollar":
        a, b = top.per_dollar(market), second.per_dollar(market)
        return (f"{top.instance_type} wins on {kind} samples per dollar: {a or 0:,.0f} vs "
                f"{b or 0:,.0f} for {second.instance_type}")
    if o == "min_price":
        a, b = top.hourly(market), second.hourly(market)
        return (f"{top.instance_type} is the cheapest that meets every requirement: {_fmt_price(a)} {kind} "
                f"vs {_fmt_price(b)} for {second.instance_type}")
    return (f"{top.instance_type} has the most accelerator memory: {top.facts.accelerator_memory_total_gib:g} GiB "
            f"vs {second.facts.accelerator_memory_total_gib:g} GiB for {second.instance_type}")


def recommend(
    profile: Profile | str,
    *,
    region: str = DEFAULT_REGION,
    spot: bool = False,
    top: Optional[int] = None,
    families: Optional[Iterable[str]] = None,
    measured: Optional[dict[str, Measurement]] = None,
    catalog: Optional[Catalog] = None,
    accelerators: Optional[dict[str, AcceleratorSpec]] = None,
    market: Optional[str] = None,
    calibrate_model: bool = True,
    filters: Optional[Filters] = None,
    trust_single_az_spot: bool = False,
) -> Recommendation:
    """Rank every type in the catalog for `profile` in `region`.

    market: "on-demand", "spot" or "capacity-block" (the price kind ranked on); default from `spot`.
    families: restrict the catalog to these families; naming a retired family makes it eligible.
    measured: per-type measured samples/s (and optional prices) that replace the model.
    trust_single_az_spot: rank on spot quotes SUSPECT_SPOT_FRACTION would set aside.
    filters: ad-hoc narrowing on top of the profile (--gpu, --min-gpu-memory, --max-price).
    calibrate_model: scale every modelled figure into the measurements' units (see Calibration),
      so measured and modelled candidates compare on one scale; off only to see raw model units.
    """
    if isinstance(profile, str):
        profile = get_profile(profile)
    market = market or ("spot" if spot else "on-demand")
    if market not in MARKETS:
        raise unknown("market", market, MARKETS)
    spot = market == "spot"
    catalog = catalog if catalog is not None else load_catalog()
    accelerators = accelerators if accelerators is not None else load_accelerators()
    measured = measured or {}
    catalog.check_region(region)
    named: frozenset[str] = frozenset()
    if families:
        families = [f for f in families if f.strip()]
        catalog = catalog.only_families(families)
        named = frozenset(f.strip() for f in families)
    ctx = Context(region=region, spot=spot, named_families=named, accelerators=accelerators, market=market,
                  filters=filters)
    scale = calibrate(catalog, profile, accelerators, measured) if measured and calibrate_model else None
    rules = rules_for(profile, ctx)

    survivors: list[Candidate] = []
    excluded: list[Excluded] = []
    for facts in catalog:
        if fails(facts, profile, ctx, rules):
            excluded.append(Excluded(facts.instance_type, functools.partial(failures, facts, profile, ctx)))
            continue
        est = _estimate(facts, profile, accelerators, measured, scale)
        price = facts.price(region)
        m = measured.get(facts.instance_type)
        od = m.price_per_hour if m and m.price_per_hour else (price.on_demand if price else None)
        sp = m.spot_price_per_hour if m and m.spot_price_per_hour else (price.spot if price else None)
        block = facts.capacity_block_prices.get(region)
        untrusted = (spot and not trust_single_az_spot and sp is not None and od and price is not None
                     and sp < SUSPECT_SPOT_FRACTION * od and price.spot_azs == 1 and sp == price.spot
                     and not _fresh(price.spot_as_of))
        survivors.append(Candidate(
            facts, 0, od, sp, est.samples_per_second, est.source, spot_untrusted=bool(untrusted),
            capacity_block_price_per_hour=block.usd_per_hour if block else None,
            uncertainty=getattr(est, "uncertainty", 0.0), throughput_basis=getattr(est, "basis", est.source),
            _explanation=est._explain, _region=region, _measured=m))

    survivors.sort(key=_sort_key(profile.objective, market))
    ranked = _tie_groups(survivors, profile.objective, market)
    for i, c in enumerate(ranked, start=1):
        object.__setattr__(c, "rank", i)  # set once, before anyone else sees the candidate
    why = _why(profile, ranked, market, region)
    notes = []
    if any(c.throughput_source == "model" for c in ranked):
        notes.append("model figures are estimates (each row's ± is its stated uncertainty): "
                     "measure your own job and pass --throughput FILE")
    if ranked and ranked[0].throughput_basis == "vendor-upper-bound" and ranked[0].throughput_source != "measured":
        # A best case must not win silently: say so in `why` itself, the line every reader sees.
        why += (f"; note: {ranked[0].facts.accelerator}'s figure is an upper bound from the vendor's own 'up to' claim, "
                "not a measurement: measure it (bench plan) before committing to it")
        notes.append(f"{ranked[0].instance_type} wins on an upper bound ({ranked[0].facts.accelerator}: a vendor's "
                     "best-case claim); typical workloads are likely slower: measure before committing")
    untrusted = [c.instance_type for c in ranked if c.spot_untrusted]
    if untrusted:
        notes.append(f"spot: {', '.join(untrusted[:5])}{' and more' if len(untrusted) > 5 else ''} rank as unpriced: "
                     f"each one AZ's undated quote below {SUSPECT_SPOT_FRACTION:.0%} of on-demand; confirm with --live "
                     "or pass --trust-single-az-spot")
    if scale is not None:
        notes.append(f"calibrated: modelled figures x {scale.scale:.3g} into your measurements' units "
                     f"({scale.describe()}), so measured and modelled types rank on one scale")
        for name, rel, band in scale.outliers:
            notes.append(f"{name}: measured {rel:.2f}x what the calibrated model expects, outside its ±{band:.0%} "
                         "band: check the measurement (same job, batch and precision?) or the model's row")
    if any(c.tied_with for c in ranked[:top or len(ranked)]):
        notes.append("ties: candidates whose figures' uncertainty bands overlap are flagged with their partners "
                     "and stay ranked by the objective's expected value; measure them to decide")
    if top is not None:
        ranked = ranked[:top]
    excluded.sort(key=lambda e: e.instance_type)
    return Recommendation(profile, region, spot, catalog.as_of, tuple(ranked), tuple(excluded), why,
                          tuple(notes), market, scale)


def _some(names: tuple[str, ...], most: int = 4) -> str:
    """'a, b, c, d and 5 more': a why line stays readable when dozens tie."""
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def _fresh(as_of: str) -> bool:
    days = freshness.age_days(as_of)
    return days is not None and days <= SPOT_QUOTE_FRESH_DAYS


def _meets(f: InstanceFacts) -> str:
    parts = [f"{f.accelerator_count} x {f.accelerator} {f.accelerator_memory_gib:g} GiB"]
    if f.accelerator_count > 1:
        parts.append(f.interconnect)
    if f.efa:
        parts.append(f"EFA x{f.max_efa_interfaces}")
    parts.append(f"{f.vcpus} vCPU, {f.memory_gib:g} GiB RAM")
    if f.nvme:
        parts.append(f"{f.nvme.count} x {f.nvme.size_gb} GB NVMe")
    return "meets every hard requirement: " + ", ".join(parts)
