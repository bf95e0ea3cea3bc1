"""`dl-launcher plan --nodes N (--gpu MODEL:COUNT | --profile P)`: when can I have N nodes, and for
how much? One ranked list across spot (placement scores), on-demand (quota headroom), Capacity
Block offerings and the account's own reservations, each line with the $/h of the N nodes, the
earliest start and the `-c` keys that take it. Read-only: only Describe/Get/List calls. Without an
account it prints the catalog-priced lines and names the columns that need one; an API that
refuses or throttles degrades its market's lines, with the reason, and nothing else.

A module per market (spot, on_demand, blocks, reservations); lines.py holds a line, its JSON keys
and the ranking rule; render.py the text."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from dl_core.markets import CAPACITY_BLOCK, ON_DEMAND, SPOT

from .lines import Line, sort_key
from .request import MARKETS, NEEDS_ACCOUNT, Request, catalog_line, parse, ranked

__all__ = ["ACCOUNT_COLUMNS", "Plan", "Request", "build", "parse"]

Clients = Callable[[str, str], Any]  # (service, region) -> a boto3 client
# What only an account can answer, as the offline header and --json's needs_account name it.
ACCOUNT_COLUMNS = ("spot placement scores", "on-demand quota headroom", "Capacity Block offerings (start, total price)",
                   "your reservations")


@dataclass
class Plan:
    request: Request
    lines: list[Line]
    degraded: list[dict] = field(default_factory=list)
    offline: Optional[str] = None  # why no account was asked ("--offline", "no AWS credentials")

    def to_dict(self) -> dict[str, Any]:
        r = self.request
        return {"nodes": r.nodes, "gpu": r.gpu, "profile": r.profile, "regions": list(r.regions),
                "block_hours": r.block_hours, "offline": self.offline is not None, "offline_reason": self.offline,
                "needs_account": list(ACCOUNT_COLUMNS) if self.offline else [],
                "degraded": list(self.degraded), "lines": [line.to_dict(i) for i, line in enumerate(self.lines, 1)]}


def build(req: Request, clients: Optional[Clients], offline: Optional[str] = None) -> Plan:
    """Every line for `req`, ranked (lines.sort_key). clients None: offline, catalog prices only."""
    by_market = {m: {region: ranked(req, m, region) for region in req.regions} for m in MARKETS}
    lines: list[Line] = []
    degraded: list[dict] = []
    if clients is None:
        for m in MARKETS:
            for region, cands in by_market[m].items():
                lines += [catalog_line(req, m, region, c, NEEDS_ACCOUNT[m]) for c in cands]
    else:
        from . import blocks, on_demand, reservations, spot

        def ec2(region: str) -> Any:
            return clients("ec2", region)

        held = {region: {c.instance_type: c.facts for m in MARKETS for c in by_market[m][region]}
                for region in req.regions}
        for got, bad in (spot.lines(req, by_market[SPOT], ec2), on_demand.lines(req, by_market[ON_DEMAND], clients),
                         blocks.lines(req, by_market[CAPACITY_BLOCK], ec2), reservations.lines(req, held, ec2)):
            lines += got
            degraded += bad
    lines.sort(key=sort_key)
    return Plan(req, lines, degraded, offline)
