"""`-c bench=PLAN_FILE`: the benchmark stack's settings, from the plan `bench plan` wrote.

The plan fixes what is measured, where and for how long, so training keys next to `bench` are
refused rather than half-applied: a benchmark that silently ignored `-c nodes=4` would measure
something other than what the user thinks. `local` and the network keys (`vpc_id`, `subnet_ids`,
`availability_zone`: your own private subnets) still apply.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dl_selector.bench.contract import Plan
from dl_selector.catalog import load_catalog
from dl_selector.errors import UserError
from dl_selector.facts import InstanceFacts

from .context_keys import check_only
from .context_values import boolean, show
from .settings import network_from_context

ALLOWED = ("bench", "local", "vpc_id", "subnet_ids", "availability_zone")


@dataclass(frozen=True)
class BenchSettings:
    plan: Plan
    plan_file: str
    facts: tuple[InstanceFacts, ...]  # one per candidate, in the plan's order
    local: bool = False
    vpc_id: str | None = None
    subnet_ids: tuple[str, ...] = ()
    availability_zone: str | None = None


def bench_from_context(ctx: Mapping[str, Any]) -> BenchSettings | None:
    """BenchSettings when `bench` is given, else None (the training stack); UserError otherwise."""
    if "bench" not in ctx:
        return None
    check_only(ctx, ALLOWED, lambda key: (
        f"context bench takes everything from its plan file; drop {key} (allowed with bench: {', '.join(ALLOWED)}; "
        "change the plan with 'python -m dl_selector bench plan')"))
    path = ctx["bench"].strip()
    if not path:
        raise UserError("context bench is empty: pass the plan file, e.g. -c bench=bench-plan.json")
    from dl_selector.bench.collect import load_plan
    plan = load_plan(path)
    catalog = load_catalog()
    try:
        catalog.check_region(plan.region)
        facts = tuple(catalog.get(c.instance_type) for c in plan.candidates)
    except UserError as e:
        raise UserError(f"bench plan file {show(path)}: {e}") from None
    for c, f in zip(plan.candidates, facts):
        if plan.region not in f.regions:
            raise UserError(f"bench plan file {show(path)}: {c.instance_type} is not offered in {plan.region}")
        check_cap(path, plan, c, f)
    vpc_id, subnet_ids, az = network_from_context(ctx, plan.region)
    if vpc_id and not subnet_ids:
        raise UserError("context vpc_id with bench needs subnet_ids and availability_zone (the benchmark looks "
                        "nothing up); or leave all three out for a new VPC")
    return BenchSettings(plan=plan, plan_file=path, facts=facts, local=boolean("local", ctx.get("local", False)),
                         vpc_id=vpc_id, subnet_ids=subnet_ids, availability_zone=az)


def check_cap(path: str, plan: Plan, c: Any, f: InstanceFacts) -> None:
    """The plan's cap per hour is what the stack sends EC2 as the spot maximum price and what the
    summary promises: recomputed from the catalog (the on-demand price in the plan's region, never
    more), and a plan that says otherwise (edited by hand, or written from another catalog) is refused."""
    price = f.price(plan.region)
    on_demand = price.on_demand if price else None
    if on_demand is None:
        raise UserError(f"bench plan file {show(path)}: {c.instance_type} has no on-demand price on record in "
                        f"{plan.region}, so its cost cannot be capped; plan again with 'python -m dl_selector bench plan'")
    cap = c.max_price_per_hour
    if cap is None or not isinstance(cap, (int, float)) or abs(cap - on_demand) > 0.005:
        raise UserError(f"bench plan file {show(path)}: {c.instance_type} max_price_per_hour={cap!r}, but the catalog's "
                        f"on-demand price in {plan.region} is ${on_demand:.3f}/h (the cap is never above it); the plan "
                        "was edited or made from another catalog: plan again with 'python -m dl_selector bench plan'")
