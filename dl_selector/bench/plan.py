"""`bench plan`: which candidates to measure, with what command, and what it can cost.

The candidates are the selector's own ranking for the profile (the top N), so the benchmark
measures what the model would otherwise decide. Each runs on one instance for at most `minutes`
(the stack enforces it twice), so the most a candidate can cost is its hourly cap x minutes / 60:
EC2 bills Linux instances per second (one minute minimum), and on spot the cap is the maximum
price sent with the request, EC2's own default, the on-demand price. `--max-cost` is checked
against that worst case, never the expected spot bill, so a budget holds whatever spot does.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Optional

from ..catalog import Catalog
from ..errors import UserError
from ..validate import clean
from ..profiles import Profile
from ..recommend import Recommendation, recommend
from .contract import MARKETS, NAME_PATTERN, Plan, PlannedCandidate

DEFAULT_TOP = 5
DEFAULT_MINUTES = 20  # boot (2-5 min on a DLAMI), data staging and 5+ timed windows
MINUTES = (5, 240)
MODELS = ("resnet50", "gpt2")
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
# The profile's model precision -> the reference benchmark's. "mixed" is fp16 with loss scaling,
# not bf16: V100 and T4 (still candidates on cost) have no bf16 tensor cores, and one command runs
# on every candidate, so the comparison stays like for like. Pass --precision bf16 for newer GPUs.
PROFILE_PRECISION = {"mixed": "fp16", "fp32": "fp32"}


@dataclass(frozen=True)
class Skipped:
    instance_type: str
    reason: str


@dataclass(frozen=True)
class PlanResult:
    plan: Plan
    skipped: tuple[Skipped, ...]
    tied_beyond: tuple[str, ...]  # ranked below --top but tied with a planned candidate


def reference_command(model: str, precision: str) -> str:
    return f"python3 -m dl_selector.bench.reference --model {model} --precision {precision}"


def make_plan(profile: Profile, *, catalog: Catalog, region: str, rank_market: str = "on-demand",
              launch_market: str = "spot", top: int = DEFAULT_TOP, minutes: int = DEFAULT_MINUTES,
              command: Optional[str] = None, model: str = "resnet50", precision: Optional[str] = None,
              families: Optional[list[str]] = None, name: Optional[str] = None,
              max_cost: Optional[float] = None, now: Optional[datetime] = None) -> PlanResult:
    """The plan for `profile`; UserError (one line) for anything that cannot be planned or
    costs more than `max_cost` in the worst case."""
    if launch_market not in MARKETS or rank_market not in MARKETS:
        raise UserError(f"markets are {', '.join(MARKETS)}")
    if not MINUTES[0] <= minutes <= MINUTES[1]:
        raise UserError(f"--minutes {minutes}: allowed {MINUTES[0]} to {MINUTES[1]} "
                        "(the hard limit per instance, boot included)")
    name = name or profile.name
    if not NAME_PATTERN.match(name):
        raise UserError(f"--name {name!r}: lower-case letters, digits and hyphens, at most 40 characters "
                        "(it names the stack dl-bench-NAME)")
    if command is None:
        precision = precision or PROFILE_PRECISION.get(profile.precision)
        if precision is None:
            raise UserError(f"profile {profile.name} ranks on {profile.precision} throughput, which the reference "
                            "benchmark does not measure; pass --command with your own benchmark")
        command = reference_command(model, precision)
    elif not command.strip() or not command.isprintable():
        # A CR, tab or escape would reach the node's user data and the summary as something else.
        raise UserError(f"--command {clean(repr(command))[:80]}: must be one non-empty line of printable "
                        "characters, no line breaks or other control characters (a shell command that prints "
                        "dl-bench lines)")
    rec = recommend(profile, region=region, market=rank_market, families=families, catalog=catalog)
    if not rec.candidates:
        raise UserError(f"profile {profile.name} has no candidate in {region}: nothing to measure")
    reference = command.startswith("python3 -m dl_selector.bench.reference")
    chosen, skipped = _choose(rec, top, launch_market, reference, region)
    if not chosen:
        first = skipped[0]
        raise UserError(f"no candidate of profile {profile.name} can be benchmarked ({len(skipped)} tried): "
                        f"{first.instance_type}: {first.reason}")
    planned = tuple(_planned(c, launch_market, minutes, region) for c in chosen)
    names = {c.instance_type for c in chosen}
    passed = names | {s.instance_type for s in skipped}
    beyond = tuple(c.instance_type for c in rec.candidates
                   if c.instance_type not in passed and any(t in names for t in c.tied_with))
    total = round(sum(c.cost_usd for c in planned), 2)
    worst = round(sum(c.worst_cost_usd or 0.0 for c in planned), 2)
    if max_cost is not None and worst > max_cost:
        raise UserError(f"plan costs up to ${worst:,.2f} ({len(planned)} instances x {minutes} min"
                        f"{', spot capped at on-demand' if launch_market == 'spot' else ''}), above --max-cost "
                        f"${max_cost:,.2f}; lower --top or --minutes, or raise --max-cost")
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y-%m-%dT%H:%MZ")
    plan = Plan(name=name, profile=profile.name, region=region, market=launch_market, minutes=minutes,
                command=command, candidates=planned, total_cost_usd=total, max_cost_usd=max_cost,
                catalog_as_of=rec.catalog_as_of, created=stamp, rank_market=rank_market,
                worst_total_cost_usd=worst)
    return PlanResult(plan, tuple(skipped), beyond)


def _choose(rec: Recommendation, top: int, market: str, reference: bool, region: str):
    chosen, skipped = [], []
    for c in rec.candidates:
        if len(chosen) == top:
            break
        reason = _unplannable(c, market, reference, region)
        if reason:
            skipped.append(Skipped(c.instance_type, reason))
        else:
            chosen.append(c)
    return chosen, skipped


def _unplannable(c, market: str, reference: bool, region: str) -> str:
    f = c.facts
    if reference and f.sdk != "cuda":
        return (f"the reference benchmark is PyTorch on CUDA and {f.instance_type} runs the {f.sdk} SDK; "
                "pass --command with a benchmark for it")
    if c.price_per_hour is None:
        return f"no on-demand price on record in {region}: its cost cannot be bounded"
    if market == "spot" and c.spot_price_per_hour is None:
        return f"no spot price on record in {region} (not offered there as spot); plan with --on-demand"
    return ""


def _planned(c, market: str, minutes: int, region: str) -> PlannedCandidate:
    f = c.facts
    price = c.spot_price_per_hour if market == "spot" else c.price_per_hour
    cap = c.price_per_hour  # on spot: the request's maximum price
    source = f.price(region)
    label = f"{f.accelerator_fraction:g} of 1" if f.accelerator_fraction != 1 else str(f.accelerator_count)
    return PlannedCandidate(
        instance_type=f.instance_type, price_per_hour=price,
        price_source=(f"{market} {source.spot_source if market == 'spot' else source.source}, "
                      f"as of {source.spot_as_of if market == 'spot' else source.as_of}") if source else "",
        cost_usd=round(price * minutes / 60, 2), modelled_samples_per_second=c.samples_per_second,
        uncertainty=c.uncertainty, basis=c.throughput_basis, accelerators=f"{label} x {f.accelerator}",
        on_demand_per_hour=c.price_per_hour, spot_per_hour=c.spot_price_per_hour,
        max_price_per_hour=cap, worst_cost_usd=round(cap * minutes / 60, 2))


def plan_text(result: PlanResult, out: Optional[str]) -> str:
    p = result.plan
    rows = [("type", "accelerators", "model samples/s", f"$/h {p.market}", "cost", "at most")]
    for c in p.candidates:
        rows.append((c.instance_type, c.accelerators,
                     f"{c.modelled_samples_per_second:,.0f} ±{c.uncertainty:.0%}",
                     f"{c.price_per_hour:,.3f}", f"${c.cost_usd:,.2f}", f"${c.worst_cost_usd or 0:,.2f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [f"bench plan {p.name}: profile {p.profile}, {p.region}, {len(p.candidates)} instance(s) on {p.market} "
             f"for at most {p.minutes} min each; the report ranks on {p.rank_market} samples per dollar"]
    for i, r in enumerate(rows):
        lines.append("  ".join(v.ljust(w) if j < 2 else v.rjust(w) for j, (v, w) in enumerate(zip(r, widths))))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    cap = " (spot capped at the on-demand price)" if p.market == "spot" else ""
    lines.append(f"total: ${p.total_cost_usd:,.2f} at the prices on record (catalog {p.catalog_as_of}); "
                 f"at most ${p.worst_total_cost_usd or 0:,.2f}{cap}"
                 + (f"; budget --max-cost ${p.max_cost_usd:,.2f}" if p.max_cost_usd is not None else ""))
    lines.append(f"command: {p.command}")
    for s in result.skipped:
        lines.append(f"skipped {s.instance_type}: {s.reason}")
    if result.tied_beyond:
        lines.append(f"also tied with a planned candidate (raise --top to measure them): {', '.join(result.tied_beyond)}")
    if out:
        lines.append(f"written to {out}; next: cdk deploy -c bench={shlex.quote(out)}")
    return "\n".join(lines)
