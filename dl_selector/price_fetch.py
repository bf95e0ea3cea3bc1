"""What AWS says a region's instances cost now: the latest spot quote in each AZ (EC2
DescribeSpotPriceHistory) and the on-demand rates of the Price List API (one paginated GetProducts
query per region). Only reads and parses: judging a figure and keeping the embedded one is
price_merge.py, caching is price_cache.py.
"""
from __future__ import annotations

import datetime as dt
import json
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from .price_cache import iso_second, parse_time

PRICING_ENDPOINT_REGION = "us-east-1"  # the Price List API answers from us-east-1 (and a few others) for every region
SPOT_LOOKBACK = dt.timedelta(hours=3)
SPOT_PRODUCT = "Linux/UNIX"
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


Quotes = dict[str, dict[str, tuple[float, str]]]  # {type: {az: (USD/h, timestamp)}}


def latest_spot(records: Iterable[dict[str, Any]]) -> Quotes:
    """The latest Linux/UNIX quote in each (type, AZ) from SpotPriceHistory records."""
    best: dict[tuple[str, str], tuple[dt.datetime, float]] = {}
    for r in records:
        if not str(r.get("ProductDescription", "")).startswith(SPOT_PRODUCT):
            continue  # Windows, SUSE, RHEL: not the price a DL cluster pays
        try:
            price = float(r["SpotPrice"])
            ts = parse_time(r["Timestamp"])
            key = (r["InstanceType"], r["AvailabilityZone"])
        except (KeyError, TypeError, ValueError):
            continue
        if not math.isfinite(price):
            continue
        if key not in best or ts > best[key][0]:
            best[key] = (ts, price)
    out: Quotes = {}
    for (name, az), (ts, price) in sorted(best.items()):
        out.setdefault(name, {})[az] = (price, iso_second(ts))
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
