"""The sentences a ranking comes with: `why` the pick won (and what it rests on) and the notes a reader
must see beside the table. recommend.py ranks; this explains the order it made."""
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time (a cold CLI start, issue 39 item 7)
    from typing import Optional
    from .calibration import Calibration
    from .candidate import Candidate
    from .profiles import Profile

from . import spot_trust
from .candidate import fmt_price
from .ranking import MODEL_METRICS, SUSPECT_SPOT_FRACTION, unpriced_in


def why_for(profile: Profile, ranked: list[Candidate], market: str, region: str) -> str:
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
                f"{second.instance_type}) but ties with {some(top.tied_with)}: their uncertainty bands "
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
        from .latency import latency_why
        return latency_why(top, second)
    return (f"{top.instance_type} has the most accelerator memory: {top.facts.accelerator_memory_total_gib:g} GiB "
            f"vs {second.facts.accelerator_memory_total_gib:g} GiB for {second.instance_type}")


def unpriced_why(ranked: list[Candidate], market: str) -> str:
    """What `why` must add when some types have no price in the market ranked on: they rank after
    every priced type (sort_key), and a reader who sees a faster type below the pick learns why."""
    unpriced = unpriced_in(market, ranked)
    if not unpriced:
        return ""
    names = some(tuple(c.instance_type for c in unpriced))
    if len(unpriced) == len(ranked):
        return f"; no candidate has a {market} price in this region: every row is unpriced ({market})"
    return (f"; unpriced on {market} and ranked after every priced type: {names} "
            f"({unpriced_reason(market)})")


def unpriced_reason(market: str) -> str:
    if market == "spot":
        return "no spot price on record, or a spot quote set aside as implausibly low"
    if market == "capacity-block":
        return "no Capacity Block rate on record for this region; --live asks EC2 for today's quote"
    return "no on-demand price on record for this region"


def on_upper_bound(c: Candidate) -> bool:
    return c.throughput_basis == "vendor-upper-bound" and c.throughput_source != "measured"


def notes_for(ranked: list[Candidate], scale: Optional[Calibration], top: Optional[int],
           on_throughput: bool = True) -> list[str]:
    """What a reader of the ranking must know beside it: estimates, a pick on a vendor's best
    case, spot quotes set aside, the calibration and its outliers, ties among those shown."""
    notes = []
    if any(c.throughput_source == "model" for c in ranked):
        notes.append("model figures are estimates (each row's ± is its stated uncertainty): "
                     "measure your own job and pass --throughput FILE")
    if ranked and on_upper_bound(ranked[0]) and on_throughput:  # min_latency ranks on bandwidth, not this figure
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
                     f"one node), ranked after the rest: {some(tuple(unranked))}")
    if any(c.tied_with for c in ranked[:top or len(ranked)]):
        notes.append("ties: candidates whose figures' uncertainty bands overlap are flagged with their partners "
                     "and stay ranked by the objective's expected value; measure them to decide")
    return notes

def some(names: tuple[str, ...], most: int = 4) -> str:
    """'a, b, c, d and 5 more': a why line stays readable when dozens tie."""
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")
