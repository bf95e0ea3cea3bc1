"""Build dl_selector/data/prices.csv from its two published sources, and render prices.md from it.

Sources (their formats, not their contents, are what this module knows):
  * on-demand: tsaol/aws-gpu data/all_gpu_instances.js, a JavaScript file generated from
    instances.vantage.sh: `const allGPUInstances = [ {...}, ... ];`, one JSON object per type with
    `apiName` (or `name`) and `pricing: {region: {onDemand: USD/h, ...}}`;
  * spot: skypilot-org/skypilot-catalog catalogs/v8/aws/vms.csv, one row per availability zone:
    InstanceType, ..., Price (on-demand), SpotPrice, Region, AvailabilityZone (an AZ ID), Arch.

The spot figure of a (type, region) is the median of the quotes of the region's availability
zones. Local Zone and Wavelength Zone quotes are left out (a Local Zone is a different market,
in another city); AZs quoting spot equal to on-demand are kept (AWS caps spot at on-demand, so
that quote is real: no discount there). Quotes that dl_selector.prices.implausible refuses, or above
their own row's on-demand price, are rejected and listed.

Used by scripts/build_prices.py; prices.md and prices_sources.toml are prices_page.py. Standard
library only.
"""
from __future__ import annotations

import csv
import io
import json
import re
import statistics
from dataclasses import dataclass, field
from typing import Iterable, Optional

from .errors import UserError
from .prices import implausible, spot_spread

# Every AWS region in which the two sources price a catalog type (scripts/build_prices.py refuses a
# source that prices one in a region missing here, so none is dropped unseen). A Local Zone or
# Wavelength Zone is not a region: the on-demand file keys them like one (us-east-1-atl-1,
# us-west-2-wl1-lax1), and they are left out as on the spot side (is_regular_az).
REGIONS = (
    "af-south-1", "ap-east-1", "ap-northeast-1", "ap-northeast-2", "ap-northeast-3", "ap-south-1", "ap-south-2",
    "ap-southeast-1", "ap-southeast-2", "ap-southeast-3", "ap-southeast-4", "ap-southeast-5", "ca-central-1",
    "eu-central-1", "eu-central-2", "eu-north-1", "eu-south-1", "eu-south-2", "eu-west-1", "eu-west-2", "eu-west-3",
    "il-central-1", "me-central-1", "me-south-1", "sa-east-1", "us-east-1", "us-east-2", "us-gov-east-1",
    "us-gov-west-1", "us-west-1", "us-west-2",
)
# A region code (us-east-1, us-gov-west-1), as opposed to a Local Zone or Wavelength Zone key.
_REGION = re.compile(r"^[a-z]{2}(?:-gov)?-[a-z]+-[0-9]+\Z")

CSV_COLUMNS = ("instance_type", "region", "on_demand_usd_per_hour", "spot_usd_per_hour", "spot_min", "spot_max",
               "spot_azs", "as_of", "spot_as_of", "source", "spot_source", "note")

SPOT_COLUMNS = ("InstanceType", "Price", "SpotPrice", "Region", "AvailabilityZone")

# The P4/P5 on-demand cut AWS announced in June 2025 ("up to 45%"); a reader comparing with older
# figures needs to know which side of it a price is.
PRICE_CUT_FAMILIES = ("p4d", "p4de", "p5", "p5e", "p5en")
PRICE_CUT_NOTE = "after 2025-06 P4/P5 price cut"

# A regular availability zone: its ID is <region code>-az<n> (use1-az4) or its name is the region
# plus one letter (us-east-1a). Anything else in a region is a Local Zone (usw2-lax1-az1,
# us-west-2-lax-1a) or a Wavelength Zone (usw2-wl1-sfo-wlz1, us-east-1-wl1-bos-wlz-1).
_AZ_ID = re.compile(r"^[a-z]+[0-9]+-az[0-9]+\Z")
_AZ_NAME = re.compile(r"^(?P<region>[a-z]{2}(?:-gov)?-[a-z]+-[0-9]+)[a-z]\Z")

