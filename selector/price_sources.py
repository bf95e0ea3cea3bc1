"""Build selector/data/prices.csv from its two published sources, and render prices.md from it.

Sources (their formats, not their contents, are what this module knows):
  * on-demand: tsaol/aws-gpu data/all_gpu_instances.js, a JavaScript file generated from
    instances.vantage.sh: `const allGPUInstances = [ {...}, ... ];`, one JSON object per type with
    `apiName` (or `name`) and `pricing: {region: {onDemand: USD/h, ...}}`;
  * spot: skypilot-org/skypilot-catalog catalogs/v8/aws/vms.csv, one row per availability zone:
    InstanceType, ..., Price (on-demand), SpotPrice, Region, AvailabilityZone (an AZ ID), Arch.

The spot figure of a (type, region) is the median of the quotes of the region's availability
zones. Local Zone and Wavelength Zone quotes are left out (a Local Zone is a different market,
in another city); AZs quoting spot equal to on-demand are kept (AWS caps spot at on-demand, so
that quote is real: no discount there). Quotes that selector.prices.implausible refuses, or above
their own row's on-demand price, are rejected and listed.

Used by scripts/build_prices.py. Standard library only.
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
from .prices import MIN_SPOT_SHARE_OF_ON_DEMAND, implausible, spot_spread

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

@dataclass(frozen=True)
class Sources:
    """What prices.md says about where the figures came from; kept in prices_sources.toml."""
    on_demand_ref: str
    on_demand_as_of: str
    spot_ref: str
    spot_as_of: str
    spot_date_note: str = ""
    on_demand_note: str = ""
    types: tuple[str, ...] = ()  # the catalog types the build looked for
    retired: tuple[str, ...] = ()
    on_demand_entries: int = 0
    spot_rows: int = 0
    spot_no_quote: int = 0
    spot_at_on_demand: int = 0  # kept quotes equal to their row's on-demand price
    zones_excluded: tuple[tuple[str, int], ...] = ()
    rejected: tuple[tuple[str, str, str, str, str], ...] = ()
    spot_without_on_demand: tuple[tuple[str, str, str, int], ...] = ()  # type, region, median, AZs
    comparison: tuple[tuple[str, str], ...] = ()  # (key, value) lines about an older spot snapshot


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


# ---------------------------------------------------------------------------------------------
# prices_sources.toml: a tiny TOML writer for what render_markdown needs besides prices.csv

def _toml_str(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)  # a JSON string is a TOML basic string


def render_sources_toml(s: Sources) -> str:
    out = ["# Written by scripts/build_prices.py with prices.csv; prices.md is rendered from both.",
           "# Do not edit by hand: rebuild.", ""]
    for key in ("on_demand_ref", "on_demand_as_of", "on_demand_note", "spot_ref", "spot_as_of", "spot_date_note"):
        out.append(f"{key} = {_toml_str(getattr(s, key))}")
    for key in ("on_demand_entries", "spot_rows", "spot_no_quote", "spot_at_on_demand"):
        out.append(f"{key} = {getattr(s, key)}")
    out.append("types = [" + ", ".join(_toml_str(t) for t in s.types) + "]")
    out.append("retired = [" + ", ".join(_toml_str(t) for t in s.retired) + "]")
    out.append("")
    out.append("[zones_excluded]  # Local Zone / Wavelength Zone ID -> quotes left out")
    out += [f"{_toml_str(z)} = {n}" for z, n in s.zones_excluded]
    out.append("")
    out.append("[comparison]  # the spot medians against an older snapshot")
    out += [f"{_toml_str(k)} = {_toml_str(v)}" for k, v in s.comparison]
    for r in s.rejected:
        out += ["", "[[rejected]]"] + [f"{k} = {_toml_str(v)}" for k, v in
                                       zip(("instance_type", "region", "az", "spot", "reason"), r)]
    for r in s.spot_without_on_demand:
        out += ["", "[[spot_without_on_demand]]",
                f"instance_type = {_toml_str(r[0])}", f"region = {_toml_str(r[1])}",
                f"spot = {_toml_str(r[2])}", f"azs = {r[3]}"]
    return "\n".join(out) + "\n"


def load_sources_toml(text: str) -> Sources:
    import tomllib
    d = tomllib.loads(text)
    return Sources(
        on_demand_ref=d["on_demand_ref"], on_demand_as_of=d["on_demand_as_of"], spot_ref=d["spot_ref"],
        spot_as_of=d["spot_as_of"], spot_date_note=d.get("spot_date_note", ""),
        on_demand_note=d.get("on_demand_note", ""), types=tuple(d.get("types", ())),
        retired=tuple(d.get("retired", ())), on_demand_entries=d.get("on_demand_entries", 0),
        spot_rows=d.get("spot_rows", 0), spot_no_quote=d.get("spot_no_quote", 0),
        spot_at_on_demand=d.get("spot_at_on_demand", 0),
        zones_excluded=tuple(d.get("zones_excluded", {}).items()),
        rejected=tuple((r["instance_type"], r["region"], r["az"], r["spot"], r["reason"]) for r in d.get("rejected", ())),
        spot_without_on_demand=tuple((r["instance_type"], r["region"], r["spot"], r["azs"])
                                     for r in d.get("spot_without_on_demand", ())),
        comparison=tuple(d.get("comparison", {}).items()),
    )


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


# ---------------------------------------------------------------------------------------------
# prices.md

def render_markdown(rows: list[dict[str, str]], s: Sources, regions: Iterable[str] = REGIONS) -> str:
    """prices.md, from prices.csv's rows and prices_sources.toml alone (no source files needed)."""
    regions = sorted(regions)
    with_spot = [r for r in rows if r["spot_usd_per_hour"]]
    azs: dict[int, int] = {}
    for r in with_spot:
        azs[int(r["spot_azs"])] = azs.get(int(r["spot_azs"]), 0) + 1
    single = [r for r in with_spot if r["spot_azs"] == "1"]
    types_priced = sorted({r["instance_type"] for r in rows})
    L = ["# prices.csv: where the numbers come from", "",
         "Generated by `scripts/build_prices.py` from the two sources below; do not edit by hand. "
         "`selector/data/prices_sources.toml` holds what this page needs besides `prices.csv` "
         "(source references, rejected and excluded quotes), so tests can check this page against "
         "`prices.csv` without the source files.", "",
         f"`prices.csv` has {len(rows)} rows for {len(types_priced)} of the {len(s.types)} catalog types "
         f"in {len(regions)} regions ({', '.join(regions)}). A row is present wherever the on-demand "
         f"source prices the type in the region; {len(with_spot)} rows also have a spot figure. "
         "Nothing is estimated or carried over by hand.", "",
         "## Sources", "",
         f"1. **On-demand** (`on_demand_usd_per_hour`, `as_of`, `source`): {s.on_demand_ref}.",
         f"   - `as_of` = {s.on_demand_as_of}, the date in the file's own `// Last updated:` header "
         "(it is generated from instances.vantage.sh, which reads the AWS Price List: Linux, shared tenancy, USD/hour).",
         f"   - The file lists {s.on_demand_entries} instance entries; each `pricing[region].onDemand` is used as written."
         + (f" {s.on_demand_note}" if s.on_demand_note else ""),
         f"2. **Spot** (`spot_usd_per_hour`, `spot_min`, `spot_max`, `spot_azs`, `spot_as_of`, `spot_source`): {s.spot_ref}.",
         f"   - `spot_as_of` = {s.spot_as_of}." + (f" {s.spot_date_note}" if s.spot_date_note else ""),
         f"   - {s.spot_rows} rows of that file are for a catalog type in one of the {len(regions)} regions "
         f"(one row per availability zone); {s.spot_no_quote} of them have no spot price.",
         "", "## How the spot figure is computed", "",
         "- `spot_usd_per_hour` is the **median** of the type's spot quotes across the region's availability zones; "
         "`spot_min` and `spot_max` are the cheapest and dearest of those quotes and `spot_azs` their number.",
         "- **Kept:** AZs quoting spot equal to on-demand. AWS caps spot at the on-demand price, so such a quote is "
         "real (no discount there today); dropping it would bias the median low. (The previous, hand-made table "
         "dropped them.)",
         "- **Left out:** Local Zones and Wavelength Zones, recognised by their AZ ID not being `<region code>-az<n>` "
         "(for example `usw2-lax1-az1`). They are separate markets in other cities.",
         f"- **Rejected:** quotes that `selector.prices.implausible` refuses (zero, negative, out of bounds, below "
         f"{MIN_SPOT_SHARE_OF_ON_DEMAND:.0%} of on-demand: a placeholder or unit slip) and quotes more than "
         f"{QUOTE_STEP:g} USD above their own row's on-demand price (AWS caps spot there). They are listed below.",
         "- `note` says `spot from 1 AZ` where one AZ is all there is: one AZ is not a market, so read that figure with care.",
         "- `note` marks P4/P5 rows `after 2025-06 P4/P5 price cut`, rows of types the catalog marks retired "
         "`retired type, last published price`, and rows without spot `no spot quote in the snapshot`.",
         "", "## Rows per region", "",
         "| region | rows | with spot | single-AZ spot |", "|---|---:|---:|---:|"]
    for region in regions:
        here = [r for r in rows if r["region"] == region]
        L.append(f"| {region} | {len(here)} | {sum(1 for r in here if r['spot_usd_per_hour'])} | "
                 f"{sum(1 for r in here if r['spot_azs'] == '1')} |")
    L.append(f"| all | {len(rows)} | {len(with_spot)} | {len(single)} |")
    L += ["", "## AZs behind each spot figure", "", "| AZs | rows |", "|---:|---:|"]
    L += [f"| {n} | {azs[n]} |" for n in sorted(azs)]
    at_od = [r for r in with_spot if r["spot_max"]
             and abs(float(r["spot_max"]) - float(r["on_demand_usd_per_hour"])) <= QUOTE_STEP]
    L += ["", f"{len(at_od)} spot rows have at least one AZ quoting the on-demand price (`spot_max` = on-demand "
          f"within the {QUOTE_STEP:g} USD step spot is quoted in); their median is kept as it is. Over all rows, "
          f"{s.spot_at_on_demand} kept AZ quotes equal their own row's on-demand price.", ""]
    L += [f"- {r['instance_type']} in {r['region']}: median {r['spot_usd_per_hour']} over {r['spot_azs']} AZ(s), "
          f"{r['spot_min']} to {r['spot_max']}; on-demand {r['on_demand_usd_per_hour']}" for r in at_od]
    L += ["", "## Single-AZ spot figures", ""]
    L += [f"- {r['instance_type']} in {r['region']}: {r['spot_usd_per_hour']}" for r in single] or ["- none"]
    L += ["", "## Left out and rejected quotes", "",
          f"Local Zone / Wavelength Zone quotes left out: {sum(n for _, n in s.zones_excluded)}"
          + (" (" + ", ".join(f"{z}: {n}" for z, n in s.zones_excluded) + ")" if s.zones_excluded else "") + ".", "",
          f"Rejected quotes: {len(s.rejected)}.", ""]
    if s.rejected:
        L += ["| type | region | AZ | spot | reason |", "|---|---|---|---:|---|"]
        L += [f"| {t} | {r} | {az} | {p} | {why} |" for t, r, az, p, why in s.rejected]
        L.append("")
    L += ["Spot figures with no on-demand price to go with them (left out of `prices.csv`): "
          f"{len(s.spot_without_on_demand)}."]
    L += [f"- {t} in {r}: median {p} over {n} AZ(s)" for t, r, p, n in s.spot_without_on_demand]
    if s.comparison:
        L += ["", "## Against an older spot snapshot", "",
              "The same medians (same rule) computed from an older snapshot of the spot source, over the families "
              "and regions named below (the older snapshot may have been read only in part), "
              "to show how far a spot figure moves between snapshots: read `spot_usd_per_hour` as a dated "
              "observation, not a quote.", ""]
        L += [f"- {k}: {v}" for k, v in s.comparison]
    L += ["", "## Gaps", "", "Catalog types with no on-demand price in any of the regions:", ""]
    L += [f"- {t}" for t in s.types if t not in types_priced] or ["- none"]
    L += ["", "Types priced in some regions but not others (no row where the source has no on-demand price):", ""]
    by_type: dict[str, list[str]] = {}
    for r in rows:
        by_type.setdefault(r["instance_type"], []).append(r["region"])
    partial = [(t, [g for g in regions if g not in by_type[t]]) for t in types_priced if len(by_type[t]) < len(regions)]
    L += [f"- {t}: none in {', '.join(gone)}" for t, gone in partial] or ["- none"]
    L += ["", "Rows with an on-demand price but no spot figure (no quote for the type there in the snapshot):", ""]
    no_spot: dict[str, list[str]] = {}
    for r in rows:
        if not r["spot_usd_per_hour"]:
            no_spot.setdefault(r["instance_type"], []).append(r["region"])
    L += [f"- {t}: {', '.join(sorted(g))}" for t, g in sorted(no_spot.items())] or ["- none"]
    return "\n".join(L) + "\n"
