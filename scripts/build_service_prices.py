"""Rebuild dl_selector/data/service_prices.json from the AWS Price List Query API.

    python scripts/build_service_prices.py                      # every region in dl_selector/data/prices/
    python scripts/build_service_prices.py --regions eu-west-1,ap-southeast-1

Needs credentials allowed pricing:GetProducts (the API answers from us-east-1 for every region).
For each region and each figure the stack prices (NAT gateway, public IPv4, gp3, CloudWatch, Logs,
S3, KMS) it asks GetProducts with TERM_MATCH on regionCode and the attribute that narrows the product
family, then keeps the one product whose usagetype is the figure's (after the region's prefix, so
APS1-RegionalNatGateway-Hours is not APS1-NatGateway-Hours), and takes its first tier (the price
dimension whose range begins at 0). Each figure is written with its SKU, usagetype and the Price
List's publication date. A figure the API does not give for a region (no product, several products
with different prices, a unit other than the one the stack multiplies by, only $0) is written under
"missing" with the reason, never filled from another region; the stack's summary names what it
borrowed from us-east-1. Regions not asked for keep their rows, and figures this script does not
fetch (FSx for Lustre) keep theirs. The file is written once, after every answer was read.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from dl_core.aws import Backoff, retry  # noqa: E402  (one way to retry AWS: transient errors, full jitter)

DATA = ROOT / "dl_selector" / "data"
PRICING_REGION = "us-east-1"
ATTEMPTS = 8


@dataclass(frozen=True)
class Item:
    """One figure: which query finds it, which usagetype it is, in what unit, scaled to the json's unit."""
    service: str
    filters: tuple[tuple[str, str], ...]  # TERM_MATCH besides regionCode
    usagetype: str  # without the region prefix
    unit: str
    scale: float = 1.0  # e.g. 1,000 for a price per request written per 1,000
    global_: bool = False  # priced once for every region (location "Any", no regionCode): asked without one


ITEMS: dict[str, Item] = {
    "nat_gateway_hour": Item("AmazonEC2", (("productFamily", "NAT Gateway"),), "NatGateway-Hours", "Hrs"),
    "nat_gateway_gb": Item("AmazonEC2", (("productFamily", "NAT Gateway"),), "NatGateway-Bytes", "GB"),
    "public_ipv4_hour": Item("AmazonVPC", (), "PublicIPv4:InUseAddress", "Hrs"),
    "ebs_gp3_gb_month": Item("AmazonEC2", (("productFamily", "Storage"), ("volumeApiName", "gp3")),
                             "EBS:VolumeUsage.gp3", "GB-Mo"),
    "cw_metric_month": Item("AmazonCloudWatch", (), "CW:MetricMonitorUsage", "Metrics"),
    "cw_alarm_metric_month": Item("AmazonCloudWatch", (), "CW:AlarmMonitorUsage", "Alarms"),
    # Dashboards are account-global products (location "Any", empty regionCode); DashboardsUsageHour is the
    # one for more than 50 metrics, DashboardsUsageHour-Basic for 50 or fewer (the same $3 on the pages).
    "cw_dashboard_month": Item("AmazonCloudWatch", (("productFamily", "Dashboard"),), "DashboardsUsageHour",
                               "Dashboards", global_=True),
    "cw_metrics_requested_1000": Item("AmazonCloudWatch", (), "CW:GMD-Metrics", "Metrics", 1000.0),
    "logs_ingested_gb": Item("AmazonCloudWatch", (), "DataProcessing-Bytes", "GB"),
    "logs_stored_gb_month": Item("AmazonCloudWatch", (), "TimedStorage-ByteHrs", "GB-Mo"),
    "s3_standard_gb_month": Item("AmazonS3", (("productFamily", "Storage"),), "TimedStorage-ByteHrs", "GB-Mo"),
    "s3_put_1000": Item("AmazonS3", (("productFamily", "API Request"),), "Requests-Tier1", "Requests", 1000.0),
    "kms_key_month": Item("awskms", (), "KMS-Keys", "Keys"),
}


class BuildError(Exception):
    """One line for the maintainer: what went wrong and where."""


def instance_regions(prices_dir: Path = DATA / "prices") -> list[str]:
    """The regions the selector prices instances in: one file each."""
    return sorted(p.stem for p in prices_dir.glob("*.json"))


