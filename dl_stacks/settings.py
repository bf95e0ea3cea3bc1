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
  same count); see dl_selector/interchange.py.

What the job runs:

- `command`: the training command each node runs, kept as written: `$VAR`, quotes, backticks
  and backslashes are the deployer's own shell code and go verbatim into the node's job file.
  One line: the CDK CLI cuts a `-c` value at a line break, and a cut command cannot be told from
  a whole one, so a line break in `command` (only cdk.json can carry one) is refused.
- `command_file`: multi-line commands go here. `-c command_file=PATH` (relative to where cdk
  runs) is read at synth and written to the nodes verbatim; missing, unreadable, binary, empty,
  or given together with `command` is an error. Neither may contain DL_LAUNCHER_EOF, the marker
  that ends the job file in the user data.
- `on_end`: what happens to the cluster when a job with a command finishes or fails for good:
  `stop` (default) terminates its nodes (checkpoints stay), `keep` keeps them for debugging.
  Nothing is launched again either way; a job without a command never ends.

Every bad value is one line (app.py prints it and exits 2 before any stack exists): what was
wrong, what is allowed, and the closest valid value where there is one. Values must have the
key's JSON type (cdk.json can carry lists, objects, null); control characters are refused and
shown escaped; names (profile, instance_type, region, market, interchange, ids) are plain ASCII
and case-sensitive: `US-EAST-1` or `p4d\u20112...` (a look-alike hyphen) is refused with the
ASCII lower-case name as the closest value, never silently accepted.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from dl_core.markets import MARKETS
from dl_selector.catalog import load_catalog
from dl_selector.errors import UserError
from dl_selector.interchange import DEFAULT_RULE, RULES
from dl_selector.profiles import Profile, get_profile, load_profiles
from constructs_lib.fleet.job_end import ON_END
from constructs_lib.runtime import contract

from .approval import ApprovalSettings, approval_from_context
from .context_keys import (COMMAND_LIMIT, EXAMPLES, HEREDOC, KEYS, MAX_PRICE, USER_DATA_LIMIT, check_keys, check_only,
                           check_text, check_type)
from .context_values import boolean, choice, fold, named, number, show, whole
from . import memory_tier_settings as memory_tier
from .job_settings import JobSettings, job_from_context
from .observability_settings import ObservabilitySettings, observability_from_context

# Importers read these from here too (tests, dl_launcher, training_product).
__all__ = ["COMMAND_LIMIT", "DEFAULT_PROFILE", "DEFAULT_REGION", "EXAMPLES", "HEREDOC", "KEYS", "MARKETS", "MAX_PRICE",
           "REGION_ENV", "USER_DATA_LIMIT", "Settings", "check_only", "from_context", "network_from_context",
           "read_script", "resolve_region", "show"]

DEFAULT_PROFILE = "dev-prototyping"  # cheap (one T4-class GPU) and safe to deploy by mistake
_RESERVATION_ID = re.compile(r"cr-[0-9a-f]{17}")
_RESERVATION_GROUP = re.compile(r"arn:aws(?:-cn|-us-gov)?:resource-groups:(?P<region>[a-z0-9-]+):\d{12}:"
                                r"group/[A-Za-z0-9_.-]{1,300}", re.ASCII)
NODES = (1, 64)
BUDGET = (1, 1_000_000)  # USD per month: an AWS Budgets cost budget on the job's tag
HANG = (30, 86_400)  # seconds without a step (-c hang_timeout=, first_step_timeout=): a poll's worth to a day


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
    observability: ObservabilitySettings = ObservabilitySettings()
    job_settings: JobSettings = JobSettings()
    region_source: str = "context region"  # where the region came from (resolve_region)
    preflight: bool = True  # dl-launcher preflight's checks at synth, when the CDK CLI found an account
    budget: Optional[int] = None  # USD per month (-c budget=): an AWS Budgets budget on the job's cost tag
    approval: ApprovalSettings = ApprovalSettings()  # -c approve_hourly, approval_threshold (dl_stacks/approval.py)
    memory_tier_gb: Optional[float] = None  # -c memory_tier_gb=: the job's state, checked against /dev/shm
    health_check: str = contract.HEALTH_CHECK_DEFAULT  # -c health_check=: DCGM's depth at boot (runtime/health_gate.py)
    # -c hang_timeout= / first_step_timeout=: seconds without a step that are a hang (runtime/stall.py); None: its default
    hang_timeout: Optional[int] = None
    first_step_timeout: Optional[int] = None
    collective_check: str = contract.COLLECTIVE_CHECK_DEFAULT  # -c collective_check=: each generation's all-reduce, or off
    on_end: str = "stop"  # when a job with a command finishes or fails for good: stop its cluster, or keep it

    def __post_init__(self) -> None:
        if self.market is None:
            object.__setattr__(self, "market", "spot" if self.spot else "on-demand")
        if self.spot != (self.market == "spot"):
            raise ValueError(f"Settings: spot={self.spot} contradicts market={self.market}")

    @property
    def multi_node(self) -> bool:
        return self.nodes > 1


