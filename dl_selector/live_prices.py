"""Live, dated prices for `recommend --live` and `catalog refresh --prices` (and `catalog refresh`).

- spot: EC2 DescribeSpotPriceHistory in each region (Linux/UNIX) from SPOT_LOOKBACK ago; AWS also
  returns the last change before StartTime, which is the price in effect then. The latest quote in
  each AZ counts; a type's spot figure is the median across AZs, with min, max and the AZ count.
  `azs` names the AZs a cluster would use: then only those count.
- on-demand: the AWS Price List API (the `pricing` client, us-east-1 endpoint): GetProducts,
  paginated, ONE query per region (Compute Instance, Linux, shared tenancy, no pre-installed
  software, capacity status Used), read for the instance types the catalog knows.
- both cached per region in cache_dir()/<region>.json with the time they were fetched; a cache
  younger than max_age is used without calling AWS. Files are replaced atomically.

Every live figure passes prices.implausible(); a rejected or missing one keeps the embedded
figure, and the Price's source (or spot_source) says so and why. One region or one API failing
keeps the rest, with one warning line per failure.

boto3 and botocore are imported only when something must be fetched: the catalog and the CLI
import this module freely.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Iterable, Optional

from .errors import UserError
from .price_cache import (CACHE_FORMAT, CACHE_VERSION, Log, cache_dir, cache_path, fresh, iso_minute, iso_second,
                          load_cache, parse_time, save_cache, to_stderr, utcnow)
from .price_fetch import (PRICE_LIST_FILTERS, PRICING_ENDPOINT_REGION, SPOT_LOOKBACK, SPOT_PRODUCT, OnDemand, Quotes,
                          RegionQuotes, fetch_on_demand, fetch_spot, latest_spot, on_demand_from_price_list,
                          price_list_filters)
from .price_merge import Merged, merge_price
from .prices import PriceTable

# The parts live in price_cache, price_fetch and price_merge; their names import from here as before.
__all__ = ["CACHE_FORMAT", "CACHE_VERSION", "PRICED_REGIONS", "PRICE_LIST_FILTERS", "PRICING_ENDPOINT_REGION",
           "SPOT_LOOKBACK", "SPOT_PRODUCT", "Counts", "Log", "Merged", "OnDemand", "Quotes", "RegionQuotes",
           "RegionSummary", "az_region", "cache_dir", "cache_path", "catalog_types", "check_azs", "fetch_on_demand",
           "fetch_spot", "for_catalog", "gather", "iso_minute", "latest_spot", "live_table", "load_cache",
           "merge_price", "on_demand_from_price_list", "price_list_filters", "save_cache", "utcnow"]

# The regions `catalog refresh --prices` prices live by default (those the embedded table first
# covered; dl_selector/data/prices.csv now covers every region of price_sources.REGIONS).
PRICED_REGIONS = ("us-east-1", "us-west-2", "eu-west-1", "ap-northeast-2")


def _short(e: Exception) -> str:
    return " ".join(str(e).split())[:200] or type(e).__name__


def gather(
    regions_types: dict[str, list[str]],
    *,
    session: Any = None,
    max_age_minutes: float,
    now: Optional[dt.datetime] = None,
    require_some: bool = True,
    log: Log = to_stderr,
) -> dict[str, RegionQuotes]:
    """Spot quotes and on-demand rates for each region's types, from the cache where it is younger
    than max_age_minutes (0: always fetch), else from AWS; refreshed parts are cached.

    A failing API call is one warning line; the region's older cached figures are used if there
    are any. With require_some, nothing at all obtained is a UserError (the caller asked for live
    prices). A session without credentials raises botocore's NoCredentialsError before any call."""
    now = now or utcnow()
    max_age = dt.timedelta(minutes=max_age_minutes)
    # Warnings wait until the end: if nothing at all comes back, the one error line says it all.
    warnings: list[str] = []
    cached = {r: load_cache(r, warnings.append) for r in regions_types}
    need_spot = {r for r, names in regions_types.items()
                 if not (fresh(cached[r].get("spot"), now, max_age)
                         and set(names) <= set(cached[r]["spot"]["types"]))}
    need_od = {r for r in regions_types if not fresh(cached[r].get("on_demand"), now, max_age)}

    if need_spot or need_od:
        from botocore.exceptions import (BotoCoreError, ClientError, NoCredentialsError,
                                         PartialCredentialsError)
        if session is None:
            import boto3
            session = boto3.session.Session()
        if session.get_credentials() is None:
            raise NoCredentialsError()
        fatal = (NoCredentialsError, PartialCredentialsError)
        pricing = session.client("pricing", region_name=PRICING_ENDPOINT_REGION) if need_od else None

    out: dict[str, RegionQuotes] = {}
    fetched_any = False
    what = {"spot": ("spot price history", "spot"), "on_demand": ("Price List API", "on-demand")}
    for region, names in regions_types.items():
        q = RegionQuotes(region)
        entry = dict(cached[region]) or {"format": CACHE_FORMAT, "version": CACHE_VERSION, "region": region}
        origin = {"spot": "cached", "on_demand": "cached"}
        for kind, needed in (("spot", region in need_spot), ("on_demand", region in need_od)):
            if not needed:
                continue
            try:
                entry[kind] = _fetch(kind, session, pricing, region, names, now)
                origin[kind] = "fetched"
                fetched_any = True
            except fatal:
                raise
            except (BotoCoreError, ClientError) as e:
                api, figures = what[kind]
                q.failures.append(f"{api}: {_short(e)}")
                warnings.append(f"warning: {region}: {api} unavailable ({_short(e)}); "
                                + _fallback(cached[region].get(kind), figures))
                origin[kind] = "cached, fetch failed"
        if "fetched" in origin.values():
            save_cache(region, {k: v for k, v in entry.items() if v is not None}, warnings.append)
        out[region] = _read_entry(q, entry, origin)

    if require_some and not fetched_any and all(q.spot is None and q.on_demand is None for q in out.values()):
        first = next((f for q in out.values() for f in q.failures), "no answer")
        raise UserError(f"no live prices could be fetched ({first}); the embedded figures are unchanged")
    for line in warnings:
        log(line)
    return out