def usagetype_matches(usagetype: str, wanted: str, region: str) -> bool:
    """APS1-NatGateway-Hours, NatGateway-Hours (us-east-1) and ap-southeast-1-KMS-Keys (KMS names its
    prefix by region code) are the wanted figure; APS1-RegionalNatGateway-Hours and
    APS1-Annotation-TimedStorage-ByteHrs are other products."""
    prefix = rf"(?:(?:[A-Z]{{2,4}}\d{{0,2}}|{re.escape(region)})-)?"
    return re.fullmatch(prefix + re.escape(wanted), usagetype) is not None


@dataclass(frozen=True)
class Figure:
    price: float
    sku: str
    usagetype: str
    rate_code: str
    publication: str


def first_tier(product: dict[str, Any], unit: str) -> tuple[Optional[float], str, str]:
    """(USD, rate code, why not) of the OnDemand dimension whose range begins at 0, in `unit`."""
    dims = [d for term in (product.get("terms") or {}).get("OnDemand", {}).values()
            for d in (term.get("priceDimensions") or {}).values()]
    if not dims:
        return None, "", "no OnDemand price"
    first = [d for d in dims if _num(d.get("beginRange")) == 0.0]
    if len(first) != 1:
        return None, "", f"{len(first)} price dimensions begin at 0"
    d = first[0]
    if d.get("unit") != unit:
        return None, "", f"its unit is {d.get('unit')!r}, the stack multiplies by {unit!r}"
    usd = _num((d.get("pricePerUnit") or {}).get("USD"))
    if usd is None or usd <= 0:
        return None, "", "the Price List quotes $0 (or no USD price)"
    return usd, str(d.get("rateCode", "")), ""


def _num(v: Any) -> Optional[float]:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def pick(items: Iterable[Any], key: str, item: Item, region: str) -> tuple[Optional[Figure], str]:
    """The figure for `key` among a query's PriceList entries, or why there is none."""
    found: list[Figure] = []
    refused: list[str] = []
    for raw in items:
        try:
            product = json.loads(raw) if isinstance(raw, str) else raw
            attrs = product["product"]["attributes"]
        except (ValueError, TypeError, KeyError):
            continue
        usagetype = str(attrs.get("usagetype", ""))
        own_region = attrs.get("regionCode", "") in ("", region) if item.global_ else attrs.get("regionCode", region) == region
        if not own_region or not usagetype_matches(usagetype, item.usagetype, region):
            continue
        usd, rate, why = first_tier(product, item.unit)
        sku = str(product["product"].get("sku", ""))
        if usd is None:
            refused.append(f"{sku} ({usagetype}): {why}")
            continue
        found.append(Figure(round(usd * item.scale, 10), sku, usagetype, rate, str(product.get("publicationDate", ""))))
    prices = sorted({f.price for f in found})
    if len(prices) == 1:
        return min(found, key=lambda f: f.sku), ""
    if len(prices) > 1:
        shown = ", ".join(f"{f.sku} {f.price:g}" for f in sorted(found, key=lambda f: f.sku))
        return None, f"{len(found)} products with usagetype *{item.usagetype} disagree ({shown})"
    if refused:
        return None, "; ".join(refused)
    where = "(global)" if item.global_ else f"in {region}"
    return None, f"no {item.service} product with usagetype *{item.usagetype} {where}"


def _filters(region: str, item: Item) -> list[dict[str, str]]:
    scope = () if item.global_ else (("regionCode", region),)
    return [{"Type": "TERM_MATCH", "Field": f, "Value": v} for f, v in scope + item.filters]


def get_products(pricing, service: str, filters: list[dict[str, str]],
                 sleep: Callable[[float], None] = time.sleep) -> list[Any]:
    """Every page of one query, each page retried with backoff while the API throttles."""
    out: list[Any] = []
    token: Optional[str] = None
    while True:
        kwargs: dict[str, Any] = {"ServiceCode": service, "Filters": filters, "FormatVersion": "aws_v1",
                                  "MaxResults": 100}
        if token:
            kwargs["NextToken"] = token
        # Throttling and 5xx are tried again with the project's full-jitter backoff; anything else raises.
        page = retry(lambda: pricing.get_products(**kwargs), attempts=ATTEMPTS,
                     backoff=Backoff(base=0.5, cap=20.0), sleep=sleep)
        out.extend(page.get("PriceList", []))
        token = page.get("NextToken")
        if not token:
            return out


