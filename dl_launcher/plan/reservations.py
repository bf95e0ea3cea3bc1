"""Reservation lines: this account's active or scheduled Capacity Reservations and Capacity Blocks
(DescribeCapacityReservations) of the plan's types, with how many instances each has free.

Capacity the account holds ranks first: an on-demand reservation bills at the on-demand rate
whether instances run in it or not, and a Capacity Block was paid for at purchase."""
from __future__ import annotations

from typing import Any, Callable, Iterable

from dl_core.aws import brief
from dl_core.markets import CAPACITY_BLOCK, ON_DEMAND

from .lines import DATED, HELD, NOW, UNKNOWN, Line, iso, launch_context
from .request import Request

STATES = ("active", "scheduled")  # usable now, or from a start already bought


def lines(req: Request, types: dict[str, dict[str, Any]], ec2: Callable[[str], Any]) -> tuple[list[Line], list[dict]]:
    """types: {region: {instance type: its facts}} of every market's candidates there."""
    from botocore.exceptions import BotoCoreError, ClientError

    out: list[Line] = []
    degraded: list[dict] = []
    for region, facts in types.items():
        if not facts:
            continue
        try:
            found = _reservations(ec2(region), facts)
        except (BotoCoreError, ClientError) as e:
            degraded.append({"market": "reservation", "region": region, "instance_type": None,
                             "reason": f"reservations not read ({brief(e)})"})
            continue
        out += [_line(req, region, r, facts[r["InstanceType"]]) for r in found if r.get("InstanceType") in facts]
    return out, degraded


def _reservations(client: Any, types: Iterable[str]) -> list[dict]:
    pages = client.get_paginator("describe_capacity_reservations").paginate(
        Filters=[{"Name": "state", "Values": list(STATES)}, {"Name": "instance-type", "Values": sorted(types)}])
    return [r for page in pages for r in page.get("CapacityReservations", [])]


def _line(req: Request, region: str, r: dict, facts) -> Line:
    block = r.get("ReservationType") == "capacity-block"
    market = CAPACITY_BLOCK if block else ON_DEMAND
    itype, rid = r["InstanceType"], r.get("CapacityReservationId", "")
    free, total = int(r.get("AvailableInstanceCount", 0)), int(r.get("TotalInstanceCount", 0))
    price = facts.price(region)
    usd = None if block or price is None or price.on_demand is None else price.on_demand * req.nodes
    kind = "Capacity Block" if block else "Capacity Reservation"
    line = Line("reservation", region, itype, req.nodes, usd, None, "",
                launch_context(req.profile, itype, req.nodes, market, region, reservation=rid),
                availability_zone=r.get("AvailabilityZone"), source="account", reservation_id=rid)
    held = f"your {kind} {rid} ({r.get('State')}): {free} of {total} free"
    if free < req.nodes:
        line.group, line.start_note = UNKNOWN, f"too small now: {held}, {req.nodes} needed"
    elif r.get("State") == "active":
        line.earliest_start, line.group, line.start_note = NOW, HELD, held
    else:
        line.earliest_start = iso(r["StartDate"]) if "StartDate" in r else None
        line.group, line.start_note = (DATED if line.earliest_start else UNKNOWN), f"{held}, from its start"
    if "EndDate" in r:
        line.notes.append(f"ends {iso(r['EndDate'])}")
    line.notes.append("paid for at purchase" if block else
                      "billed at the on-demand rate whether instances run in it or not")
    return line
