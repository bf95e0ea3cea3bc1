"""Human tables and machine JSON for the CLI."""
from __future__ import annotations

import json
TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time (a cold CLI start, issue 39 item 7)
    from typing import Any, Optional

from . import freshness
from .catalog import Catalog
from .facts import InstanceFacts
from .profiles import Profile
from .ranking import unpriced_in
from .recommend import CAPACITY_BLOCK_ONLY, Candidate, Recommendation, price_summary
from .validate import clean


def _money(v: Optional[float]) -> str:
    return f"{v:,.2f}" if v is not None else "-"


def _num(v: Optional[float]) -> str:
    return sig(v) if v is not None else "-"


def sig(v: float) -> str:
    """A figure with its significant digits: whole numbers from 100 up (1,652,174), three significant
    digits below (2.1 samples/s shows as 2.1, not 2; 0.0371 as 0.0371)."""
    return f"{v:,.0f}" if abs(v) >= 100 or v == 0 else f"{v:.3g}"


def _price_cells(c: Candidate, market: str) -> list[str]:
    # "-" would read as a gap in our data; a Capacity-Block-only type has no such price at all.
    if c.facts.capacity_block_only and c.price_per_hour is None and c.spot_price_per_hour is None:
        cells = ["CB only", "CB only"]
    else:
        cells = [_money(c.price_per_hour), _money(c.spot_price_per_hour) + _spot_mark(c)]
    if market == "capacity-block":
        cells.append(_money(c.capacity_block_price_per_hour))
    return cells


def _spot_mark(c: Candidate) -> str:
    """'!' after a spot price from a single AZ: one AZ's quote is not a market price."""
    return "!" if c.spot_single_az else ""


def _samples(c: Candidate) -> str:
    return _num(c.samples_per_second) + (f" ±{c.uncertainty:.0%}" if c.uncertainty else "")


