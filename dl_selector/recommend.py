"""recommend(profile) -> Recommendation: filter by hard requirements, estimate, rank, explain.

The order itself (each objective's key and tie-breaks, the uncertainty bands) is ranking.py; one
ranked type is candidate.py. Their public names are importable from here as before.
"""
from __future__ import annotations

import functools
TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time (a cold CLI start, issue 39 item 7)
    from .ranking import Market
    from typing import Any, Iterable, Optional
    from .model_memory import ModelMemory

from dl_core.markets import MARKETS

from . import freshness, spot_trust
from .accelerators import AcceleratorSpec, load_accelerators
from .calibration import Calibration, calibrate
from .candidate import CAPACITY_BLOCK_ONLY, Candidate, fmt_price, price_dict, price_line, spot_spread
from .catalog import Catalog, load_catalog
from .errors import UserError, unknown
from .facts import InstanceFacts
from .profiles import Profile, get_profile
from .ranking import (MODEL_METRICS, SPOT_QUOTE_FRESH_DAYS, SUSPECT_SPOT_FRACTION, market_name, ranked_price,
                      sort_key, tie_groups, unpriced_in)
from .record import field, record, replace
from .requirements import Context, Filters, fails, failures, rules_for
from .throughput import Estimate, Measurement, model

__all__ = ["CAPACITY_BLOCK_ONLY", "DEFAULT_REGION", "SPOT_QUOTE_FRESH_DAYS", "SUSPECT_SPOT_FRACTION", "Candidate",
           "Excluded", "Market", "Recommendation", "market_name", "price_dict", "price_line", "price_summary",
           "ranked_price", "recommend", "spot_spread"]

DEFAULT_REGION = "us-east-1"


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
    model: Optional[ModelMemory] = None  # recommend --model-size

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
        unpriced = {c.instance_type for c in unpriced_in(self.market, list(self.candidates))}
        return {
            "profile": self.profile.name,
            "region": self.region,
            "spot": self.spot,
            "market": self.market,
            "objective": self.profile.objective,
            "catalog_as_of": self.catalog_as_of,
            "prices": price_summary(self.candidates, self.region),
            "why": self.why,
            "candidates": [{**c.to_dict(), "unpriced": c.instance_type in unpriced} for c in self.candidates],
            "unpriced": [c.instance_type for c in self.candidates if c.instance_type in unpriced],
            "excluded": [e.to_dict() for e in self.excluded],
            "notes": list(self.notes),
            "calibration": self.calibration.to_dict() if self.calibration else None,
            "model_memory": self.model.to_dict() if self.model is not None else None,
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
    if top.tied_with and o in MODEL_METRICS and u > 0:
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
                    f"({top.samples_per_second:,.0f} samples/s) and is cheaper ({kind}): {fmt_price(a)} vs {fmt_price(b)}")
        return (f"{top.instance_type} wins on throughput: {top.samples_per_second:,.0f} samples/s "
                f"vs {second.samples_per_second:,.0f} for {second.instance_type}")
    if o == "max_samples_per_dollar":
        a, b = top.per_dollar(market), second.per_dollar(market)
        return (f"{top.instance_type} wins on {kind} samples per dollar: {a or 0:,.0f} vs "
                f"{b or 0:,.0f} for {second.instance_type}")
    if o == "min_price":
        a, b = top.hourly(market), second.hourly(market)
        return (f"{top.instance_type} is the cheapest that meets every requirement: {fmt_price(a)} {kind} "
                f"vs {fmt_price(b)} for {second.instance_type}")
    if o == "min_latency":
        from .latency import BASIS
        a, b = top.ms_per_token, second.ms_per_token
        if a is None:
            return (f"no candidate has a latency figure (no memory-bandwidth figure for its accelerator): ranked by "
                    f"price, {top.instance_type} first")
        return (f"{top.instance_type} has the lowest modelled decode time per token at batch 1: {a:.3g} ms vs "
                + (f"{b:.3g} ms" if b is not None else "none (unranked for latency)")
                + f" for {second.instance_type} ({BASIS})")
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
    model = filters.model if filters is not None else None
    if profile.objective == "min_latency" and (model is None or model.training):
        raise UserError("objective min_latency ranks on a model's decode time per token at batch 1: pass "
                        "--model-size N --task inference (e.g. --model-size 7B --task inference)")
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
        else:
            survivors.append(_candidate(facts, profile, ctx, measured, scale, trust_single_az_spot))

    survivors.sort(key=sort_key(profile.objective, market))
    ranked = tie_groups(survivors, profile.objective, market)
    for i, c in enumerate(ranked, start=1):
        object.__setattr__(c, "rank", i)  # set once, before anyone else sees the candidate
    why = _why(profile, ranked, market, region) + _unpriced_why(ranked, market)
    if model is not None:
        why += "; " + model.formula() + _model_why(model, profile, catalog, ranked, region)
    if ranked and _on_upper_bound(ranked[0]) and profile.objective != "min_latency":
        # A best case must not win silently: say so in `why` itself, the line every reader sees.
        why += (f"; note: {ranked[0].facts.accelerator}'s figure is an upper bound from the vendor's own 'up to' claim, "
                "not a measurement: measure it (bench plan) before committing to it")
    notes = _notes(ranked, scale, top, profile.objective != "min_latency")
    if top is not None:
        ranked = ranked[:top]
    excluded.sort(key=lambda e: e.instance_type)
    return Recommendation(profile, region, spot, catalog.as_of, tuple(ranked), tuple(excluded), why,
                          tuple(notes), market, scale, model)