def _fetch(kind: str, session: Any, pricing: Any, region: str, names: list[str], now: dt.datetime) -> dict[str, Any]:
    """One region's spot quotes or on-demand rates from AWS, as the cache file holds them."""
    stamp = iso_second(now)
    if kind == "spot":
        quotes = fetch_spot(session.client("ec2", region_name=region), names, now)
        return {"fetched_at": stamp, "types": sorted(set(names)),
                "quotes": {n: {az: list(v) for az, v in by.items()} for n, by in quotes.items()}}
    od = fetch_on_demand(pricing, region)
    return {"fetched_at": stamp, "prices": od.prices, "unpriced": od.unpriced, "publication": od.publication}


def _read_entry(q: RegionQuotes, entry: dict[str, Any], origin: dict[str, str]) -> RegionQuotes:
    """`q` with the figures of a cache entry (fetched now or earlier) and where each came from."""
    part = entry.get("spot")
    if part is not None:
        q.spot = {n: {az: (float(v[0]), str(v[1])) for az, v in by.items()} for n, by in part["quotes"].items()}
        q.spot_as_of, q.spot_origin = iso_minute(parse_time(part["fetched_at"])), origin["spot"]
    part = entry.get("on_demand")
    if part is not None:
        q.on_demand = OnDemand({k: float(v) for k, v in part["prices"].items()},
                               dict(part.get("unpriced", {})), str(part.get("publication", "")))
        q.on_demand_as_of, q.on_demand_origin = iso_minute(parse_time(part["fetched_at"])), origin["on_demand"]
    return q


def _fallback(part: Optional[dict[str, Any]], what: str) -> str:
    if part:
        return f"using the cached {what} figures from {iso_minute(parse_time(part['fetched_at']))}"
    return f"keeping the embedded {what} figures"


@dataclass
class Counts:
    live: int = 0
    kept: int = 0
    rejected: int = 0

    def add(self, status: str) -> None:
        setattr(self, status, getattr(self, status) + 1)

    def __str__(self) -> str:
        return f"{self.live} live, {self.kept} kept embedded, {self.rejected} rejected"