def _price(value: Any) -> float:
    x = number(value)
    allowed = f"USD per hour per node, above 0 and at most {MAX_PRICE:g}"
    if x is None:
        v = str(value).strip()
        near = v.replace(",", ".") if re.fullmatch(r"[0-9]+,[0-9]+", v) else None
        if near is None and number(fold(v)) is not None and math.isfinite(number(fold(v))):
            near = fold(v).strip()
        raise UserError(f"context max_price={show(value)}: expected {allowed} (a plain decimal number)"
                        + (f"; closest: {near}" if near else "; e.g. max_price=12.5"))
    if math.isnan(x):
        raise UserError(f"context max_price={show(value)}: not a number; expected {allowed}; e.g. max_price=12.5")
    if x <= 0:
        raise UserError(f"context max_price={show(value) if isinstance(value, str) else value}: must be above zero "
                        f"({allowed}); closest: 0.01")
    if x > MAX_PRICE:
        what = "not a finite number" if math.isinf(x) else "above any price on record"
        raise UserError(f"context max_price={show(value)}: {what}; expected {allowed}; closest: {MAX_PRICE:g}")
    return x


def _reservation(value: Any, region: str) -> str:
    v = str(value).strip()
    if _RESERVATION_ID.fullmatch(v):
        return v
    group = _RESERVATION_GROUP.fullmatch(v)
    if group and group["region"] != region:
        raise UserError(f"context capacity_reservation={show(v)} is a resource group in {group['region']}, "
                        f"the stack deploys to {region}")
    if group:
        return v
    near = v.lower() if _RESERVATION_ID.fullmatch(v.lower()) else None
    raise UserError(f"context capacity_reservation={show(value)}: expected a reservation id like cr-0123456789abcdef0 "
                    f"or a resource group arn:aws:resource-groups:{region}:ACCOUNT:group/NAME"
                    + (f"; closest: {near}" if near else ""))


def _market(ctx: Mapping[str, Any], profile: Profile, reservation: Optional[str]) -> str:
    """market wins; `spot` maps onto it; a reservation is on-demand capacity, never spot."""
    spot = boolean("spot", ctx["spot"]) if "spot" in ctx else None
    if "market" in ctx:
        market = choice("market", ctx["market"], MARKETS)
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