def _model_why(model: ModelMemory, profile: Profile, catalog: Catalog, ranked: list[Candidate], region: str) -> str:
    """What `why` adds for --model-size: more than one node when no single node here holds it."""
    from .requirements import node_memory_gb
    offered = [f for f in catalog if region in f.regions and not f.retired]
    if not offered:
        return ""
    largest = max(offered, key=lambda f: (node_memory_gb(f), f.instance_type))
    big = node_memory_gb(largest)
    if big >= model.needed_gb:
        return ""
    nodes = model.nodes(big)
    if profile.multi_node:
        return (f"; no single node in {region} holds it (largest: {largest.instance_type}, {big:,.4g} GB): "
                f"each row says how many nodes of it do ({nodes} of {largest.instance_type})")
    return (f"; it needs more than one node: the largest node in {region}, {largest.instance_type}, holds "
            f"{big:,.4g} GB, so {nodes} of them: rank with a multi-node profile (--profile multi-node-training, "
            "or one of your own with multi_node = true)")


def _candidate(facts: InstanceFacts, profile: Profile, ctx: Context, measured: dict[str, Measurement],
               scale: Optional[Calibration], trust_single_az_spot: bool) -> Candidate:
    """One type that passed every rule, unranked: its figure, its prices (a measured price wins),
    and whether its spot quote is too thin to rank on (SUSPECT_SPOT_FRACTION)."""
    region = ctx.region
    est = _estimate(facts, profile, ctx.accelerators, measured, scale)
    price = facts.price(region)
    m = measured.get(facts.instance_type)
    od = m.price_per_hour if m and m.price_per_hour else (price.on_demand if price else None)
    sp = m.spot_price_per_hour if m and m.spot_price_per_hour else (price.spot if price else None)
    block = facts.capacity_block_prices.get(region)
    # A measured spot price is the user's own and never set aside.
    model = ctx.filters.model if ctx.filters is not None else None
    nodes, note = None, ""
    if model is not None:
        from .requirements import node_memory_gb
        node = node_memory_gb(facts)
        nodes = model.nodes(node)
        note = (f"holds {model.describe()} ({model.needed_gb:,.0f} GB) on {nodes} node(s) of {node:,.4g} GB"
                + (" each" if nodes > 1 else ""))
    ms, latency = None, ""
    if model is not None and not model.training:
        from .latency import per_token
        ms, latency = per_token(facts, model, ctx.accelerators, nodes)
    aside = (spot_trust.set_aside(price, od) if ctx.spot and not trust_single_az_spot and price is not None
             and sp is not None and sp == price.spot else "")
    return Candidate(
        facts, 0, od, sp, est.samples_per_second, est.source, spot_untrusted=bool(aside), spot_set_aside=aside,
        capacity_block_price_per_hour=block.usd_per_hour if block else None, model_nodes=nodes, model_note=note,
        ms_per_token=ms, latency_note=latency,
        uncertainty=getattr(est, "uncertainty", 0.0), throughput_basis=getattr(est, "basis", est.source),
        _explanation=est._explain, _region=region, _measured=m)


