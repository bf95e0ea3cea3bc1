"""CDK context -> validated Settings. One clear line for anything wrong, before any stack exists.

What a job pays for, and what may replace its instance type (README, context keys):

- `market`: where the nodes launch. `spot`, `on-demand`, or `capacity-block` (into the Capacity
  Block for ML named by `capacity_reservation`). Default: spot when `spot` is true, else
  on-demand. `spot=true|false` still works and means market=spot|on-demand; naming both
  differently is an error.
- `capacity_reservation`: a reservation to launch into: an id like cr-0123456789abcdef0, or a
  resource group of reservations, arn:aws:resource-groups:REGION:ACCOUNT:group/NAME (in the
  deployment's region). Reservations are on-demand capacity: not with spot. market=capacity-block
  needs one.
- `max_price`: the cost ceiling, USD per hour per node; it caps every node in any market. No
  alternate priced above it in the job's market is used; an on-demand pick priced above it is
  refused; on spot it is also the max price EC2 enforces on every node, so a pick whose spot
  price on record is above it launches only while spot is at or below it. Default: the pick's
  own price in the market (so by default no alternate costs more than the pick; a spot pick with
  no spot price on record gets its on-demand price, the most spot can cost). Required where the
  pick has no price on record in the market (always for capacity-block: it stands for the
  block's price).
- `interchange`: which types may replace the pick for the same job, `same-accelerator` (default:
  a multi-node job keeps accelerator model, memory and count) or `same-count` (any model with the
  same count); see selector/interchange.py.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from selector.catalog import load_catalog
from selector.errors import UserError, closest
from selector.interchange import DEFAULT_RULE, RULES
from selector.profiles import Profile, get_profile, load_profiles

DEFAULT_PROFILE = "dev-prototyping"  # cheap (one T4-class GPU) and safe to deploy by mistake
KEYS = ("profile", "instance_type", "nodes", "spot", "market", "region", "vpc_id", "subnet_ids", "availability_zone",
        "command", "job", "max_price", "interchange", "capacity_reservation", "profiles_file", "local")
MARKETS = ("spot", "on-demand", "capacity-block")
_TRUE, _FALSE = {"true", "1", "yes", "on"}, {"false", "0", "no", "off"}
_RESERVATION_ID = re.compile(r"cr-[0-9a-f]{17}")
_RESERVATION_GROUP = re.compile(r"arn:aws(?:-cn|-us-gov)?:resource-groups:(?P<region>[a-z0-9-]+):\d{12}:"
                                r"group/[A-Za-z0-9_.-]{1,300}")


@dataclass(frozen=True)
class Settings:
    profile: Profile
    instance_type: Optional[str]
    nodes: int
    spot: bool
    region: str
    vpc_id: Optional[str]
    subnet_ids: tuple[str, ...]
    availability_zone: Optional[str]
    command: str
    job: str
    max_price: Optional[float]
    local: bool
    # Defaults keep Settings(...) calls written before these keys working: market follows spot.
    market: Optional[str] = None
    interchange: str = DEFAULT_RULE
    capacity_reservation: Optional[str] = None

    def __post_init__(self) -> None:
        if self.market is None:
            object.__setattr__(self, "market", "spot" if self.spot else "on-demand")
        if self.spot != (self.market == "spot"):
            raise ValueError(f"Settings: spot={self.spot} contradicts market={self.market}")

    @property
    def multi_node(self) -> bool:
        return self.nodes > 1


def _bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    v = str(value).strip().lower()
    if v in _TRUE | _FALSE:
        return v in _TRUE
    raise UserError(f"context {key}={value!r}: expected true or false")


def _int(key: str, value: Any, lo: int, hi: int) -> int:
    try:
        n = int(str(value))
    except ValueError:
        raise UserError(f"context {key}={value!r}: expected a whole number from {lo} to {hi}") from None
    if not lo <= n <= hi:
        raise UserError(f"context {key}={n}: allowed {lo} to {hi}")
    return n


def _choice(key: str, value: Any, allowed: tuple[str, ...]) -> str:
    v = str(value).strip()
    if v not in allowed:
        near = [a for a in allowed if v and a.startswith(v)] or closest(v, allowed, n=1)  # "same-acc"
        raise UserError(f"context {key}={value!r}: allowed {', '.join(allowed)}"
                        + (f"; closest: {near[0]}" if near else ""))
    return v


def _reservation(value: Any, region: str) -> str:
    v = str(value).strip()
    if _RESERVATION_ID.fullmatch(v):
        return v
    group = _RESERVATION_GROUP.fullmatch(v)
    if group and group["region"] != region:
        raise UserError(f"context capacity_reservation={v!r} is a resource group in {group['region']}, "
                        f"the stack deploys to {region}")
    if group:
        return v
    raise UserError(f"context capacity_reservation={value!r}: expected a reservation id like cr-0123456789abcdef0 "
                    f"or a resource group arn:aws:resource-groups:{region}:ACCOUNT:group/NAME")


def _market(ctx: Mapping[str, Any], profile: Profile, reservation: Optional[str]) -> str:
    """market wins; `spot` maps onto it; a reservation is on-demand capacity, never spot."""
    spot = _bool("spot", ctx["spot"]) if "spot" in ctx else None
    if "market" in ctx:
        market = _choice("market", ctx["market"], MARKETS)
        if spot is not None and spot != (market == "spot"):
            raise UserError(f"context spot={str(spot).lower()} contradicts market={market}; pass market alone")
    elif spot is not None:
        market = "spot" if spot else "on-demand"
    else:
        market = "spot" if profile.workload == "training" else "on-demand"
    if market == "spot" and reservation:
        implied = "" if "market" in ctx or "spot" in ctx else f" (profile {profile.name} launches on spot by default)"
        raise UserError(f"context capacity_reservation={reservation} with spot{implied}: reservations are on-demand "
                        "capacity; pass -c market=on-demand (a Capacity Reservation) or -c market=capacity-block "
                        "(a Capacity Block for ML)")
    if market == "capacity-block" and not reservation:
        raise UserError("context market=capacity-block needs capacity_reservation: the Capacity Block's id "
                        "(cr-0123456789abcdef0) or its resource group ARN")
    return market


def from_context(ctx: Mapping[str, Any]) -> Settings:
    """Validate the app's context. Unknown keys that look like ours (typos) are errors."""
    for key in ctx:
        if key not in KEYS and ":" not in key and not key.startswith(("aws:", "@aws-cdk", "cli-", "acknowledged")):
            near = closest(key, KEYS, n=1)
            if near:
                raise UserError(f"unknown context key {key!r}; closest: {near[0]}; allowed: {', '.join(KEYS)}")
    profiles = load_profiles(ctx.get("profiles_file")) if ctx.get("profiles_file") else None
    profile = get_profile(str(ctx.get("profile", DEFAULT_PROFILE)), profiles)
    catalog = load_catalog()
    region = catalog.check_region(str(ctx.get("region", "us-east-1")))
    instance_type = ctx.get("instance_type")
    if instance_type is not None:
        catalog.get(str(instance_type))  # unknown type: closest names
    nodes = _int("nodes", ctx.get("nodes", profile.nodes), 1, 64)
    reservation = _reservation(ctx["capacity_reservation"], region) if ctx.get("capacity_reservation") else None
    market = _market(ctx, profile, reservation)
    interchange = _choice("interchange", ctx.get("interchange", DEFAULT_RULE), RULES)
    vpc_id = ctx.get("vpc_id")
    if vpc_id is not None and not re.fullmatch(r"vpc-[0-9a-f]{8,17}", str(vpc_id)):
        raise UserError(f"context vpc_id={vpc_id!r}: expected an id like vpc-0123456789abcdef0")
    subnet_ids = tuple(x.strip() for x in str(ctx.get("subnet_ids", "")).split(",") if x.strip())
    for sid in subnet_ids:
        if not re.fullmatch(r"subnet-[0-9a-f]{8,17}", sid):
            raise UserError(f"context subnet_ids: {sid!r} is not a subnet id like subnet-0123456789abcdef0")
    az = ctx.get("availability_zone")
    if subnet_ids and not vpc_id:
        raise UserError("context subnet_ids needs vpc_id (the VPC they belong to)")
    if subnet_ids and not az:
        raise UserError("context subnet_ids needs availability_zone (the one AZ the subnets are in, e.g. us-east-1a)")
    if az is not None and not str(az).startswith(region):
        raise UserError(f"context availability_zone={az!r} is not in region {region}")
    job = str(ctx.get("job", profile.name))
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,39}", job):
        raise UserError(f"context job={job!r}: use 1-40 lower-case letters, digits and dashes (it names the checkpoint prefix)")
    max_price = ctx.get("max_price")
    if max_price is not None:
        try:
            max_price = float(max_price)
        except ValueError:
            raise UserError(f"context max_price={max_price!r}: expected USD per hour, e.g. 12.5") from None
        if max_price <= 0:
            raise UserError(f"context max_price={max_price}: must be above zero")
    command = str(ctx.get("command", "")).strip()
    if "\n" in command:
        raise UserError("context command: one line, please (put a script in the image or S3 and run it)")
    return Settings(profile=profile, instance_type=str(instance_type) if instance_type else None, nodes=nodes,
                    spot=market == "spot", region=region, vpc_id=str(vpc_id) if vpc_id else None, subnet_ids=subnet_ids,
                    availability_zone=str(az) if az else None, command=command, job=job,
                    max_price=max_price, local=_bool("local", ctx.get("local", False)),
                    market=market, interchange=interchange, capacity_reservation=reservation)
