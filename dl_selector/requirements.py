"""Hard requirements as small pure rules, cdk-nag style: rule(facts, profile, ctx) -> reason or None.

A type that fails any rule is excluded and keeps every reason it failed, so that "why not
p5.48xlarge?" always has an answer.
"""
from __future__ import annotations

import re
TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time (a cold CLI start, issue 39 item 7)
    from typing import Callable, Optional
    from .model_memory import ModelMemory

from .accelerators import AcceleratorSpec, spec_for
from .facts import InstanceFacts
from .profiles import Profile
from .record import record


@record(frozen=True)
class Filters:
    """Ad-hoc narrowing on top of a profile (recommend --gpu, --min-gpu-memory, --max-price):
    accelerator (a catalog accelerator name, matched exactly: see parse_gpu), count (accelerators
    per node), min_memory_gb (per accelerator, in the vendor's GB: InstanceFacts.accelerator_memory_gb),
    max_price (USD per node-hour in the ranked market), model (recommend --model-size: the memory the
    node's accelerators must hold together, model_memory.py)."""
    accelerator: Optional[str] = None
    count: Optional[int] = None
    min_memory_gb: float = 0.0
    max_price: Optional[float] = None
    model: Optional[ModelMemory] = None

    def describe(self) -> str:
        parts = []
        if self.accelerator:
            parts.append(f"--gpu {self.accelerator}" + (f":{self.count}" if self.count else ""))
        if self.min_memory_gb:
            parts.append(f"--min-gpu-memory {self.min_memory_gb:g}")
        if self.max_price is not None:
            parts.append(f"--max-price {self.max_price:g}")
        if self.model is not None:
            parts.append(f"--model-size {self.model.size_text} --task {self.model.task} --precision {self.model.precision}")
        return " ".join(parts)


@record(frozen=True)
class Context:
    region: str
    spot: bool
    named_families: frozenset[str]
    accelerators: dict[str, AcceleratorSpec]
    market: str = ""  # one of dl_core.markets.MARKETS; "" = from `spot`
    filters: Optional[Filters] = None

    def __post_init__(self) -> None:
        if not self.market:
            object.__setattr__(self, "market", "spot" if self.spot else "on-demand")


if TYPE_CHECKING:
    Rule = Callable[[InstanceFacts, Profile, Context], Optional[str]]


def retired(f: InstanceFacts, p: Profile, c: Context) -> Optional[str]:
    if f.retired and f.family not in c.named_families:
        return f"retired by AWS; successors: {', '.join(f.successors)} (name --families {f.family} to rank it anyway)"
    return None


def offered_in_region(f: InstanceFacts, p: Profile, c: Context) -> Optional[str]:
    return None if c.region in f.regions else f"not offered in {c.region}"


def sold_in_market(f: InstanceFacts, p: Profile, c: Context) -> Optional[str]:
    """Rank a type only on a price it is actually sold at: a Capacity-Block-only type has no
    on-demand or spot price to compare, and a type AWS does not reserve as blocks has no block rate."""
    if c.market == "capacity-block":
        return None if f.capacity_block_source else "not sold as Capacity Blocks for ML"
    if f.capacity_block_only:  # the API record may still list spot as a usage class
        return (f"not sold as {c.market}: sold only as Capacity Blocks for ML "
                "(rank it with --capacity-block; launch it with -c market=capacity-block)")
    if c.market == "spot" and not f.spot_supported:
        return "not sold as spot"
    return None


def sdk(f: InstanceFacts, p: Profile, c: Context) -> Optional[str]:
    if p.sdks and f.sdk not in p.sdks:
        return f"{f.accelerator} needs the {f.sdk} stack; profile allows {', '.join(p.sdks)}"
    return None


def role(f: InstanceFacts, p: Profile, c: Context) -> Optional[str]:
    if not p.roles:
        return None
    spec = c.accelerators.get(f.accelerator)
    roles = spec.roles if spec else ()
    missing = [r for r in p.roles if r not in roles]
    return f"{f.accelerator} is not built for {', '.join(missing)}" if missing else None


def accelerator_count(f: InstanceFacts, p: Profile, c: Context) -> Optional[str]:
    n = f.accelerator_count
    if n < p.min_accelerators:
        return f"{n} accelerator(s) < {p.min_accelerators} required"
    if p.max_accelerators is not None and n > p.max_accelerators:
        return f"{n} accelerators > {p.max_accelerators} wanted"
    return None


def whole_accelerators(f: InstanceFacts, p: Profile, c: Context) -> Optional[str]:
    if p.whole_accelerators and f.accelerator_fraction < 1:
        return f"only {f.accelerator_fraction:g} of a {f.accelerator} (fractional GPU)"
    return None


