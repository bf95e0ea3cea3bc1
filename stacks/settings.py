"""CDK context -> validated Settings. One clear line for anything wrong, before any stack exists."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from selector.catalog import load_catalog
from selector.errors import UserError, closest
from selector.profiles import Profile, get_profile, load_profiles

DEFAULT_PROFILE = "dev-prototyping"  # cheap (one T4-class GPU) and safe to deploy by mistake
KEYS = ("profile", "instance_type", "nodes", "spot", "region", "vpc_id", "subnet_ids", "availability_zone",
        "command", "job", "max_price", "profiles_file", "local")
_TRUE, _FALSE = {"true", "1", "yes", "on"}, {"false", "0", "no", "off"}


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
    spot = _bool("spot", ctx.get("spot", profile.workload == "training"))
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
                    spot=spot, region=region, vpc_id=str(vpc_id) if vpc_id else None, subnet_ids=subnet_ids,
                    availability_zone=str(az) if az else None, command=command, job=job,
                    max_price=max_price, local=_bool("local", ctx.get("local", False)))
