"""The text of a plan: a header, one block per line (rank, market, type, where, $/h, start, then
what to run), and what could not be read."""
from __future__ import annotations

from . import ACCOUNT_COLUMNS, Plan


def text(plan: Plan) -> str:
    r = plan.request
    what = f"--gpu {r.gpu} (profile {r.profile})" if r.gpu else f"profile {r.profile}"
    out = [f"plan: {r.nodes} node(s), {what}, in {', '.join(r.regions)}; Capacity Blocks of {r.block_hours} h"]
    if plan.offline:
        out.append(f"offline ({plan.offline}): catalog prices only, no start is known; these need an account: "
                   f"{'; '.join(ACCOUNT_COLUMNS)}")
    if not plan.lines:
        efa = "; for more than one node, types without EFA are left out" if r.nodes > 1 else ""
        out.append(f"no instance type meets the request in these regions{efa}: `dl-launcher recommend` says why "
                   "each is excluded")
    for i, line in enumerate(plan.lines, 1):
        where = line.region + (f" ({line.availability_zone})" if line.availability_zone else "")
        price = "unpriced" if line.usd_per_hour is None else f"${line.usd_per_hour:,.2f}/h"
        total = f", ${line.total_usd:,.0f} for {line.duration_hours} h" if line.total_usd is not None else ""
        start = line.earliest_start or "not known"
        out.append(f"{i:>2}. {line.market} {line.nodes} x {line.instance_type} in {where}: {price}{total}; "
                   f"start {start}")
        if line.start_note:
            out.append(f"    {line.start_note}")
        for note in line.notes:
            out.append(f"    {note}")
        if line.before:
            out.append(f"    first: {line.before}")
        out.append(f"    {'then' if line.before else 'take it'}: {line.command()}")
    for d in plan.degraded:
        which = f" {d['instance_type']}" if d.get("instance_type") else ""
        out.append(f"degraded: {d['market']}{which} in {d['region']}: {d['reason']}")
    return "\n".join(out)
