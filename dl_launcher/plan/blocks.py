"""Capacity Block lines: what EC2 offers now for N instances of a type for the block's length
(DescribeCapacityBlockOfferings): each offering's start, length, AZ and upfront fee, which is the
price of the whole block (the $/h shown is that fee over its hours)."""
from __future__ import annotations

from typing import Any, Callable

from dl_core.aws import brief
from dl_core.markets import CAPACITY_BLOCK
from .lines import DATED, Line, iso, launch_context
from .request import Request, catalog_line

OFFERINGS_PER_TYPE = 3  # the earliest few per type and region: later ones rarely matter, and print long
PLATFORM = "Linux/UNIX"  # the Deep Learning AMI's


def lines(req: Request, ranked: dict[str, list], ec2: Callable[[str], Any]) -> tuple[list[Line], list[dict]]:
    from botocore.exceptions import BotoCoreError, ClientError

    from dl_selector.capacity_block_quotes import hourly_rate  # the selector's rule for an offering's rate

    out: list[Line] = []
    degraded: list[dict] = []
    for region, cands in ranked.items():
        for c in cands:
            try:
                pages = ec2(region).get_paginator("describe_capacity_block_offerings").paginate(
                    InstanceType=c.instance_type, InstanceCount=req.nodes, CapacityDurationHours=req.block_hours)
                offerings = [o for page in pages for o in page.get("CapacityBlockOfferings", [])]
            except (BotoCoreError, ClientError) as e:
                why = f"offerings not read ({brief(e)})"
                degraded.append({"market": CAPACITY_BLOCK, "region": region, "instance_type": c.instance_type,
                                 "reason": why})
                out.append(catalog_line(req, CAPACITY_BLOCK, region, c, why))
                continue
            priced = [(o, hourly_rate(o)) for o in offerings if "StartDate" in o]
            priced = sorted(((o, r) for o, r in priced if r is not None), key=lambda x: (x[0]["StartDate"], x[1]))
            if not priced:
                line = catalog_line(req, CAPACITY_BLOCK, region, c,
                                    f"EC2 offers no block of {req.nodes} x {c.instance_type} for {req.block_hours} h now")
                line.source = "account"
                out.append(line)
                continue
            out += [_line(req, region, o, rate) for o, rate in priced[:OFFERINGS_PER_TYPE]]
    return out, degraded


def _line(req: Request, region: str, o: dict, rate: float) -> Line:
    count = int(o.get("InstanceCount") or req.nodes)
    hours = int(o.get("CapacityBlockDurationHours") or req.block_hours)
    itype = o.get("InstanceType", "")
    offering = o.get("CapacityBlockOfferingId", "")
    start = iso(o["StartDate"])
    end = f" to {iso(o['EndDate'])}" if "EndDate" in o else ""
    line = Line(CAPACITY_BLOCK, region, itype, count, rate * count, start,
                f"block of {hours} h from {start}{end}, paid up front",
                launch_context(req.profile, itype, count, CAPACITY_BLOCK, region,
                               reservation="<the cr- id the purchase returns>"),
                before=(f"aws ec2 purchase-capacity-block --region {region} --capacity-block-offering-id {offering} "
                        f"--instance-platform {PLATFORM}"),
                availability_zone=o.get("AvailabilityZone"), source="account", duration_hours=hours,
                total_usd=float(o["UpfrontFee"]), offering_id=offering, group=DATED)
    line.notes.append("the purchase is final and charged at once; the nodes launch into the block from its start")
    return line
