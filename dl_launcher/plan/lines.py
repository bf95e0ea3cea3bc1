"""One line of `dl-launcher plan`: a way to get N nodes (a market, a type, a place), what it costs
per hour, when it can start, and what to run to take it. The JSON keys here are the stable
interface (docs/cli.md lists them); the ranking rule is `sort_key`."""
from __future__ import annotations

import datetime as dt
import shlex
from dataclasses import dataclass, field
from typing import Any, Optional

NOW = "now"

# Rank groups, best first: capacity the account already holds and pays for, capacity to be had
# now, capacity with a dated start (a Capacity Block), then anything whose start is not known
# (offline, a quota to raise, a poor placement score, a reservation too small).
HELD, NOW_GROUP, DATED, UNKNOWN = range(4)


@dataclass
class Line:
    market: str            # spot | on-demand | capacity-block | reservation
    region: str
    instance_type: str
    nodes: int
    usd_per_hour: Optional[float]  # the N nodes together; None: no price on record in this market
    earliest_start: Optional[str]  # "now", an ISO 8601 time, or None (not known: see start_note)
    start_note: str
    context: dict[str, str]        # the -c keys of `dl-launcher launch` / `cdk deploy` that take it
    before: Optional[str] = None   # a command to run first (buy the block, ask for the quota)
    availability_zone: Optional[str] = None
    source: str = "catalog"        # "catalog" (prices on record) or "account" (an answer from AWS)
    placement_score: Optional[int] = None
    quota: Optional[dict[str, Any]] = None
    duration_hours: Optional[int] = None
    total_usd: Optional[float] = None
    offering_id: Optional[str] = None
    reservation_id: Optional[str] = None
    group: int = UNKNOWN
    notes: list[str] = field(default_factory=list)

    def command(self) -> str:
        args = ["dl-launcher", "launch"]
        for key, value in self.context.items():
            args += ["-c", f"{key}={value}"]
        return shlex.join(args)

    def to_dict(self, rank: int) -> dict[str, Any]:
        return {"rank": rank, "market": self.market, "region": self.region,
                "availability_zone": self.availability_zone, "instance_type": self.instance_type,
                "nodes": self.nodes, "usd_per_hour": _money(self.usd_per_hour), "earliest_start": self.earliest_start,
                "start_note": self.start_note, "duration_hours": self.duration_hours,
                "total_usd": _money(self.total_usd), "placement_score": self.placement_score, "quota": self.quota,
                "offering_id": self.offering_id, "reservation_id": self.reservation_id, "source": self.source,
                "take": {"before": self.before, "context": dict(self.context), "command": self.command()},
                "notes": list(self.notes)}


def _money(x: Optional[float]) -> Optional[float]:
    return None if x is None else round(x, 2)


def sort_key(line: Line) -> tuple:
    """Group first (HELD .. UNKNOWN), then the earlier start, then the cheaper hour; unpriced last."""
    start = dt.datetime.max.replace(tzinfo=dt.timezone.utc)
    if line.earliest_start == NOW:
        start = dt.datetime.min.replace(tzinfo=dt.timezone.utc)
    elif line.earliest_start:
        start = dt.datetime.fromisoformat(line.earliest_start)
    price = line.usd_per_hour
    return (line.group, start, price is None, price or 0.0, line.market, line.region, line.instance_type)


def iso(when: dt.datetime) -> str:
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return when.astimezone(dt.timezone.utc).isoformat(timespec="minutes")


def launch_context(profile: str, instance_type: str, nodes: int, market: str, region: str,
                   reservation: Optional[str] = None) -> dict[str, str]:
    """The keys dl_stacks.settings.from_context reads for this capacity (docs/deploy.md#context-keys).
    No availability_zone: the stack takes one only with your own subnets there (vpc_id, subnet_ids);
    its own VPC spans the region's AZs and the fleet launches the cluster into one of them."""
    ctx = {"profile": profile, "instance_type": instance_type, "nodes": str(nodes), "market": market, "region": region}
    if reservation:
        ctx["capacity_reservation"] = reservation
    return ctx
