"""What `plan` is asked (N nodes of a GPU or a profile, in some regions) and the types that answer
it in each market, ranked by the selector as `recommend` ranks them; and the catalog-priced line
of one type, which is all `plan` can say offline, and what a market falls back to when AWS will not
answer."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from dl_core.markets import CAPACITY_BLOCK, ON_DEMAND, SPOT

from ..errors import CliError
from .lines import Line, launch_context

MARKETS = (SPOT, ON_DEMAND, CAPACITY_BLOCK)
# EC2's Capacity Block durations (DescribeCapacityBlockOfferings' CapacityDurationHours): 1-day
# steps up to 14 days, 7-day steps up to 182 days.
BLOCK_DAYS = tuple(range(1, 15)) + tuple(range(21, 183, 7))
# dl_stacks.settings.NODES, the stack's -c nodes bounds (a test checks they agree): importing that
# module brings the node runtime's contract along, a second of start for a check of two numbers.
NODES = (1, 64)
NEEDS_ACCOUNT = {SPOT: "placement score needs an account", ON_DEMAND: "quota headroom needs an account",
                 CAPACITY_BLOCK: "offerings (start, total price) need an account"}


@dataclass(frozen=True)
class Request:
    nodes: int
    profile: str
    regions: tuple[str, ...]
    gpu: Optional[str] = None  # as given (MODEL:COUNT), for the header and --json
    accelerator: Optional[str] = None
    count: Optional[int] = None
    memory_gb: float = 0.0
    top: int = 3  # types per market and region
    block_hours: int = 24


def parse(nodes: int, gpu: Optional[str], profile: Optional[str], regions: list[str], top: int,
          block_hours: int) -> Request:
    """Every input checked before any AWS call: one line (CliError) naming what is allowed."""
    from dl_selector.catalog import load_catalog
    from dl_selector.recommend_args import GPU_ONLY_PROFILE
    from dl_selector.errors import UserError
    from dl_selector.profiles import get_profile
    from dl_selector.requirements import memory_variants, parse_gpu

    lo, hi = NODES
    if not lo <= nodes <= hi:
        raise CliError(f"--nodes {nodes}: expected a whole number from {lo} to {hi} (one cluster, as -c nodes takes "
                       f"it); closest: {min(max(nodes, lo), hi)}")
    if (gpu is None) == (profile is None):
        raise CliError("plan needs one of --gpu MODEL:COUNT (e.g. --gpu H100:8) or --profile NAME (see `dl-launcher "
                       "profiles`)")
    if block_hours % 24 or block_hours // 24 not in BLOCK_DAYS:
        days = max(1, round(block_hours / 24))
        near = min(BLOCK_DAYS, key=lambda d: abs(d - days)) * 24
        raise CliError(f"--block-hours {block_hours}: EC2 sells Capacity Blocks of 24 to 336 hours in steps of 24, "
                       f"then to 4368 in steps of 168; closest: {near}")
    if top < 1:
        raise CliError(f"--top {top}: expected a whole number from 1 (types per market and region); closest: 1")
    catalog = load_catalog()
    try:
        checked = tuple(dict.fromkeys(catalog.check_region(r.strip()) for r in regions if r.strip()))
    except UserError as e:
        raise CliError(f"--regions: {e}") from None
    if not checked:
        raise CliError("--regions is empty: name one or more regions, e.g. --regions us-east-1,us-west-2")
    try:
        accelerator, count, memory = None, None, 0.0
        if gpu is not None:
            accelerator, count, memory = parse_gpu(gpu, {f.accelerator for f in catalog}, memory_variants(catalog))
        name = profile if profile is not None else GPU_ONLY_PROFILE
        get_profile(name)  # unknown: the closest names
    except UserError as e:
        raise CliError(str(e)) from None
    return Request(nodes, name, checked, gpu, accelerator, count, memory, top, block_hours)


def ranked(req: Request, market: str, region: str) -> list:
    """The selector's ranking of the types that meet the request in `market` there, best first (at
    most req.top). For several nodes, types without EFA are left out as the multi-node profiles do."""
    from dl_selector.recommend import recommend
    from dl_selector.requirements import Filters

    filters = (Filters(accelerator=req.accelerator, count=req.count, min_memory_gb=req.memory_gb)
               if req.accelerator else None)
    rec = recommend(req.profile, region=region, market=market, filters=filters)
    out = [c for c in rec.candidates if req.nodes == 1 or c.facts.efa]
    return out[:req.top]


def catalog_line(req: Request, market: str, region: str, candidate, note: str) -> Line:
    """`candidate`'s line priced from the catalog: N x its rate in `market`, start not known."""
    rate = candidate.hourly(market)
    hours = req.block_hours if market == CAPACITY_BLOCK else None
    usd = None if rate is None else rate * req.nodes
    line = Line(market, region, candidate.instance_type, req.nodes, usd, None, note,
                launch_context(req.profile, candidate.instance_type, req.nodes, market, region,
                               reservation="<the cr- id the purchase returns>" if market == CAPACITY_BLOCK else None),
                duration_hours=hours, total_usd=None if usd is None or hours is None else usd * hours)
    if market == CAPACITY_BLOCK:
        line.before = (f"aws ec2 describe-capacity-block-offerings --region {region} --instance-type "
                       f"{candidate.instance_type} --instance-count {req.nodes} --capacity-duration-hours {hours}, "
                       "then aws ec2 purchase-capacity-block --capacity-block-offering-id ID --instance-platform "
                       "Linux/UNIX")
    if market == SPOT and getattr(candidate, "spot_untrusted", False):
        line.notes.append("the selector sets this spot quote aside (one AZ's undated quote far below on-demand): "
                          "confirm it with `dl-launcher recommend --spot --live`")
    if rate is None:
        line.notes.append(f"no {market} price on record for {candidate.instance_type} in {region}")
    return line