# vms.csv quotes SpotPrice to 4 decimals (written with 6: 10.337900) while Price keeps 5
# (10.33786), so a quote AWS capped at on-demand can read up to half a step above or below it.
# Within one step of the row's on-demand price a quote counts as "at on-demand"; only beyond it
# is it "above on-demand".
QUOTE_STEP = 0.0001


def is_regular_az(az: str, region: str) -> bool:
    """True for a region's own availability zones, False for Local Zones and Wavelength Zones."""
    az = az.strip()
    if _AZ_ID.match(az):
        return True
    m = _AZ_NAME.match(az)
    return bool(m) and m.group("region") == region


def is_region(name: str) -> bool:
    """True for a region code, False for a Local Zone or Wavelength Zone key (us-east-1-atl-1)."""
    return bool(_REGION.match(name.strip()))


def unlisted_regions(od: OnDemandSource, quotes: Iterable[Quote], types: Iterable[str],
                     regions: Iterable[str] = REGIONS) -> list[str]:
    """Regions (not Local/Wavelength Zones) in which either source prices one of `types` but which
    `regions` lacks: a build would drop them silently."""
    types, regions = set(types), set(regions)
    found = {r for t, r in od.prices if t in types} | {q.region for q in quotes if q.instance_type in types}
    return sorted(r for r in found if is_region(r) and r not in regions)


def money(x: float) -> str:
    """A price as written to prices.csv: at most 6 decimals, shortest form (0.5, 1.3211)."""
    return repr(round(float(x), 6))


# ---------------------------------------------------------------------------------------------
# on-demand: all_gpu_instances.js


@dataclass(frozen=True)
class OnDemandSource:
    prices: dict[tuple[str, str], float]  # (type, region) -> USD/h, every region the file prices
    last_updated: str  # the file's "// Last updated: YYYY-MM-DD" header, "" if absent
    declared_total: Optional[int]  # its "// Total GPU instances: N" header
    entries: int  # objects in the array
    rejected: tuple[tuple[str, str, str], ...]  # (type, region, reason) of refused figures


def parse_on_demand_js(text: str, path: str = "on-demand file") -> OnDemandSource:
    """Parse all_gpu_instances.js. The array is JSON (quoted keys, no trailing commas); it is
    located as the text between the first `[` after the `=` of the first `const/let/var`
    declaration and the last `]` before the closing `;`."""
    decl = re.search(r"^\s*(?:const|let|var)\s+[A-Za-z_$][\w$]*\s*=\s*\[", text, re.M)
    if not decl:
        raise UserError(f"{path}: no `const NAME = [` array declaration; is it all_gpu_instances.js?")
    start = decl.end() - 1
    end = text.rfind("]")
    if end < start:
        raise UserError(f"{path}: the array opened at offset {start} is never closed")
    try:
        entries = json.loads(text[start:end + 1])
    except json.JSONDecodeError as e:
        line = text.count("\n", 0, start) + e.lineno
        raise UserError(f"{path}: the instance array is not JSON (line {line}: {e.msg})") from None
    if not isinstance(entries, list):
        raise UserError(f"{path}: expected an array of instance objects")
    updated = re.search(r"^//\s*Last updated:\s*(\d{4}-\d{2}-\d{2})", text, re.M)
    total = re.search(r"^//\s*Total GPU instances:\s*(\d+)", text, re.M)
    prices: dict[tuple[str, str], float] = {}
    rejected: list[tuple[str, str, str]] = []
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            raise UserError(f"{path}: array item {i} is not an object")
        name = e.get("apiName") or e.get("name")
        pricing = e.get("pricing") or {}
        if not isinstance(name, str) or not isinstance(pricing, dict):
            raise UserError(f"{path}: array item {i} has no apiName/name or a pricing that is not an object")
        for region, p in pricing.items():
            od = p.get("onDemand") if isinstance(p, dict) else None
            if od is None:
                continue
            if not isinstance(od, (int, float)) or isinstance(od, bool):
                rejected.append((name, region, f"on-demand {od!r} is not a number"))
                continue
            why = implausible(float(od), kind="on-demand")
            if why:
                rejected.append((name, region, why))
                continue
            if (name, region) in prices and prices[name, region] != od:
                raise UserError(f"{path}: {name} in {region} priced twice ({prices[name, region]} and {od})")
            prices[name, region] = float(od)
    return OnDemandSource(prices, updated.group(1) if updated else "",
                          int(total.group(1)) if total else None, len(entries), tuple(sorted(rejected)))


