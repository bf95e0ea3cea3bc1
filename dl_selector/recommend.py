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
from .candidate import CAPACITY_BLOCK_ONLY, Candidate, price_dict, price_line, spot_spread
from .catalog import Catalog, load_catalog
from .errors import UserError, unknown
from .facts import InstanceFacts
from .profiles import Profile, get_profile
from .explain import notes_for, on_upper_bound, unpriced_why, why_for
from .ranking import (SPOT_QUOTE_FRESH_DAYS, SUSPECT_SPOT_FRACTION, market_name, ranked_price, sort_key, tie_groups,
                      unpriced_in)
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
    why = why_for(profile, ranked, market, region) + unpriced_why(ranked, market)
    if model is not None:
        from .model_fit import model_why
        why += "; " + model.formula() + model_why(model, profile, catalog, region)
    if ranked and on_upper_bound(ranked[0]) and profile.objective != "min_latency":
        # A best case must not win silently: say so in `why` itself, the line every reader sees.
        why += (f"; note: {ranked[0].facts.accelerator}'s figure is an upper bound from the vendor's own 'up to' claim, "
                "not a measurement: measure it (bench plan) before committing to it")
    notes = notes_for(ranked, scale, top, profile.objective != "min_latency")
    if top is not None:
        ranked = ranked[:top]
    excluded.sort(key=lambda e: e.instance_type)
    return Recommendation(profile, region, spot, catalog.as_of, tuple(ranked), tuple(excluded), why,
                          tuple(notes), market, scale, model)


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
    nodes, note, ms, latency = None, "", None, ""
    if model is not None:
        from .model_fit import candidate_fields
        nodes, note, ms, latency = candidate_fields(facts, model, ctx.accelerators)
    aside = (spot_trust.set_aside(price, od) if ctx.spot and not trust_single_az_spot and price is not None
             and sp is not None and sp == price.spot else "")
    return Candidate(
        facts, 0, od, sp, est.samples_per_second, est.source, spot_untrusted=bool(aside), spot_set_aside=aside,
        capacity_block_price_per_hour=block.usd_per_hour if block else None, model_nodes=nodes, model_note=note,
        ms_per_token=ms, latency_note=latency,
        uncertainty=getattr(est, "uncertainty", 0.0), throughput_basis=getattr(est, "basis", est.source),
        _explanation=est._explain, _region=region, _measured=m)
