"""Today's Capacity Block rates, from what EC2 quotes (DescribeCapacityBlockOfferings).

AWS publishes Capacity Block rates on a web page it revises with supply and demand, and a block
costs what EC2 quotes at purchase; the Price List API lists Capacity Block products at $0.00 (the
reservation fee is charged up front, outside it). So the live rate is the cheapest offering EC2
quotes now: upfront fee / (instances x hours), for one instance over the shortest block (24 h).
"""
from __future__ import annotations

import datetime as dt
from typing import Any, Callable, Iterable, Optional

from .facts import CapacityBlockPrice
from .live_prices import iso_minute
from .prices import implausible

Log = Callable[[str], None]
BLOCK_HOURS = 24  # the shortest block EC2 sells; longer blocks are priced per hour alike


def hourly_rate(offering: dict[str, Any]) -> Optional[float]:
    """USD per instance-hour of one offering, or None when it is not in USD or not a number."""
    if offering.get("CurrencyCode", "USD") != "USD":
        return None
    try:
        fee = float(offering["UpfrontFee"])
        hours = float(offering.get("CapacityBlockDurationHours") or BLOCK_HOURS)
        count = int(offering.get("InstanceCount") or 1)
    except (KeyError, TypeError, ValueError):
        return None
    return fee / (hours * count) if hours > 0 and count > 0 else None


def quote_rates(
    ec2: Any,
    instance_types: Iterable[str],
    *,
    now: Optional[dt.datetime] = None,
    log: Log = lambda _msg: None,
) -> dict[str, CapacityBlockPrice]:
    """{instance type: cheapest quoted rate} for the types EC2 offers blocks of in ec2's region.

    A type EC2 refuses (not sold as blocks there) or quotes nothing for is left out, with one log
    line; an implausible quote (zero, below the sanity bound) is dropped with its reason."""
    from botocore.exceptions import BotoCoreError, ClientError

    now = now or dt.datetime.now(dt.timezone.utc)
    region = ec2.meta.region_name
    out: dict[str, CapacityBlockPrice] = {}
    for name in instance_types:
        rates: list[float] = []
        try:
            pages = ec2.get_paginator("describe_capacity_block_offerings").paginate(
                InstanceType=name, InstanceCount=1, CapacityDurationHours=BLOCK_HOURS)
            for page in pages:
                for offering in page.get("CapacityBlockOfferings", []):
                    rate = hourly_rate(offering)
                    why = implausible(rate, kind="capacity-block") if rate is not None else "not a USD figure"
                    if why:
                        log(f"warning: {name} in {region}: Capacity Block offering "
                            f"{offering.get('CapacityBlockOfferingId', '?')} dropped: {why}")
                    else:
                        rates.append(rate)
        except (BotoCoreError, ClientError) as e:
            log(f"warning: {name} in {region}: no Capacity Block quote ({e}); keeping the rate on record, if any")
            continue
        if not rates:
            log(f"warning: {name} in {region}: EC2 quotes no Capacity Block offering now; keeping the rate on record, if any")
            continue
        out[name] = CapacityBlockPrice(
            usd_per_hour=round(min(rates), 4), as_of=iso_minute(now),
            source=f"DescribeCapacityBlockOfferings in {region}: cheapest of {len(rates)} offering(s) "
                   f"for 1 x {name} x {BLOCK_HOURS} h")
    return out