def accelerator_memory(f: InstanceFacts, p: Profile, c: Context) -> Optional[str]:
    if f.accelerator_memory_gib < p.min_accelerator_memory_gib:
        return f"{f.accelerator_memory_gib:g} GiB per accelerator < {p.min_accelerator_memory_gib:g} GiB required"
    return None


def accelerator_speed(f: InstanceFacts, p: Profile, c: Context) -> Optional[str]:
    # The row the throughput model uses: a memory variant (p4de's 80 GB A100) where the table has one.
    spec = spec_for(f, c.accelerators) if f.accelerator in c.accelerators else None
    rel = spec.relative_training_throughput if spec else 0.0
    if rel * f.accelerator_fraction < p.min_relative_throughput:
        return f"{f.accelerator} trains at {rel * f.accelerator_fraction:.2f}x a V100 < {p.min_relative_throughput:g}x required"
    return None


def precisions(f: InstanceFacts, p: Profile, c: Context) -> Optional[str]:
    if p.precisions:
        missing = [x for x in p.precisions if x not in f.precisions]
        if missing:
            return f"{f.accelerator} lacks {', '.join(missing)}"
    if p.any_precision and not any(x in f.precisions for x in p.any_precision):
        return f"{f.accelerator} has none of {', '.join(p.any_precision)}"
    return None


def tensor_cores(f: InstanceFacts, p: Profile, c: Context) -> Optional[str]:
    return f"{f.accelerator} has no tensor cores" if p.tensor_cores and not f.tensor_cores else None


def interconnect(f: InstanceFacts, p: Profile, c: Context) -> Optional[str]:
    if p.interconnect == "nvlink":
        spec = c.accelerators.get(f.accelerator)
        if f.accelerator_count < 2:
            return "single accelerator: nothing to link over NVLink"
        if spec is None or not spec.nvlink:
            return f"no NVLink between accelerators ({f.interconnect})"
    return None


def multi_node(f: InstanceFacts, p: Profile, c: Context) -> Optional[str]:
    if not p.multi_node:
        return None
    if not f.efa:
        return "no EFA: multi-node collectives would run over TCP"
    if not f.cluster_placement:
        return "no cluster placement group support"
    return None


def architecture(f: InstanceFacts, p: Profile, c: Context) -> Optional[str]:
    if p.architectures and not set(f.architectures) & set(p.architectures):
        return f"{'/'.join(f.architectures)} host; profile wants {', '.join(p.architectures)}"
    return None


def _market_price(f: InstanceFacts, c: Context) -> Optional[float]:
    if c.market == "capacity-block":
        block = f.capacity_block_prices.get(c.region)
        return block.usd_per_hour if block else None
    price = f.price(c.region)
    if price is None:
        return None
    return price.spot if c.market == "spot" else price.on_demand


def adhoc_filters(f: InstanceFacts, p: Profile, c: Context) -> Optional[str]:
    flt = c.filters
    if flt is None:
        return None
    if flt.accelerator and f.accelerator != flt.accelerator:
        return f"{f.accelerator}, not {flt.accelerator} ({flt.describe()})"
    if flt.count and f.accelerator_count != flt.count:
        return f"{f.accelerator_count} x {f.accelerator}, not {flt.count} ({flt.describe()})"
    if flt.min_memory_gb and f.accelerator_memory_gb < flt.min_memory_gb:
        return (f"{f.accelerator_memory_gb:g} GB ({f.accelerator_memory_gib:g} GiB) per accelerator, below "
                f"--min-gpu-memory {flt.min_memory_gb:g} GB")
    if flt.model is not None:
        from .model_fit import model_fits  # only with --model-size
        reason = model_fits(f, p, flt.model)
        if reason:
            return reason
    if flt.max_price is not None:
        price = _market_price(f, c)
        if price is None:
            return f"no {c.market} price on record in {c.region} to hold to --max-price {flt.max_price:g}"
        if price > flt.max_price:
            return f"${price:.2f}/h {c.market}, above --max-price ${flt.max_price:.2f}/h"
    return None


RULES: tuple[Rule, ...] = (
    retired, offered_in_region, sold_in_market, sdk, role, accelerator_count, whole_accelerators,
    accelerator_memory, accelerator_speed, precisions, tensor_cores, interconnect, multi_node, architecture,
    adhoc_filters,
)


