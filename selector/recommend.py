"""recommend(profile) -> Recommendation: filter by hard requirements, estimate, rank, explain."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from .accelerators import AcceleratorSpec, load_accelerators
from .catalog import Catalog, load_catalog
from .facts import InstanceFacts
from .profiles import Profile, get_profile
from .requirements import Context, failures
from .throughput import Estimate, Measurement, model

DEFAULT_REGION = "us-east-1"
# What to say instead of "no price on record" for a type AWS sells only as Capacity Blocks.
CAPACITY_BLOCK_ONLY = ("sold only as Capacity Blocks for ML (no on-demand or spot price): reserve one and pass "
                       "-c capacity_reservation=cr-... -c market=capacity-block")


@dataclass(frozen=True)
class Candidate:
    facts: InstanceFacts
    rank: int
    price_per_hour: Optional[float]
    spot_price_per_hour: Optional[float]
    samples_per_second: float
    throughput_source: str
    # What the reasons are made of; the sentences are written only when someone reads them
    # (a --top 5 table reads five), which keeps ranking the whole catalog cheap.
    _explanation: str = field(repr=False, default="")
    _region: str = field(repr=False, default="")
    _measured: Optional[Measurement] = field(repr=False, default=None)

    @property
    def reasons(self) -> tuple[str, ...]:
        facts, region, m = self.facts, self._region, self._measured
        price = facts.price(region)
        out = [_meets(facts), self._explanation]
        if price:
            out.append(f"{_fmt_price(price.on_demand)} on-demand, {_fmt_price(price.spot)} spot in {region} "
                       f"(as of {price.as_of}; {price.source})")
        elif facts.capacity_block_only:
            out.append(CAPACITY_BLOCK_ONLY + " (ranked after priced types on cost objectives)")
        else:
            out.append(f"no price on record for {region}: ranked after priced types on cost objectives")
        if m and (m.price_per_hour or m.spot_price_per_hour):
            out.append(f"prices from {m.source}")
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

    def hourly(self, spot: bool) -> Optional[float]:
        """The price the ranking uses: spot or on-demand."""
        return self.spot_price_per_hour if spot else self.price_per_hour

    def per_dollar(self, spot: bool) -> Optional[float]:
        return self.spot_samples_per_dollar if spot else self.samples_per_dollar

    def to_dict(self) -> dict[str, Any]:
        f = self.facts
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
            "nvme_disks": {"count": f.nvme.count, "size_gb": f.nvme.size_gb} if f.nvme else None,
            "vcpus": f.vcpus,
            "memory_gib": f.memory_gib,
            "architecture": f.architecture,
            "price_per_hour": self.price_per_hour,
            "spot_price_per_hour": self.spot_price_per_hour,
            "samples_per_second": self.samples_per_second,
            "samples_per_dollar": _round(self.samples_per_dollar),
            "spot_samples_per_dollar": _round(self.spot_samples_per_dollar),
            "throughput_source": self.throughput_source,
            "reasons": list(self.reasons),
        }


@dataclass(frozen=True)
class Excluded:
    instance_type: str
    reasons: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"instance_type": self.instance_type, "reasons": list(self.reasons)}


@dataclass(frozen=True)
class Recommendation:
    profile: Profile
    region: str
    spot: bool
    catalog_as_of: str
    candidates: tuple[Candidate, ...]
    excluded: tuple[Excluded, ...]
    why: str
    notes: tuple[str, ...] = field(default=())

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
            "objective": self.profile.objective,
            "catalog_as_of": self.catalog_as_of,
            "why": self.why,
            "candidates": [c.to_dict() for c in self.candidates],
            "excluded": [e.to_dict() for e in self.excluded],
            "notes": list(self.notes),
        }


def _per_dollar(sps: float, price: Optional[float]) -> Optional[float]:
    # samples per dollar = samples per second x 3600 / price per hour
    return sps * 3600 / price if price else None


def _round(x: Optional[float]) -> Optional[float]:
    return round(x, 1) if x is not None else None


_MISSING = float("inf")


def _sort_key(objective: str, spot: bool):
    def price(c: Candidate) -> float:
        p = c.hourly(spot)
        return p if p is not None else _MISSING

    def per_dollar(c: Candidate) -> float:
        v = c.per_dollar(spot)
        return -v if v is not None else _MISSING

    keys = {
        "max_throughput": lambda c: (-c.samples_per_second, price(c), c.instance_type),
        "max_samples_per_dollar": lambda c: (per_dollar(c), -c.samples_per_second, c.instance_type),
        "min_price": lambda c: (price(c), -c.samples_per_second, c.instance_type),
        "max_accelerator_memory": lambda c: (-c.facts.accelerator_memory_total_gib, -c.samples_per_second, price(c), c.instance_type),
    }
    return keys[objective]


def _estimate(facts: InstanceFacts, profile: Profile, accelerators: dict[str, AcceleratorSpec],
              measured: dict[str, Measurement]) -> Estimate:
    m = measured.get(facts.instance_type)
    if m is not None:
        return Estimate(m.samples_per_second, "measured", f"measured: {m.samples_per_second:g} samples/s ({m.source})")
    return model(facts, profile, accelerators)


def _fmt_price(v: Optional[float]) -> str:
    return f"${v:,.2f}/h" if v is not None else "no price"


def _why(profile: Profile, ranked: list[Candidate], spot: bool, region: str) -> str:
    if not ranked:
        return f"no instance type meets every hard requirement of {profile.name} in {region}"
    top = ranked[0]
    kind = "spot" if spot else "on-demand"
    if len(ranked) == 1:
        return f"{top.instance_type} is the only type that meets every hard requirement"
    second = ranked[1]
    o = profile.objective
    if o == "max_throughput":
        if top.samples_per_second == second.samples_per_second:
            a, b = top.hourly(spot), second.hourly(spot)
            return (f"{top.instance_type} ties with {second.instance_type} on throughput "
                    f"({top.samples_per_second:,.0f} samples/s) and is cheaper ({kind}): {_fmt_price(a)} vs {_fmt_price(b)}")
        return (f"{top.instance_type} wins on throughput: {top.samples_per_second:,.0f} samples/s "
                f"vs {second.samples_per_second:,.0f} for {second.instance_type}")
    if o == "max_samples_per_dollar":
        a, b = top.per_dollar(spot), second.per_dollar(spot)
        return (f"{top.instance_type} wins on {kind} samples per dollar: {a or 0:,.0f} vs "
                f"{b or 0:,.0f} for {second.instance_type}")
    if o == "min_price":
        a, b = top.hourly(spot), second.hourly(spot)
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
) -> Recommendation:
    """Rank every type in the catalog for `profile` in `region`.

    families: restrict the catalog to these families; naming a retired family makes it eligible.
    measured: per-type measured samples/s (and optional prices) that replace the model.
    """
    if isinstance(profile, str):
        profile = get_profile(profile)
    catalog = catalog if catalog is not None else load_catalog()
    accelerators = accelerators if accelerators is not None else load_accelerators()
    measured = measured or {}
    catalog.check_region(region)
    named: frozenset[str] = frozenset()
    if families:
        families = [f for f in families if f.strip()]
        catalog = catalog.only_families(families)
        named = frozenset(f.strip() for f in families)
    ctx = Context(region=region, spot=spot, named_families=named, accelerators=accelerators)

    survivors: list[Candidate] = []
    excluded: list[Excluded] = []
    for facts in catalog:
        failed = failures(facts, profile, ctx)
        if failed:
            excluded.append(Excluded(facts.instance_type, tuple(failed)))
            continue
        est = _estimate(facts, profile, accelerators, measured)
        price = facts.price(region)
        m = measured.get(facts.instance_type)
        od = m.price_per_hour if m and m.price_per_hour else (price.on_demand if price else None)
        sp = m.spot_price_per_hour if m and m.spot_price_per_hour else (price.spot if price else None)
        survivors.append(Candidate(facts, 0, od, sp, est.samples_per_second, est.source, est.explanation, region, m))

    survivors.sort(key=_sort_key(profile.objective, spot))
    ranked = survivors
    for i, c in enumerate(ranked, start=1):
        object.__setattr__(c, "rank", i)  # set once, before anyone else sees the candidate
    why = _why(profile, ranked, spot, region)
    notes = []
    if any(c.throughput_source == "model" for c in ranked):
        notes.append("model figures are estimates: measure your own job and pass --throughput FILE")
    if top is not None:
        ranked = ranked[:top]
    excluded.sort(key=lambda e: e.instance_type)
    return Recommendation(profile, region, spot, catalog.as_of, tuple(ranked), tuple(excluded), why, tuple(notes))


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
