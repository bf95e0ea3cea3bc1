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
import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from .errors import UserError
from .facts import Price
from .prices import PriceTable, implausible, spot_spread

Log = Callable[[str], None]

PRICING_ENDPOINT_REGION = "us-east-1"  # the Price List API answers from us-east-1 (and a few others) for every region
SPOT_LOOKBACK = dt.timedelta(hours=3)
SPOT_PRODUCT = "Linux/UNIX"
# The regions `catalog refresh --prices` prices live by default (those the embedded table first
# covered; selector/data/prices.csv now covers every region of price_sources.REGIONS).
PRICED_REGIONS = ("us-east-1", "us-west-2", "eu-west-1", "ap-northeast-2")
CACHE_FORMAT = "dl-launcher live prices"
CACHE_VERSION = 1
# What one on-demand rate means here; the region is added per query. Checked again on each product
# read, since a filter the API ignored must not turn a Windows or dedicated rate into ours.
PRICE_LIST_FILTERS = (
    ("productFamily", "Compute Instance"),
    ("operatingSystem", "Linux"),
    ("tenancy", "Shared"),
    ("preInstalledSw", "NA"),
    ("capacitystatus", "Used"),
)
_INSTANCE_TYPES_PER_CALL = 100


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr)


# ---- time ------------------------------------------------------------------------------------

def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def iso_minute(t: dt.datetime) -> str:
    """The as-of form shown to users: 2026-11-22T10:31Z."""
    return t.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%MZ")


def _iso_second(t: dt.datetime) -> str:
    return t.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(value: Any) -> dt.datetime:
    if isinstance(value, dt.datetime):
        t = value
    else:
        t = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)


# ---- spot: DescribeSpotPriceHistory ----------------------------------------------------------

Quotes = dict[str, dict[str, tuple[float, str]]]  # {type: {az: (USD/h, timestamp)}}


def latest_spot(records: Iterable[dict[str, Any]]) -> Quotes:
    """The latest Linux/UNIX quote in each (type, AZ) from SpotPriceHistory records."""
    best: dict[tuple[str, str], tuple[dt.datetime, float]] = {}
    for r in records:
        if not str(r.get("ProductDescription", "")).startswith(SPOT_PRODUCT):
            continue  # Windows, SUSE, RHEL: not the price a DL cluster pays
        try:
            price = float(r["SpotPrice"])
            ts = _parse_time(r["Timestamp"])
            key = (r["InstanceType"], r["AvailabilityZone"])
        except (KeyError, TypeError, ValueError):
            continue
        if not math.isfinite(price):
            continue
        if key not in best or ts > best[key][0]:
            best[key] = (ts, price)
    out: Quotes = {}
    for (name, az), (ts, price) in sorted(best.items()):
        out.setdefault(name, {})[az] = (price, _iso_second(ts))
    return out


def fetch_spot(ec2, names: Iterable[str], now: dt.datetime) -> Quotes:
    records: list[dict[str, Any]] = []
    names = sorted(set(names))
    for i in range(0, len(names), _INSTANCE_TYPES_PER_CALL):
        pages = ec2.get_paginator("describe_spot_price_history").paginate(
            InstanceTypes=names[i:i + _INSTANCE_TYPES_PER_CALL], ProductDescriptions=[SPOT_PRODUCT],
            StartTime=now - SPOT_LOOKBACK)
        for page in pages:
            records.extend(page.get("SpotPriceHistory", []))
    return latest_spot(records)


# ---- on-demand: the Price List API -----------------------------------------------------------

def price_list_filters(region: str) -> list[dict[str, str]]:
    return [{"Type": "TERM_MATCH", "Field": f, "Value": v}
            for f, v in (("regionCode", region),) + PRICE_LIST_FILTERS]


@dataclass
class OnDemand:
    prices: dict[str, float]  # USD per hour by instance type
    unpriced: dict[str, str]  # instance type -> why the list gave no single rate for it
    publication: str  # the newest publicationDate among the products read