# ---------------------------------------------------------------------------------------------
# spot: skypilot-catalog vms.csv


@dataclass(frozen=True)
class Quote:
    instance_type: str
    region: str
    az: str
    on_demand: Optional[float]  # the row's own Price column
    spot: Optional[float]  # None where the row has no SpotPrice


@dataclass(frozen=True)
class SpotStats:
    median: float
    low: float
    high: float
    azs: int
    at_on_demand: int  # AZs whose quote equals the row's on-demand price (kept)


@dataclass
class SpotSource:
    stats: dict[tuple[str, str], SpotStats] = field(default_factory=dict)
    rows: int = 0  # data rows of the wanted types in the wanted regions
    no_quote: int = 0  # of those, rows with an empty SpotPrice
    zones_excluded: dict[str, int] = field(default_factory=dict)  # Local/Wavelength zone ID -> quotes left out
    rejected: list[tuple[str, str, str, str, str]] = field(default_factory=list)  # type, region, az, price, reason


def _number(value: str) -> Optional[float]:
    value = (value or "").strip()
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        return float("nan")  # implausible() names it


def read_spot_quotes(text: str, path: str = "spot file") -> list[Quote]:
    reader = csv.DictReader(io.StringIO(text, newline=""))
    missing = [c for c in SPOT_COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise UserError(f"{path}: needs the vms.csv columns {', '.join(SPOT_COLUMNS)}; missing {', '.join(missing)}")
    quotes = []
    for row in reader:
        if None in row or any(row[c] is None for c in SPOT_COLUMNS):
            raise UserError(f"{path} line {reader.line_num}: the row does not have the header's cells")
        quotes.append(Quote(row["InstanceType"].strip(), row["Region"].strip(), row["AvailabilityZone"].strip(),
                            _number(row["Price"]), _number(row["SpotPrice"])))
    return quotes


def spot_stats(quotes: Iterable[Quote], types: Iterable[str], regions: Iterable[str] = REGIONS,
               on_demand: Optional[dict[tuple[str, str], float]] = None) -> SpotSource:
    """Median, min, max and AZ count of the plausible regular-AZ quotes per (type, region).

    `on_demand` (from the on-demand source) is the reference for the plausibility check where a
    row has no usable Price of its own."""
    types, regions = set(types), set(regions)
    on_demand = on_demand or {}
    out = SpotSource()
    kept: dict[tuple[str, str], list[tuple[float, bool]]] = {}
    seen: set[tuple[str, str, str]] = set()
    for q in quotes:
        if q.instance_type not in types or q.region not in regions:
            continue
        out.rows += 1
        key = (q.instance_type, q.region, q.az)
        if key in seen:
            raise UserError(f"spot file: {q.instance_type} in {q.az} ({q.region}) is quoted twice")
        seen.add(key)
        if not is_regular_az(q.az, q.region):
            out.zones_excluded[q.az] = out.zones_excluded.get(q.az, 0) + 1
            continue
        if q.spot is None:
            out.no_quote += 1
            continue
        row_od = q.on_demand if q.on_demand is not None and implausible(q.on_demand, kind="on-demand") is None else None
        reference = row_od or on_demand.get((q.instance_type, q.region))
        why = implausible(q.spot, reference)
        if not why and row_od is not None and q.spot > row_od + QUOTE_STEP:
            why = f"spot price {q.spot:g} is above the row's on-demand {row_od:g}; AWS caps spot at on-demand"
        if why:
            out.rejected.append((q.instance_type, q.region, q.az, f"{q.spot:g}", why))
            continue
        at_od = row_od is not None and abs(q.spot - row_od) <= QUOTE_STEP
        kept.setdefault((q.instance_type, q.region), []).append((q.spot, at_od))
    for key, got in kept.items():
        out.stats[key] = SpotStats(*spot_spread(v for v, _ in got), sum(1 for _, a in got if a))
    out.rejected.sort()
    return out


# ---------------------------------------------------------------------------------------------
# prices.csv rows


def build_rows(od: OnDemandSource, spot: SpotSource, types: Iterable[str], retired: Iterable[str],
               on_demand_ref: str, spot_ref: str, as_of: str, spot_as_of: str,
               regions: Iterable[str] = REGIONS) -> tuple[list[dict[str, str]], list[tuple[str, str, str, int]]]:
    """prices.csv rows (a row wherever the on-demand source prices a type in a region) and the
    spot figures that had no on-demand price to go with them (left out, listed in prices.md)."""
    retired = set(retired)
    rows, orphans = [], []
    for name in sorted(set(types)):
        family = name.split(".")[0]
        for region in sorted(regions):
            price = od.prices.get((name, region))
            s = spot.stats.get((name, region))
            if price is None:
                if s:
                    orphans.append((name, region, money(s.median), s.azs))
                continue
            notes = []
            if family in PRICE_CUT_FAMILIES:
                notes.append(PRICE_CUT_NOTE)
            if family in retired:
                notes.append("retired type, last published price")
            if s is None:
                notes.append("no spot quote in the snapshot")
            elif s.azs == 1:
                notes.append("spot from 1 AZ")
            rows.append({
                "instance_type": name, "region": region, "on_demand_usd_per_hour": money(price),
                "spot_usd_per_hour": money(s.median) if s else "", "spot_min": money(s.low) if s else "",
                "spot_max": money(s.high) if s else "", "spot_azs": str(s.azs) if s else "",
                "as_of": as_of, "spot_as_of": spot_as_of if s else "", "source": on_demand_ref,
                "spot_source": spot_ref if s else "", "note": "; ".join(notes),
            })
    return rows, orphans


def render_csv(rows: list[dict[str, str]]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def read_csv_rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text, newline="")))


