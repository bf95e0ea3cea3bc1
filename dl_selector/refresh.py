"""`catalog refresh`: rebuild the catalog from the EC2 APIs (boto3 is imported only here).

- specs: DescribeInstanceTypes (every accelerated type the accelerator table knows);
- where each type is offered: DescribeInstanceTypeOfferings per region;
- prices: live_prices (DescribeSpotPriceHistory per AZ, the Price List API once per region),
  each figure checked by prices.implausible().
Prices the live APIs do not give, or give implausibly, keep the cited figure from data/prices.csv.
"""
from __future__ import annotations

import datetime as dt
import os
import sys
from typing import Any, Callable, Optional

from .accelerators import load_accelerators
from .build import accelerator_of, facts_from_record, legacy_facts, load_capacity_blocks, load_legacy
from .catalog import Catalog
from .live_prices import PRICED_REGIONS
from .prices import PriceTable, load_prices

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

    session = session or boto3.session.Session()
    home = session.region_name or "us-east-1"
    today = today or dt.date.today()
    accelerators = load_accelerators()
    price_table = price_table if price_table is not None else load_prices()
    ec2 = session.client("ec2", region_name=home)

    records, unknown_accels = describe_accelerated_types(ec2, accelerators)
    for name in unknown_accels:
        log(f"warning: accelerator {name!r} has no row in dl_selector/data/accelerators.csv; its types are left out")
    names = sorted(r["InstanceType"] for r in records)
    if regions is None:
        regions = sorted(r["RegionName"] for r in ec2.describe_regions()["Regions"])
    offered: dict[str, set[str]] = {n: set() for n in names}
    for region in regions:
        for n in offered_in(session.client("ec2", region_name=region), names):
            offered[n].add(region)

    prices: PriceTable = {n: dict(price_table.get(n, {})) for n in names}
    notes = ["prices without a live source are cited from dl_selector/data/prices.csv"]
    blocks = load_capacity_blocks()
    if live_prices:
        from .live_prices import live_table
        priced = [r for r in regions if r in PRICED_REGIONS or len(regions) <= 4]
        # Capacity-Block-only types have no on-demand or spot market to quote.
        table, summaries = live_table(prices, {r: [n for n in names if r in offered[n]
                                                   and not (blocks.get(n) or {}).get("only")]
                                               for r in priced},
                                      session=session, max_age_minutes=0, require_some=False, log=log)
        for n, by_region in table.items():
            prices[n].update(by_region)
        notes.append("live prices: " + " | ".join(s.line() for s in summaries))

    legacy = load_legacy()
    source = specs_source or f"EC2 DescribeInstanceTypes via {ec2.meta.endpoint_url} on {today.isoformat()}"
    types = {r["InstanceType"]: facts_from_record(r, accelerators, offered[r["InstanceType"]],
                                                   prices[r["InstanceType"]], legacy["retired"], source, blocks)
             for r in records}
    for name in sorted(set(blocks) - set(types)):
        log(f"warning: {name} in dl_selector/data/capacity_blocks.toml is not in the EC2 records; nothing marked")
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
    """Write all or nothing: serialise first (strict JSON, no NaN), then write_text."""
    import json
    from .errors import UserError
    from .validate import clean
    out = str(out)
    check_writable(out)
    try:
        text = json.dumps(catalog.to_dict(), indent=1, sort_keys=False, allow_nan=False) + "\n"
    except ValueError as e:
        raise UserError(f"catalog refresh produced a non-finite number ({e}); nothing written to {clean(out)}") from None
    write_text(out, text)


def write_text(out: str, text: str) -> None:
    """Rename a temporary file over `out`, so that an error never leaves a half-written or empty
    file behind; UserError (one line) where it cannot be written."""
    import tempfile
    from .errors import UserError
    from .validate import clean
    out = str(out)
    check_writable(out)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=".dl-launcher-", suffix=".tmp", dir=os.path.dirname(os.path.abspath(out)))
        with os.fdopen(fd, "w") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would make the file private to its writer
        os.replace(tmp, out)
    except OSError as e:
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)
        raise UserError(f"cannot write {clean(out)}: {e.strerror or e}; nothing written") from None