def read_script(key: str, path: str, limit: int) -> str:
    """The text of a script file named in context (command_file, setup_file): UTF-8, LF line
    ends, not empty, at most `limit` bytes."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except FileNotFoundError:
        raise UserError(f"context {key}={show(path, 300)}: no such file (relative paths are from "
                        f"{show(os.getcwd(), 300)})") from None
    except IsADirectoryError:
        raise UserError(f"context {key}={show(path, 300)} is a directory: expected a script file") from None
    except OSError as e:
        raise UserError(f"context {key}={show(path, 300)} cannot be read: {e.strerror or type(e).__name__}") from None
    if len(data) > limit:
        why = (f" (the node's bootstrap takes the rest of EC2's {USER_DATA_LIMIT}-byte user data)"
               if key == "command_file" else "")
        raise UserError(f"context {key}={show(path, 300)} is over {limit} bytes{why}; put the script in your code "
                        "(-c code=DIR) or the image and run it from there")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is None or "\x00" in text:
        raise UserError(f"context {key}={show(path, 300)} is not a text file (not UTF-8, or it has NUL bytes): "
                        "expected a bash script")
    if "\r\n" in text:
        raise UserError(f"context {key}={show(path, 300)} has Windows line ends (CRLF), which bash reads as part "
                        "of each command; convert it (dos2unix)")
    if not text.strip():
        what = "command" if key == "command_file" else "script"
        raise UserError(f"context {key}={show(path, 300)} is empty: expected the {what} the nodes run")
    return text


def _command(ctx: Mapping[str, Any]) -> str:
    """`command` (one line) or the text of `command_file` (any lines), verbatim."""
    if "command_file" in ctx:
        path = ctx["command_file"]
        command, where = read_script("command_file", path, COMMAND_LIMIT), f"command_file {show(path, 300)}"
    else:
        command, where = ctx.get("command", "").strip(), "command"
    if HEREDOC in command:
        raise UserError(f"context {where} contains {HEREDOC}, the marker that ends the job file in the user data; "
                        "rename that word")
    return command


def network_from_context(ctx: Mapping[str, Any], region: str) -> tuple[Optional[str], tuple[str, ...], Optional[str]]:
    """(vpc_id, subnet_ids, availability_zone) from context, each checked; a new VPC is (None, (), None)."""
    vpc_id = ctx["vpc_id"].strip() if "vpc_id" in ctx else None
    if vpc_id is not None and not re.fullmatch(r"vpc-[0-9a-f]{8,17}", vpc_id):
        near = vpc_id.lower() if re.fullmatch(r"vpc-[0-9a-f]{8,17}", vpc_id.lower()) else None
        raise UserError(f"context vpc_id={show(vpc_id)}: expected an id like vpc-0123456789abcdef0"
                        + (f"; closest: {near}" if near else ""))
    subnet_ids = tuple(x.strip() for x in ctx.get("subnet_ids", "").split(",") if x.strip())
    for sid in subnet_ids:
        if not re.fullmatch(r"subnet-[0-9a-f]{8,17}", sid):
            near = sid.lower() if re.fullmatch(r"subnet-[0-9a-f]{8,17}", sid.lower()) else None
            raise UserError(f"context subnet_ids: {show(sid)} is not a subnet id like subnet-0123456789abcdef0"
                            + (f"; closest: {near}" if near else ""))
    az = ctx["availability_zone"].strip() if "availability_zone" in ctx else None
    if subnet_ids and not vpc_id:
        raise UserError("context subnet_ids needs vpc_id (the VPC they belong to)")
    if subnet_ids and not az:
        raise UserError("context subnet_ids needs availability_zone (the one AZ the subnets are in, e.g. us-east-1a)")
    if az is not None and az != az.lower() and az.lower().startswith(region):
        raise UserError(f"context availability_zone={show(az)}: names are case-sensitive and lower-case; "
                        f"closest: {az.lower()}")
    if az is not None and not az.startswith(region):
        raise UserError(f"context availability_zone={show(az)} is not in region {region}; e.g. {region}a")
    if az is not None and not subnet_ids:
        raise UserError(f"context availability_zone={az} is used only with subnet_ids and vpc_id (your own subnets "
                        "in that AZ); a new VPC picks its AZ itself: leave availability_zone out, or add subnet_ids "
                        "and vpc_id")
    return vpc_id, subnet_ids, az


DEFAULT_REGION = "us-east-1"
REGION_ENV = ("CDK_DEFAULT_REGION", "AWS_REGION", "AWS_DEFAULT_REGION")


def resolve_region(ctx: Mapping[str, Any], env: Mapping[str, str] = os.environ) -> tuple[str, str]:
    """(region, where it came from): -c region, else the CDK environment (the CDK CLI sets
    CDK_DEFAULT_REGION from the profile it deploys with), else AWS_REGION / AWS_DEFAULT_REGION,
    else us-east-1. A stack must deploy where the user's AWS tools point, not silently elsewhere."""
    if "region" in ctx:
        return str(ctx["region"]).strip(), "context region"
    for var in REGION_ENV:
        if env.get(var, "").strip():
            return env[var].strip(), var
    return DEFAULT_REGION, "the default: no -c region, CDK_DEFAULT_REGION, AWS_REGION or AWS_DEFAULT_REGION"


