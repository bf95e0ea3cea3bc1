"""`catalog refresh`: rebuild the catalog from the EC2 APIs (boto3 is imported only here).

- specs: DescribeInstanceTypes (every accelerated type the accelerator table knows);
- where each type is offered: DescribeInstanceTypeOfferings per region;
- spot: DescribeSpotPriceHistory, the median of the latest price in each AZ;
- on-demand: the Price List API (pricing, us-east-1) where reachable.
Prices the live APIs do not give keep the cited figure from data/prices.csv.
"""
from __future__ import annotations

import datetime as dt
import os
import statistics
import sys
from typing import Any, Callable, Iterable, Optional

from .accelerators import load_accelerators
from .build import accelerator_of, facts_from_record, legacy_facts, load_capacity_blocks, load_legacy
from .catalog import Catalog
from .facts import Price
from .prices import PriceTable, load_prices

PRICED_REGIONS = ("us-east-1", "us-west-2", "eu-west-1", "ap-northeast-2")
Log = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr)


def describe_accelerated_types(ec2, accelerators) -> tuple[list[dict[str, Any]], list[str]]:
    records, unknown_accels = [], set()
    for page in ec2.get_paginator("describe_instance_types").paginate():
        for r in page["InstanceTypes"]:
            acc = accelerator_of(r)
            if acc is None:
                continue
            if acc["name"] in accelerators:
                records.append(r)
            elif acc["name"] != "U30":  # vt1's video transcoder is not a DL accelerator
                unknown_accels.add(acc["name"])
    return records, sorted(unknown_accels)


def offered_in(ec2, names: list[str]) -> set[str]:
    found: set[str] = set()
    for i in range(0, len(names), 100):
        pages = ec2.get_paginator("describe_instance_type_offerings").paginate(
            LocationType="region", Filters=[{"Name": "instance-type", "Values": names[i:i + 100]}])
        for page in pages:
            found.update(o["InstanceType"] for o in page["InstanceTypeOfferings"])
    return found


def spot_medians(ec2, names: list[str], now: dt.datetime) -> dict[str, float]:
    latest: dict[tuple[str, str], tuple[dt.datetime, float]] = {}
    pages = ec2.get_paginator("describe_spot_price_history").paginate(
        InstanceTypes=names, ProductDescriptions=["Linux/UNIX"], StartTime=now - dt.timedelta(days=1))
    for page in pages:
        for h in page["SpotPriceHistory"]:
            key = (h["InstanceType"], h["AvailabilityZone"])
            ts = h.get("Timestamp") or now
            price = float(h["SpotPrice"])
            if price > 0 and (key not in latest or ts > latest[key][0]):
                latest[key] = (ts, price)
    by_type: dict[str, list[float]] = {}
    for (name, _az), (_ts, price) in latest.items():
        by_type.setdefault(name, []).append(price)
    return {n: round(statistics.median(v), 6) for n, v in by_type.items()}


def on_demand_prices(pricing, names: Iterable[str], region: str) -> dict[str, float]:
    import json
    out = {}
    for name in names:
        resp = pricing.get_products(ServiceCode="AmazonEC2", Filters=[
            {"Type": "TERM_MATCH", "Field": f, "Value": v} for f, v in (
                ("instanceType", name), ("regionCode", region), ("operatingSystem", "Linux"),
                ("tenancy", "Shared"), ("preInstalledSw", "NA"), ("capacitystatus", "Used"))])
        for item in resp.get("PriceList", []):
            product = json.loads(item) if isinstance(item, str) else item
            for term in product.get("terms", {}).get("OnDemand", {}).values():
                for dim in term.get("priceDimensions", {}).values():
                    usd = float(dim.get("pricePerUnit", {}).get("USD", 0) or 0)
                    if usd > 0:
                        out[name] = usd
    return out