@dataclass
class RegionSummary:
    region: str
    types: int
    on_demand: Counts
    spot: Counts
    quotes: RegionQuotes

    def line(self) -> str:
        q = self.quotes
        when = "; ".join(f"{what} {origin} {as_of}" for what, origin, as_of in (
            ("on-demand", q.on_demand_origin, q.on_demand_as_of), ("spot", q.spot_origin, q.spot_as_of)) if origin)
        return (f"{self.region}: {self.types} types; on-demand {self.on_demand}; spot {self.spot}"
                + (f" ({when})" if when else ""))


def live_table(
    embedded: PriceTable,
    regions_types: dict[str, list[str]],
    *,
    azs: Optional[Iterable[str]] = None,
    session: Any = None,
    max_age_minutes: float,
    now: Optional[dt.datetime] = None,
    require_some: bool = True,
    log: Log = to_stderr,
) -> tuple[PriceTable, list[RegionSummary]]:
    """{type: {region: Price}} for every (type, region) asked about that has a live or an
    embedded figure, and one summary per region. Rejections are logged, one line per region."""
    quotes = gather(regions_types, session=session, max_age_minutes=max_age_minutes, now=now,
                    require_some=require_some, log=log)
    wanted_azs = set(azs) if azs else None
    table: PriceTable = {}
    summaries = []
    for region, names in regions_types.items():
        q = quotes[region]
        # AZs named for other regions leave this one's spot figure across all its AZs.
        region_azs = ({a for a in wanted_azs if az_region(a, [region])} or None) if wanted_azs else None
        if wanted_azs is not None and q.spot is not None:
            seen = {az for by in q.spot.values() for az in by}
            for az in sorted((region_azs or set()) - seen):
                log(f"warning: {region}: no spot quote at all in {az} (is it an AZ of {region}?)")
        od, spot = Counts(), Counts()
        rejected: list[str] = []
        for name in sorted(set(names)):
            m = merge_price(embedded.get(name, {}).get(region), name, q, region_azs)
            od.add(m.on_demand)
            spot.add(m.spot)
            if m.price is not None:
                table.setdefault(name, {})[region] = m.price
            if m.rejected:
                rejected.append(f"{name}: {m.rejected}")
        if rejected:
            log(f"warning: {region}: rejected implausible live prices for {len(rejected)} type(s) and kept "
                f"the embedded figures, e.g. {rejected[0]}")
        summaries.append(RegionSummary(region, len(set(names)), od, spot, q))
    return table, summaries


def az_region(az: str, regions: Iterable[str]) -> Optional[str]:
    """The region an AZ name belongs to (us-east-1a -> us-east-1; Local Zones such as
    us-east-1-bos-1a too), or None."""
    for region in sorted(regions, key=len, reverse=True):
        rest = az[len(region):]
        if az.startswith(region) and rest and rest[-1].isalpha() and (
                len(rest) == 1 or (rest[0] == "-" and all(c.isalnum() or c == "-" for c in rest))):
            return region
    return None


def check_azs(azs: Iterable[str], regions: list[str]) -> list[str]:
    """--az names, each in one of `regions`; a UserError otherwise."""
    from .validate import clean
    out = []
    for az in azs:
        if az_region(az, regions) is None:
            example = f"{regions[0]}a" if regions else "us-east-1a"
            raise UserError(f"--az {clean(repr(az))} is not an Availability Zone of {', '.join(regions)}; "
                            f"AZ names start with their region, e.g. {example}")
        out.append(az)
    return out


def catalog_types(catalog, region: str) -> list[str]:
    """The catalog's types that can have an on-demand or spot price in `region`."""
    return sorted(f.instance_type for f in catalog
                  if (region in f.regions or region in f.prices) and not f.capacity_block_only)


def for_catalog(catalog, regions: list[str], **kw) -> tuple[PriceTable, list[RegionSummary]]:
    """live_table for a Catalog: its own prices are the embedded figures."""
    embedded = {f.instance_type: dict(f.prices) for f in catalog}
    return live_table(embedded, {r: catalog_types(catalog, r) for r in regions}, **kw)