def table(headers: list[str], rows: list[list[str]]) -> str:
    # Escape first so that the widths are those of what the terminal shows.
    rows = [[clean(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()
    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def _tie_cell(c, ranks: dict[str, int]) -> str:
    """' (tie #2,#5)': with whom, by rank; partners beyond the rows shown are counted."""
    if not c.tied_with:
        return ""
    shown = sorted(ranks[n] for n in c.tied_with if n in ranks)
    beyond = len(c.tied_with) - len(shown)
    return " (tie " + ",".join([f"#{r}" for r in shown] + ([f"+{beyond}"] if beyond else [])) + ")"


def recommendation_text(rec: Recommendation, show_excluded: int = 10) -> str:
    p = rec.profile
    out = [f"profile {p.name}: {p.description}",
           f"region {rec.region}, {rec.market} prices, objective {p.objective}, "
           f"catalog as of {rec.catalog_as_of}", ""]
    rows = []
    ranks = {c.instance_type: c.rank for c in rec.candidates}
    unpriced = {c.instance_type for c in unpriced_in(rec.market, list(rec.candidates))}
    latency = p.objective == "min_latency"
    for c in rec.candidates:
        f = c.facts
        rows.append([
            str(c.rank), f.instance_type, f"{f.accelerator_count} x {f.accelerator}"
            + ("" if f.accelerator_fraction == 1 else f" ({f.accelerator_fraction:g})"),
            f"{f.accelerator_memory_gb:g} ({f.accelerator_memory_gib:g})", "yes" if f.efa else "no",
            f"{f.nvme.count}x{f.nvme.size_gb}" if f.nvme else "-", str(f.vcpus), f"{f.memory_gib:g}",
            *_price_cells(c, rec.market), _samples(c), _num(c.samples_per_dollar),
            _num(c.spot_samples_per_dollar),
            *([_num(c.per_dollar("capacity-block"))] if rec.market == "capacity-block" else []),
            *([_num(c.ms_per_token)] if latency else []),
            c.throughput_source + _tie_cell(c, ranks) + (f"; unpriced ({rec.market})" if f.instance_type in unpriced else ""),
        ])
    if rows:
        block = rec.market == "capacity-block"
        out.append(table(["#", "instance", "accelerators", "GB/acc (GiB)", "EFA", "NVMe (GB)", "vCPU", "RAM GiB",
                          "$/h", "spot $/h", *(["CB $/h"] if block else []), "samples/s", "samples/$",
                          "spot samples/$", *(["CB samples/$"] if block else []),
                          *(["ms/token"] if latency else []), "source"], rows))
        out.extend(_price_footer(rec))
        out.append("")
    out.append(f"why: {rec.why}")
    if rec.pick:
        for r in rec.pick.reasons:
            out.append(f"  - {r}")
    for n in rec.notes:
        out.append(f"note: {n}")
    if rec.excluded:
        out.append("")
        out.append(f"excluded ({len(rec.excluded)}; nearest misses first; --json lists every reason):")
        by_nearness = sorted(rec.excluded, key=lambda e: (any(r.startswith("retired") for r in e.reasons),
                                                          len(e.reasons), e.instance_type))
        for e in by_nearness[:show_excluded]:
            out.append(f"  {e.instance_type}: {'; '.join(e.reasons)}")
        if len(rec.excluded) > show_excluded:
            out.append(f"  ... and {len(rec.excluded) - show_excluded} more")
    return "\n".join(out)


def _price_footer(rec: Recommendation) -> list[str]:
    """Where the prices in the table come from and how old they are; '!' explained."""
    lines = []
    for s in price_summary(rec.candidates, rec.region):
        age = "date unknown" if s["age_days"] is None else f"{s['age_days']} days old"
        lines.append(f"prices: {s['kind']} as of {s['as_of']} ({age}), {s['types']} type(s): {s['source']}")
    if any(_spot_mark(c) for c in rec.candidates):
        lines.append("! spot price from a single AZ: not a market-wide figure")
    return lines


def profiles_json(profiles: dict[str, Profile]) -> list[dict[str, Any]]:
    from .record import asdict
    out = []
    for p in profiles.values():
        d = asdict(p)
        for k, v in d.items():
            if isinstance(v, tuple):
                d[k] = list(v)
        out.append(d)
    return out


def profiles_text(profiles: dict[str, Profile]) -> str:
    rows = [[p.name, p.objective, p.guide_pick or "-", p.description] for p in profiles.values()]
    return table(["profile", "objective", "guides' pick", "description"], rows)


def show_dict(f: InstanceFacts) -> dict[str, Any]:
    d = f.to_dict()
    d["accelerator_memory_total_gib"] = f.accelerator_memory_total_gib
    d["architecture"] = f.architecture
    d["nvme_disks"] = d["nvme"]
    d["processes_per_node"] = f.processes_per_node
    return d


def show_text(f: InstanceFacts, catalog: Catalog) -> str:
    lines = [f"{f.instance_type}" + ("  [RETIRED]" if f.retired else "")]
    if f.retired:
        lines.append(f"  retired by AWS; use instead: {', '.join(f.successors)}")
    frac = "" if f.accelerator_fraction == 1 else f" (a {f.accelerator_fraction:g} slice)"
    lines += [
        f"  accelerators   {f.accelerator_count} x {f.accelerator_vendor} {f.accelerator}{frac}, "
        f"{f.accelerator_memory_gib:g} GiB each, {f.accelerator_memory_total_gib:g} GiB total ({f.sdk})",
        f"  interconnect   {f.interconnect}; tensor cores {'yes' if f.tensor_cores else 'no'}",
        f"  precisions     {', '.join(f.precisions)}",
        f"  host           {f.vcpus} vCPU, {f.memory_gib:g} GiB RAM, {'/'.join(f.architectures)}",
        "  network        " + ("no Gbps figure published" if f.network_gbps is None else
                                ("up to " if f.network_burst else "") + f"{f.network_gbps:,g} Gbps"
                                + (" (burst over a lower baseline)" if f.network_burst else ""))
        + "".join(f"; {k} up to {v:,g} Gbps" for k, v in (("EFA", f.efa_gbps), ("ENA", f.ena_gbps)) if v is not None)
        + f"; {f.network_cards} network card(s), "
        + (f"EFA up to {f.max_efa_interfaces} interfaces" if f.efa else "no EFA")
        + (f"\n                 (network figures: {clean(f.network_source)})" if f.network_source else ""),
        "  instance store " + (f"{f.nvme.count} x {f.nvme.size_gb} GB NVMe" if f.nvme else "none (EBS only)"),
        f"  regions        {len(f.regions)}: {', '.join(f.regions)}",
        "  prices (USD/h):",
    ]
    for region, p in sorted(f.prices.items()):
        lines.append(f"    {region:15} on-demand {_money(p.on_demand):>8}  {freshness.describe(p.as_of)}; {p.source}"
                     + (f"; {p.note}" if p.note else ""))
        if p.spot is not None:
            from .recommend import spot_spread
            lines.append(f"    {'':15} spot      {_money(p.spot):>8}  {spot_spread(p)}; {freshness.describe(p.spot_date)}"
                         + (f"; {p.spot_source}" if p.spot_source else ""))
    for region, b in sorted(f.capacity_block_prices.items()):
        lines.append(f"    {region:15} Capacity Block {_money(b.usd_per_hour):>8}  {freshness.describe(b.as_of)}; {b.source}")
    if f.capacity_block_only:
        lines.append(f"    {CAPACITY_BLOCK_ONLY}")
        lines.append(f"    (source: {f.capacity_block_source})")
    elif not f.prices:
        lines.append("    none on record")
    lines.append(f"  specs from     {f.specs_source}")
    lines.append(f"  catalog as of  {catalog.as_of}")
    return "\n".join(lines)


def dumps(obj: Any) -> str:
    # allow_nan=False: --json is strict JSON; a NaN here is a bug upstream, never valid output.
    return json.dumps(obj, indent=2, allow_nan=False)