def refresh(
    *,
    regions: Optional[list[str]] = None,
    live_prices: bool = True,
    session: Any = None,
    price_table: Optional[PriceTable] = None,
    specs_source: Optional[str] = None,
    today: Optional[dt.date] = None,
    log: Log = _stderr,
) -> Catalog:
    import boto3  # only the refresh path pays for boto3
    from botocore.exceptions import BotoCoreError, ClientError

    session = session or boto3.session.Session()
    home = session.region_name or "us-east-1"
    today = today or dt.date.today()
    accelerators = load_accelerators()
    price_table = price_table if price_table is not None else load_prices()
    ec2 = session.client("ec2", region_name=home)

    records, unknown_accels = describe_accelerated_types(ec2, accelerators)
    for name in unknown_accels:
        log(f"warning: accelerator {name!r} has no row in selector/data/accelerators.csv; its types are left out")
    names = sorted(r["InstanceType"] for r in records)
    if regions is None:
        regions = sorted(r["RegionName"] for r in ec2.describe_regions()["Regions"])
    offered: dict[str, set[str]] = {n: set() for n in names}
    for region in regions:
        for n in offered_in(session.client("ec2", region_name=region), names):
            offered[n].add(region)

    prices: dict[str, dict[str, Price]] = {n: dict(price_table.get(n, {})) for n in names}
    notes = ["prices without a live source are cited from selector/data/prices.csv"]
    if live_prices:
        stamp = today.isoformat()
        pricing = session.client("pricing", region_name="us-east-1")
        for region in [r for r in regions if r in PRICED_REGIONS or len(regions) <= 4]:
            here = [n for n in names if region in offered[n]]
            try:
                spot = spot_medians(session.client("ec2", region_name=region), here, dt.datetime.now(dt.timezone.utc))
            except (BotoCoreError, ClientError) as e:
                log(f"warning: spot price history unavailable in {region} ({e}); keeping cited spot prices")
                spot = {}
            try:
                od = on_demand_prices(pricing, here, region)
            except (BotoCoreError, ClientError) as e:
                log(f"warning: Price List API unavailable ({type(e).__name__}); keeping cited on-demand prices")
                od = {}
            for n in here:
                old = prices[n].get(region)
                if n not in spot and n not in od:
                    continue
                prices[n][region] = Price(
                    on_demand=od.get(n, old.on_demand if old else None),
                    spot=spot.get(n, old.spot if old else None),
                    as_of=stamp,
                    source=" + ".join(s for s, ok in (("Price List API", n in od),
                                                      ("DescribeSpotPriceHistory median of AZs", n in spot)) if ok)
                    + ("; rest cited: " + old.source if old and not (n in od and n in spot) else ""),
                )

    legacy = load_legacy()
    blocks = load_capacity_blocks()
    source = specs_source or f"EC2 DescribeInstanceTypes via {ec2.meta.endpoint_url} on {today.isoformat()}"
    types = {r["InstanceType"]: facts_from_record(r, accelerators, offered[r["InstanceType"]],
                                                   prices[r["InstanceType"]], legacy["retired"], source, blocks)
             for r in records}
    for name in sorted(set(blocks) - set(types)):
        log(f"warning: {name} in selector/data/capacity_blocks.toml is not in the EC2 records; nothing marked")
    for f in legacy_facts(legacy, accelerators, price_table):
        types.setdefault(f.instance_type, f)
    return Catalog(
        as_of=today.isoformat(),
        specs_source=source,
        regions=tuple(sorted(set(regions))),
        types=dict(sorted(types.items())),
        notes=tuple(notes),
    )


def check_writable(out: str) -> None:
    """Refuse an --out that cannot be written (a directory, a missing or read-only folder)."""
    from .errors import UserError
    from .validate import clean
    out = str(out)
    folder = os.path.dirname(os.path.abspath(out))
    if os.path.isdir(out):
        raise UserError(f"--out {clean(out)} is a directory; pass a file name such as {clean(os.path.join(out, 'catalog.json'))}")
    if not os.path.isdir(folder):
        raise UserError(f"--out {clean(out)}: folder {clean(folder)} does not exist")
    if not os.access(folder, os.W_OK):
        raise UserError(f"--out {clean(out)}: folder {clean(folder)} is not writable")


def write_catalog(catalog: Catalog, out) -> None:
    """Write all or nothing: serialise first (strict JSON, no NaN), then rename a temporary file
    over `out`, so that an error never leaves a half-written or empty catalog behind."""
    import json
    import tempfile
    from .errors import UserError
    from .validate import clean
    out = str(out)
    check_writable(out)
    try:
        text = json.dumps(catalog.to_dict(), indent=1, sort_keys=False, allow_nan=False) + "\n"
    except ValueError as e:
        raise UserError(f"catalog refresh produced a non-finite number ({e}); nothing written to {clean(out)}") from None
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=".catalog-", suffix=".json", dir=os.path.dirname(os.path.abspath(out)))
        with os.fdopen(fd, "w") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would make the catalog private to its writer
        os.replace(tmp, out)
    except OSError as e:
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)
        raise UserError(f"cannot write {clean(out)}: {e.strerror or e}; nothing written") from None