def compare_snapshots(new: SpotSource, old: SpotSource,
                      families: Optional[Iterable[str]] = None) -> tuple[tuple[str, str], ...]:
    """How the spot medians moved from an older snapshot to this one, as (key, value) lines.

    `families` limits the comparison to those families (for an older snapshot read only in part)."""
    keep = set(families) if families else None

    def scoped(stats: dict[tuple[str, str], SpotStats]) -> set[tuple[str, str]]:
        return {k for k in stats if keep is None or k[0].split(".")[0] in keep}
    new_keys, old_keys = scoped(new.stats), scoped(old.stats)
    both = sorted(new_keys & old_keys)
    lines: list[tuple[str, str]] = []
    if keep is not None:
        lines.append(("families compared", ", ".join(sorted(keep))))
    lines.append(("pairs compared", str(len(both))))
    if not both:
        return tuple(lines)
    change = {k: new.stats[k].median / old.stats[k].median - 1 for k in both}
    order = sorted(both, key=lambda k: (change[k], k))

    def name(k: tuple[str, str]) -> str:
        return (f"{k[0]} {k[1]}: {money(old.stats[k].median)} -> {money(new.stats[k].median)} "
                f"({change[k]:+.0%})")
    lines += [("median change", f"{statistics.median(change.values()):+.0%}"),
              ("moved 10% or more", str(sum(1 for v in change.values() if abs(v) >= 0.10))),
              ("moved 25% or more", str(sum(1 for v in change.values() if abs(v) >= 0.25))),
              ("fell", str(sum(1 for v in change.values() if v < 0))),
              ("rose", str(sum(1 for v in change.values() if v > 0)))]
    lines += [(f"largest fall {i}", name(k)) for i, k in enumerate(order[:5], 1) if change[k] < 0]
    lines += [(f"largest rise {i}", name(k)) for i, k in enumerate(reversed(order[-5:]), 1) if change[k] > 0]
    lines += [("only in the older snapshot", str(len(old_keys - new_keys))),
              ("only in this snapshot", str(len(new_keys - old_keys)))]
    return tuple(lines)