def from_context(ctx: Mapping[str, Any]) -> Settings:
    """Validate the app's context. Unknown keys that look like ours (typos) are errors."""
    check_keys(ctx)
    if "product" in ctx or "snapshots" in ctx:
        raise UserError(f"context {'product' if 'product' in ctx else 'snapshots'} belongs to a portfolio: pass "
                        "-c portfolio=NAME with it, or -c profile=NAME for a training stack")
    if "command" in ctx and "command_file" in ctx:
        raise UserError("context command and command_file are both given: pass one (command_file for a "
                        "multi-line script)")
    for key in KEYS:
        if key in ctx:
            check_type(key, ctx[key])
            if isinstance(ctx[key], str):
                check_text(key, ctx[key])
    profiles = load_profiles(ctx["profiles_file"]) if "profiles_file" in ctx else None
    profile_name = ctx.get("profile", DEFAULT_PROFILE).strip()
    named("profile", profile_name, profiles if profiles is not None else load_profiles())
    profile = get_profile(profile_name, profiles)
    catalog = load_catalog()
    region, region_source = resolve_region(ctx)
    if region_source != "context region":
        try:
            catalog.check_region(region)
        except UserError as e:
            raise UserError(f"{e} (from {region_source}; -c region=NAME sets it)") from None
    named("region", region, catalog.regions)
    region = catalog.check_region(region)
    instance_type = ctx["instance_type"].strip() if "instance_type" in ctx else None
    if instance_type is not None:
        named("instance_type", instance_type, catalog.types)
        catalog.get(instance_type)  # unknown type: closest names
    nodes = whole("nodes", ctx.get("nodes", profile.nodes), *NODES)
    reservation = _reservation(ctx["capacity_reservation"], region) if "capacity_reservation" in ctx else None
    market = _market(ctx, profile, reservation)
    interchange = choice("interchange", ctx.get("interchange", DEFAULT_RULE), RULES)
    vpc_id, subnet_ids, az = network_from_context(ctx, region)
    job = ctx.get("job", profile.name).strip()
    if not re.fullmatch(contract.JOB_NAME, job):
        near = re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", job.lower())).strip("-")[:40].strip("-")
        raise UserError(f"context job={show(job)}: use 1-40 lower-case letters, digits and dashes (it names the "
                        "checkpoint prefix)" + (f"; closest: {near}" if near else ""))
    max_price = _price(ctx["max_price"]) if "max_price" in ctx else None
    command = _command(ctx)
    return Settings(profile=profile, instance_type=instance_type, nodes=nodes,
                    spot=market == "spot", region=region, vpc_id=vpc_id, subnet_ids=subnet_ids,
                    availability_zone=az, command=command, job=job,
                    max_price=max_price, local=boolean("local", ctx.get("local", False)),
                    market=market, interchange=interchange, capacity_reservation=reservation,
                    observability=observability_from_context(ctx, profile, region, has_command=bool(command)),
                    job_settings=job_from_context(ctx, region, read_script, job), region_source=region_source,
                    preflight=boolean("preflight", ctx.get("preflight", True)),
                    budget=whole("budget", ctx["budget"], *BUDGET) if "budget" in ctx else None,
                    approval=approval_from_context(ctx), memory_tier_gb=memory_tier.parse(ctx),
                    on_end=choice("on_end", ctx.get("on_end", "stop"), ON_END),
                    health_check=choice("health_check", ctx.get("health_check", contract.HEALTH_CHECK_DEFAULT),
                                        tuple(contract.HEALTH_CHECKS)),
                    hang_timeout=whole("hang_timeout", ctx["hang_timeout"], *HANG) if "hang_timeout" in ctx else None,
                    first_step_timeout=(whole("first_step_timeout", ctx["first_step_timeout"], *HANG)
                                        if "first_step_timeout" in ctx else None),
                    collective_check=choice("collective_check", ctx.get("collective_check", contract.COLLECTIVE_CHECK_DEFAULT),
                                            tuple(contract.COLLECTIVE_CHECKS)))