def on_demand_from_price_list(items: Iterable[Any], region: str) -> OnDemand:
    """On-demand USD/h per instance type from GetProducts PriceList items (JSON strings).

    Only positive hourly USD dimensions of OnDemand terms count. $0.00 rows are real (a Capacity
    Block product carries one, marketoption CapacityBlock; reserved terms carry them too) and never
    a price; so are products outside the filters, checked again here."""
    wanted = {"regionCode": region, **{k: v for k, v in PRICE_LIST_FILTERS if k != "productFamily"}}
    rates: dict[str, set[float]] = {}
    zero: set[str] = set()
    publication = ""
    for item in items:
        try:
            product = json.loads(item) if isinstance(item, str) else item
            attrs = product["product"]["attributes"]
            family = product["product"].get("productFamily", "Compute Instance")
        except (ValueError, TypeError, KeyError, AttributeError):
            continue
        if family != "Compute Instance":
            continue
        name = attrs.get("instanceType")
        if not isinstance(name, str) or not name:
            continue
        if any(k in attrs and attrs[k] != v for k, v in wanted.items()):
            continue  # older products lack some attributes (regionCode): the API matched them
        if attrs.get("marketoption", "OnDemand") != "OnDemand":
            continue
        publication = max(publication, str(product.get("publicationDate", "")))
        for term in (product.get("terms") or {}).get("OnDemand", {}).values():
            for dim in (term.get("priceDimensions") or {}).values():
                if dim.get("unit") != "Hrs":
                    continue
                try:
                    usd = float((dim.get("pricePerUnit") or {}).get("USD"))
                except (TypeError, ValueError):
                    continue
                if usd > 0 and math.isfinite(usd):
                    rates.setdefault(name, set()).add(usd)
                else:
                    zero.add(name)
    prices, unpriced = {}, {}
    for name, found in rates.items():
        if len(found) == 1:
            prices[name] = found.pop()
        else:
            shown = ", ".join(f"{v:g}" for v in sorted(found))
            unpriced[name] = f"the Price List quotes {len(found)} different Linux on-demand rates ({shown})"
    for name in zero - set(rates):
        unpriced[name] = "the Price List quotes only $0.00 for it"
    return OnDemand(prices, unpriced, publication)


def fetch_on_demand(pricing, region: str) -> OnDemand:
    items: list[Any] = []
    pages = pricing.get_paginator("get_products").paginate(
        ServiceCode="AmazonEC2", FormatVersion="aws_v1", Filters=price_list_filters(region),
        PaginationConfig={"PageSize": 100})
    for page in pages:
        items.extend(page.get("PriceList", []))
    return on_demand_from_price_list(items, region)


# ---- the cache -------------------------------------------------------------------------------

def cache_dir() -> Path:
    """$DL_LAUNCHER_CACHE, else $XDG_CACHE_HOME/dl-launcher/prices, else ~/.cache/dl-launcher/prices."""
    own = os.environ.get("DL_LAUNCHER_CACHE")
    if own:
        return Path(own)
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"  # the XDG spec ignores a relative one
    return base / "dl-launcher" / "prices"


def cache_path(region: str) -> Path:
    return cache_dir() / f"{region}.json"


def _check_cache(data: Any, region: str) -> dict[str, Any]:
    """The cache file's content, or ValueError saying what is wrong with it."""
    if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT:
        raise ValueError("not a dl-launcher price cache")
    if data.get("version") != CACHE_VERSION:
        raise ValueError(f"cache version {data.get('version')!r}, this dl-launcher writes {CACHE_VERSION}")
    if data.get("region") != region:
        raise ValueError(f"holds prices for {data.get('region')!r}, not {region}")
    spot, od = data.get("spot"), data.get("on_demand")
    for part in (spot, od):
        if part is not None:
            if not isinstance(part, dict):
                raise ValueError("a part is not an object")
            _parse_time(part.get("fetched_at"))
    if spot is not None:
        if not isinstance(spot.get("types"), list) or not isinstance(spot.get("quotes"), dict):
            raise ValueError("spot has no types or quotes")
        for name, by_az in spot["quotes"].items():
            for az, q in by_az.items():
                if not (isinstance(q, list) and len(q) == 2 and _number(q[0]) and isinstance(q[1], str)):
                    raise ValueError(f"bad spot quote for {name} in {az}")
    if od is not None:
        if not isinstance(od.get("prices"), dict) or not all(_number(v) for v in od["prices"].values()):
            raise ValueError("on_demand prices are not numbers")
        if not isinstance(od.get("unpriced", {}), dict) or not isinstance(od.get("publication", ""), str):
            raise ValueError("bad on_demand fields")
    return data


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def load_cache(region: str, log: Log = _stderr) -> dict[str, Any]:
    """The cached parts for `region` ({} when none). A file that cannot be read or is not a price
    cache is ignored with a warning: it is refetched and overwritten, never a traceback."""
    path = cache_path(region)
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return {}  # no cache yet (a bad folder is reported when writing)
    except (OSError, UnicodeDecodeError) as e:
        log(f"warning: ignoring price cache {path}: {getattr(e, 'strerror', None) or e}; fetching afresh")
        return {}
    try:
        return _check_cache(json.loads(text), region)
    except (ValueError, TypeError, AttributeError) as e:
        log(f"warning: ignoring price cache {path}: {str(e)[:160]}; fetching afresh")
        return {}