def _unpriced_why(ranked: list[Candidate], market: str) -> str:
    """What `why` must add when some types have no price in the market ranked on: they rank after
    every priced type (sort_key), and a reader who sees a faster type below the pick learns why."""
    unpriced = unpriced_in(market, ranked)
    if not unpriced:
        return ""
    names = _some(tuple(c.instance_type for c in unpriced))
    if len(unpriced) == len(ranked):
        return f"; no candidate has a {market} price in this region: every row is unpriced ({market})"
    return (f"; unpriced on {market} and ranked after every priced type: {names} "
            f"({_unpriced_reason(market)})")


def _unpriced_reason(market: str) -> str:
    if market == "spot":
        return "no spot price on record, or a spot quote set aside as implausibly low"
    if market == "capacity-block":
        return "no Capacity Block rate on record for this region; --live asks EC2 for today's quote"
    return "no on-demand price on record for this region"


def _on_upper_bound(c: Candidate) -> bool:
    return c.throughput_basis == "vendor-upper-bound" and c.throughput_source != "measured"


def _notes(ranked: list[Candidate], scale: Optional[Calibration], top: Optional[int],
           on_throughput: bool = True) -> list[str]:
    """What a reader of the ranking must know beside it: estimates, a pick on a vendor's best
    case, spot quotes set aside, the calibration and its outliers, ties among those shown."""
    notes = []
    if any(c.throughput_source == "model" for c in ranked):
        notes.append("model figures are estimates (each row's ± is its stated uncertainty): "
                     "measure your own job and pass --throughput FILE")
    if ranked and _on_upper_bound(ranked[0]) and on_throughput:  # min_latency ranks on bandwidth, not this figure
        notes.append(f"{ranked[0].instance_type} wins on an upper bound ({ranked[0].facts.accelerator}: a vendor's "
                     "best-case claim); typical workloads are likely slower: measure before committing")
    untrusted = [c.instance_type for c in ranked if c.spot_untrusted]
    if untrusted:
        notes.append(f"spot: {', '.join(untrusted[:5])}{' and more' if len(untrusted) > 5 else ''} rank as unpriced: "
                     f"each a snapshot's quote below {SUSPECT_SPOT_FRACTION:.0%} of on-demand, or one below "
                     f"{spot_trust.SPOT_HISTORY_FRACTION:.0%} of its previous figure (see each row's reasons); "
                     "confirm with --live or pass --trust-single-az-spot")
    if scale is not None:
        notes.append(f"calibrated: modelled figures x {scale.scale:.3g} into your measurements' units "
                     f"({scale.describe()}), so measured and modelled types rank on one scale")
        for name, rel, band in scale.outliers:
            notes.append(f"{name}: measured {rel:.2f}x what the calibrated model expects, outside its ±{band:.0%} "
                         "band: check the measurement (same job, batch and precision?) or the model's row")
    unranked = [c.instance_type for c in ranked if c.latency_note.startswith("unranked for latency")]
    if unranked:
        notes.append(f"unranked for latency (no memory-bandwidth figure in the accelerator table, or a model over "
                     f"one node), ranked after the rest: {_some(tuple(unranked))}")
    if any(c.tied_with for c in ranked[:top or len(ranked)]):
        notes.append("ties: candidates whose figures' uncertainty bands overlap are flagged with their partners "
                     "and stay ranked by the objective's expected value; measure them to decide")
    return notes

def _some(names: tuple[str, ...], most: int = 4) -> str:
    """'a, b, c, d and 5 more': a why line stays readable when dozens tie."""
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")