# Rules that can fail only when the profile or the context asks for something: skipped for a
# ranking that does not (a plain loop over every type on every recommendation is the hot path).
_ASKED_FOR: dict[Rule, Callable[[Profile, Context], bool]] = {
    sdk: lambda p, c: bool(p.sdks),
    role: lambda p, c: bool(p.roles),
    accelerator_count: lambda p, c: p.min_accelerators > 1 or p.max_accelerators is not None,
    whole_accelerators: lambda p, c: p.whole_accelerators,
    accelerator_memory: lambda p, c: p.min_accelerator_memory_gib > 0,
    accelerator_speed: lambda p, c: p.min_relative_throughput > 0,
    precisions: lambda p, c: bool(p.precisions or p.any_precision),
    tensor_cores: lambda p, c: p.tensor_cores,
    interconnect: lambda p, c: p.interconnect == "nvlink",
    multi_node: lambda p, c: p.multi_node,
    architecture: lambda p, c: bool(p.architectures),
    adhoc_filters: lambda p, c: c.filters is not None,
}


def rules_for(p: Profile, c: Context) -> tuple[Rule, ...]:
    """The rules that can fail for this profile and context, in RULES' order."""
    return tuple(r for r in RULES if r not in _ASKED_FOR or _ASKED_FOR[r](p, c))


def fails(f: InstanceFacts, p: Profile, c: Context, rules: tuple[Rule, ...] = RULES) -> bool:
    """Whether any of `rules` fails: stops at the first (ranking needs no more; the reasons are
    written when someone reads them, with failures())."""
    for rule in rules:
        if rule(f, p, c):
            return True
    return False


def failures(f: InstanceFacts, p: Profile, c: Context) -> list[str]:
    out = []
    for rule in RULES:  # a plain loop: this runs for every type on every recommendation
        reason = rule(f, p, c)
        if reason:
            out.append(reason)
    return out


# SkyPilot names (its AWS catalog, sky/catalog/data_fetchers/fetch_aws.py, and `sky show-gpus`) that are
# not EC2's: a memory suffix (A100-80GB is p4de's A100, V100-32GB p3dn's V100) and one other cloud's
# name for a GPU AWS sells under its own: H100-MEGA is GCP's a3-megagpu H100 SXM, EC2's H100.
_MEMORY_SUFFIX = r"(?i)^(.*?)[-_ ]?(\d+)\s*GB$"  # compiled on first use (re caches it): a cold start
SKYPILOT_ALIASES = {"h100mega": "H100"}


def parse_gpu(text: str, known: "set[str] | frozenset[str]",
              variants: "tuple[str, ...]" = ()) -> tuple[str, Optional[int], float]:
    """SkyPilot's accelerator syntax, MODEL[:COUNT] (`H100:8`, `A10G`, `trainium2:16`, `A100-80GB:8`):
    the model matched to one of `known` (the catalog's accelerator names) ignoring case, spaces and
    dashes, as SkyPilot users type them. Returns (model, count or None, the memory in GB a suffix
    such as -80GB asks for, else 0); UserError (one line, the closest model, among `known` and the
    SkyPilot-style `variants` such as A100-80GB: memory_variants) otherwise."""
    from .errors import UserError, closest
    from .validate import clean, finite_number

    model, sep, count_text = text.strip().partition(":")
    key = lambda s: "".join(ch for ch in s.lower() if ch.isalnum())  # noqa: E731
    by_key = {key(k): k for k in known}
    memory = 0.0
    name = by_key.get(key(model)) or (SKYPILOT_ALIASES[key(model)] if key(model) in SKYPILOT_ALIASES else None)
    suffix = re.match(_MEMORY_SUFFIX, model.strip())
    if name is None and suffix and key(suffix.group(1)) in by_key:
        name, memory = by_key[key(suffix.group(1))], float(suffix.group(2))
    if not model.strip() or name is None or name not in known:
        spelled = {**by_key, **{key(v): v for v in (*variants, *SKYPILOT_ALIASES.values())}, "h100mega": "H100-MEGA"}
        near = closest(key(model), list(spelled), n=1) if key(model) else []
        raise UserError(f"--gpu {clean(repr(text))[:60]}: unknown accelerator model"
                        + (f"; closest: {spelled[near[0]]}" if near else "")
                        + f"; allowed: {', '.join(sorted(known))} (MODEL or MODEL:COUNT; a -NNGB suffix "
                          "asks for that much memory, as SkyPilot's A100-80GB)")
    count = None
    if sep:
        count = int(finite_number(count_text, f"--gpu {clean(model)}:COUNT", 1, 1024, integer=True))
    return name, count, memory


def memory_variants(catalog) -> tuple[str, ...]:
    """SkyPilot-style names for the catalog's models that come in more than one memory size
    (A100-40GB, A100-80GB, V100-16GB, V100-32GB): what a near miss of one is suggested as."""
    sizes: dict[str, set[float]] = {}
    for f in catalog:
        if f.accelerator_fraction == 1:
            sizes.setdefault(f.accelerator, set()).add(f.accelerator_memory_gb)
    return tuple(sorted(f"{name}-{gb:g}GB" for name, gbs in sizes.items() if len(gbs) > 1 for gb in gbs))