def save_cache(region: str, data: dict[str, Any], log: Log = _stderr) -> None:
    """Write all or nothing: a temporary file in the same folder, renamed over the old one."""
    import tempfile

    path = cache_path(region)
    tmp = None
    try:
        text = json.dumps(data, indent=1, sort_keys=True, allow_nan=False) + "\n"
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{region}-", suffix=".json", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
        tmp = None
    except (OSError, ValueError) as e:
        log(f"warning: could not write price cache {path}: {getattr(e, 'strerror', None) or e}")
    finally:
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)


def _fresh(part: Optional[dict[str, Any]], now: dt.datetime, max_age: dt.timedelta) -> bool:
    if not part:
        return False
    age = now - _parse_time(part["fetched_at"])
    return dt.timedelta(minutes=-5) <= age <= max_age  # a stamp from the future is a clock problem: refetch


# ---- gathering -------------------------------------------------------------------------------

@dataclass
class RegionQuotes:
    """What one region's live sources gave, fetched now or read from the cache."""
    region: str
    spot: Optional[Quotes] = None  # None: unavailable
    spot_as_of: str = ""
    spot_origin: str = ""
    on_demand: Optional[OnDemand] = None
    on_demand_as_of: str = ""
    on_demand_origin: str = ""
    failures: list[str] = field(default_factory=list)


def _short(e: Exception) -> str:
    return " ".join(str(e).split())[:200] or type(e).__name__


def gather(
    regions_types: dict[str, list[str]],
    *,
    session: Any = None,
    max_age_minutes: float,
    now: Optional[dt.datetime] = None,
    require_some: bool = True,
    log: Log = _stderr,
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
                 if not (_fresh(cached[r].get("spot"), now, max_age)
                         and set(names) <= set(cached[r]["spot"]["types"]))}
    need_od = {r for r in regions_types if not _fresh(cached[r].get("on_demand"), now, max_age)}

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
    stamp = _iso_second(now)
    what = {"spot": ("spot price history", "spot"), "on_demand": ("Price List API", "on-demand")}
    for region, names in regions_types.items():
        q = RegionQuotes(region)
        entry = dict(cached[region]) or {"format": CACHE_FORMAT, "version": CACHE_VERSION, "region": region}
        origin = {"spot": "cached", "on_demand": "cached"}
        for kind, needed in (("spot", region in need_spot), ("on_demand", region in need_od)):
            if not needed:
                continue
            try:
                if kind == "spot":
                    quotes = fetch_spot(session.client("ec2", region_name=region), names, now)
                    entry[kind] = {"fetched_at": stamp, "types": sorted(set(names)),
                                   "quotes": {n: {az: list(v) for az, v in by.items()} for n, by in quotes.items()}}
                else:
                    od = fetch_on_demand(pricing, region)
                    entry[kind] = {"fetched_at": stamp, "prices": od.prices, "unpriced": od.unpriced,
                                   "publication": od.publication}
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

        part = entry.get("spot")
        if part is not None:
            q.spot = {n: {az: (float(v[0]), str(v[1])) for az, v in by.items()} for n, by in part["quotes"].items()}
            q.spot_as_of, q.spot_origin = iso_minute(_parse_time(part["fetched_at"])), origin["spot"]
        part = entry.get("on_demand")
        if part is not None:
            q.on_demand = OnDemand({k: float(v) for k, v in part["prices"].items()},
                                   dict(part.get("unpriced", {})), str(part.get("publication", "")))
            q.on_demand_as_of, q.on_demand_origin = iso_minute(_parse_time(part["fetched_at"])), origin["on_demand"]
        out[region] = q

    if require_some and not fetched_any and all(q.spot is None and q.on_demand is None for q in out.values()):
        first = next((f for q in out.values() for f in q.failures), "no answer")
        raise UserError(f"no live prices could be fetched ({first}); the embedded figures are unchanged")
    for line in warnings:
        log(line)
    return out


def _fallback(part: Optional[dict[str, Any]], what: str) -> str:
    if part:
        return f"using the cached {what} figures from {iso_minute(_parse_time(part['fetched_at']))}"
    return f"keeping the embedded {what} figures"


# ---- merging with the embedded figures -------------------------------------------------------

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