Answers = dict[tuple[str, str, tuple[tuple[str, str], ...]], list[Any]]


def fetch_region(pricing, region: str, sleep: Callable[[float], None] = time.sleep, answers: Optional[Answers] = None
                 ) -> tuple[dict[str, Figure], dict[str, str]]:
    """(figures, missing with reasons) for one region; one query per distinct (region, service, filters), and
    the global ones once for every region sharing `answers`."""
    answers = {} if answers is None else answers
    figures: dict[str, Figure] = {}
    missing: dict[str, str] = {}
    for key, item in ITEMS.items():
        q = ("" if item.global_ else region, item.service, item.filters)
        if q not in answers:
            answers[q] = get_products(pricing, item.service, _filters(region, item), sleep)
        fig, why = pick(answers[q], key, item, region)
        if fig is None:
            missing[key] = why
        else:
            figures[key] = fig
    return figures, missing


def merge(book: dict[str, Any], fetched: dict[str, tuple[dict[str, Figure], dict[str, str]]], today: str
          ) -> dict[str, Any]:
    """The new service_prices.json: fetched regions replaced (keeping figures not fetched here)."""
    out = json.loads(json.dumps(book))
    for name in ("regions", "figures", "missing", "region_as_of"):
        out.setdefault(name, {})
    for region, (figures, missing) in sorted(fetched.items()):
        kept = {k: v for k, v in out["regions"].get(region, {}).items() if k not in ITEMS}
        out["regions"][region] = {**{k: f.price for k, f in figures.items()}, **kept}
        out["figures"][region] = {k: {"sku": f.sku, "usagetype": f.usagetype, "rate_code": f.rate_code,
                                      "published": f.publication} for k, f in figures.items()}
        out["missing"][region] = dict(missing)
        pubs = [f.publication[:10] for f in figures.values() if f.publication]
        out["region_as_of"][region] = max(pubs) if pubs else today
        if not out["missing"][region]:
            del out["missing"][region]
    for name in ("regions", "figures", "missing", "region_as_of"):
        out[name] = dict(sorted(out[name].items()))
    out["price_list"] = {"fetched": today, "endpoint": PRICING_REGION,
                         "items": {k: f"{i.service} {i.usagetype} ({i.unit}{' x %g' % i.scale if i.scale != 1 else ''})"
                                   for k, i in ITEMS.items()}}
    return out


def render(book: dict[str, Any]) -> str:
    return json.dumps(book, indent=1, sort_keys=False) + "\n"


def main(argv: list[str] | None = None, pricing=None, sleep: Callable[[float], None] = time.sleep) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--regions", help="comma-separated (default: every region in dl_selector/data/prices/)")
    ap.add_argument("--out", default=str(DATA / "service_prices.json"))
    ap.add_argument("--date", help="the run's date, YYYY-MM-DD (default: today, UTC)")
    a = ap.parse_args(argv)
    known = instance_regions()
    regions = [r.strip() for r in (a.regions or ",".join(known)).split(",") if r.strip()]
    unknown = [r for r in regions if r not in known]
    if unknown:
        import difflib
        near = difflib.get_close_matches(unknown[0], known, n=1)
        print(f"error: --regions {unknown[0]} is not a region the selector prices instances in "
              f"(dl_selector/data/prices/){f'; closest: {near[0]}' if near else ''}", file=sys.stderr)
        return 2
    today = a.date or dt.datetime.now(dt.timezone.utc).date().isoformat()
    out = Path(a.out)
    try:
        book = json.loads(out.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        print(f"error: cannot read {out}: {e}", file=sys.stderr)
        return 2
    if pricing is None:
        import boto3
        pricing = boto3.client("pricing", region_name=PRICING_REGION)
    from botocore.exceptions import BotoCoreError, ClientError
    fetched = {}
    answers: Answers = {}
    try:
        for region in regions:
            fetched[region] = fetch_region(pricing, region, sleep, answers)
            got, miss = fetched[region]
            print(f"{region}: {len(got)} figures" + (f", missing {', '.join(sorted(miss))}" if miss else ""))
    except (ClientError, BotoCoreError) as e:
        print(f"error: the Price List API failed at {region}: {e}; nothing written", file=sys.stderr)
        return 1
    out.write_text(render(merge(book, fetched, today)), encoding="utf-8")
    print(f"{out} written ({len(fetched)} regions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