@dataclass
class Merged:
    price: Optional[Price]
    on_demand: str  # live / kept / rejected
    spot: str
    rejected: str = ""  # why a live figure was refused, for the log


def merge_price(old: Optional[Price], name: str, q: RegionQuotes, azs: Optional[set[str]] = None) -> Merged:
    """The Price for (name, q.region) and what became of each live figure.

    A live figure replaces the embedded one only if prices.implausible() finds nothing wrong with
    it; otherwise the embedded figure stays and the source says why. None when there is neither."""
    region = q.region
    od_live, od_status, od_why = None, "kept", ""
    if q.on_demand is None:
        od_why = "Price List API unavailable"
    elif name in q.on_demand.prices:
        v = q.on_demand.prices[name]
        why = implausible(v, kind="on-demand")
        if why:
            od_status, od_why = "rejected", f"live {why}"
        else:
            od_live, od_status = v, "live"
    else:
        od_why = q.on_demand.unpriced.get(name) or f"no Linux on-demand product for it in {region} in the Price List"

    spot_good: dict[str, float] = {}
    spot_status, spot_why, bad = "kept", "", []
    if q.spot is None:
        spot_why = "spot price history unavailable"
    else:
        quotes = q.spot.get(name, {})
        if azs is not None:
            quotes = {az: v for az, v in quotes.items() if az in azs}
        if not quotes:
            spot_why = "no spot quote" + (f" in {', '.join(sorted(azs))}" if azs is not None else f" in {region}")
        else:
            ref = od_live if od_live is not None else (old.on_demand if old else None)
            for az, (price, _ts) in sorted(quotes.items()):
                why = implausible(price, ref)
                if why:
                    bad.append(f"{az}: {why}")
                else:
                    spot_good[az] = price
            if spot_good:
                spot_status = "live"
            else:
                spot_status = "rejected"
                spot_why = "live " + bad[0].split(": ", 1)[1] + (f" (and in {len(bad) - 1} more AZs)" if len(bad) > 1 else "")

    rejected = "; ".join(w for s, w in ((od_status, od_why), (spot_status, spot_why)) if s == "rejected")
    if od_live is None and not spot_good and old is None:
        return Merged(None, od_status, spot_status, rejected)

    if od_live is not None:
        pub = f"; offer published {q.on_demand.publication}" if q.on_demand.publication else ""
        on_demand, as_of = od_live, q.on_demand_as_of
        source = f"AWS Price List API GetProducts ({region}, Linux, shared tenancy, on-demand{pub})"
    elif old is not None and old.on_demand is not None:
        on_demand, as_of = old.on_demand, old.as_of
        source = f"embedded figure kept ({od_why}): {old.source}"
    else:
        on_demand, as_of = None, old.as_of if old else q.spot_as_of
        source = f"no on-demand figure ({od_why})" + (f"; {old.source}" if old and old.source else "")

    if spot_good:
        median, low, high, n = spot_spread(spot_good.values())
        spot = dict(spot=median, spot_min=low, spot_max=high, spot_azs=n, spot_as_of=q.spot_as_of,
                    spot_source=(f"EC2 DescribeSpotPriceHistory ({SPOT_PRODUCT}): median of the latest quote in "
                                 f"{n} AZ(s) {', '.join(sorted(spot_good))}"
                                 + (f"; rejected {'; '.join(bad)}" if bad else "")))
    elif old is not None and old.spot is not None:
        spot = dict(spot=old.spot, spot_min=old.spot_min, spot_max=old.spot_max, spot_azs=old.spot_azs,
                    spot_as_of=old.spot_date,
                    spot_source=f"embedded figure kept ({spot_why}): {old.spot_source or old.source}")
    else:
        spot = dict(spot=None, spot_min=None, spot_max=None, spot_azs=0, spot_as_of="",
                    spot_source=f"no spot figure ({spot_why})")
    # The embedded note describes the embedded figures; it stays while any of them does.
    note = old.note if old is not None and (od_live is None or not spot_good) else ""
    return Merged(Price(on_demand=on_demand, as_of=as_of, source=source, note=note, **spot),
                  od_status, spot_status, rejected)


def live_table(
    embedded: PriceTable,
    regions_types: dict[str, list[str]],
    *,
    azs: Optional[Iterable[str]] = None,
    session: Any = None,
    max_age_minutes: float,
    now: Optional[dt.datetime] = None,
    require_some: bool = True,
    log: Log = _stderr,
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


# ---- the catalog's view ----------------------------------------------------------------------

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
