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

import json
import math
import os
import re
import unicodedata
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from selector.catalog import load_catalog
from selector.errors import UserError, closest
from selector.interchange import DEFAULT_RULE, RULES
from selector.validate import plain_number
from selector.profiles import Profile, get_profile, load_profiles
from constructs_lib.fleet.job_end import ON_END
from constructs_lib.runtime import contract

from .approval import EXAMPLES as APPROVAL_EXAMPLES
from .approval import KEYS as APPROVAL_KEYS
from .approval import NUMBER_KEYS as APPROVAL_NUMBER_KEYS
from .approval import ApprovalSettings, approval_from_context
from .job_settings import EXAMPLES as JOB_EXAMPLES
from .job_settings import KEYS as JOB_KEYS
from .job_settings import LONG_KEYS as JOB_LONG_KEYS
from .job_settings import PATH_KEYS as JOB_PATH_KEYS
from .job_settings import JobSettings, job_from_context
from .observability_settings import BOOL_KEYS as OBS_BOOL_KEYS
from .observability_settings import EXAMPLES as OBS_EXAMPLES
from .observability_settings import KEYS as OBS_KEYS
from .observability_settings import NUMBER_KEYS as OBS_NUMBER_KEYS
from .observability_settings import ObservabilitySettings, observability_from_context

DEFAULT_PROFILE = "dev-prototyping"  # cheap (one T4-class GPU) and safe to deploy by mistake
KEYS = ("profile", "instance_type", "nodes", "spot", "market", "region", "vpc_id", "subnet_ids", "availability_zone",
        "command", "command_file", "job", "max_price", "interchange", "capacity_reservation", "profiles_file", "local",
        "bench", "portfolio", "product", "snapshots", "preflight", "budget", "on_end", *JOB_KEYS, *OBS_KEYS, *APPROVAL_KEYS)
MARKETS = ("spot", "on-demand", "capacity-block")
_TRUE, _FALSE = {"true", "1", "yes", "on"}, {"false", "0", "no", "off"}
_RESERVATION_ID = re.compile(r"cr-[0-9a-f]{17}")
_RESERVATION_GROUP = re.compile(r"arn:aws(?:-cn|-us-gov)?:resource-groups:(?P<region>[a-z0-9-]+):\d{12}:"
                                r"group/[A-Za-z0-9_.-]{1,300}", re.ASCII)

# The marker that ends the job file in the user data (constructs_lib.userdata.HEREDOC; kept here so
# that validating context needs no CDK import; tests/test_bad_context.py checks they agree).
HEREDOC = "DL_LAUNCHER_EOF"
USER_DATA_LIMIT = 16 * 1024  # EC2's maximum; the whole user data is checked again at synth
# What the command may take of it: the node's bootstrap and settings are about 8 KB of the rest.
COMMAND_LIMIT = 8 * 1024
NODES = (1, 64)
MAX_PRICE = 1000.0  # USD per hour per node: above any instance or Capacity Block on record
_BOOL_KEYS = ("spot", "local", "preflight", *OBS_BOOL_KEYS)
_NUMBER_KEYS = ("nodes", "max_price", "budget", *OBS_NUMBER_KEYS, *APPROVAL_NUMBER_KEYS)
BUDGET = (1, 1_000_000)  # USD per month: an AWS Budgets cost budget on the job's tag
_PATH_KEYS = ("profiles_file", "command_file", "bench", "snapshots", *JOB_PATH_KEYS)
_NAME_LIMIT, _PATH_LIMIT = 256, 4096
EXAMPLES = {"profile": "multi-node-training", "instance_type": "p4d.24xlarge", "nodes": "2", "spot": "true",
            "market": "spot", "region": "us-east-1", "vpc_id": "vpc-0123456789abcdef0",
            "subnet_ids": "subnet-0123456789abcdef0,subnet-0123456789abcdef1", "availability_zone": "us-east-1a",
            "command": "dl-torchrun train.py", "command_file": "train.sh", "job": "my-job", "max_price": "12.5",
            "interchange": "same-accelerator", "capacity_reservation": "cr-0123456789abcdef0",
            "profiles_file": "profiles.toml", "local": "false", "bench": "bench-plan.json", "portfolio": "platform",
            "product": "dev-prototyping", "snapshots": "product-stack-snapshots", "preflight": "false",
            "budget": "5000", "on_end": "keep", **JOB_EXAMPLES, **OBS_EXAMPLES, **APPROVAL_EXAMPLES}
# Look-alikes a copy from a document or chat brings in; NFKC handles full-width forms and the like.
_LOOKALIKES = str.maketrans({
    "\u2010": "-", "\u2011": "-", "\u2012": "-", "\u2013": "-", "\u2014": "-", "\u2015": "-", "\u2212": "-",
    "\u00a0": " ", "\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u00ad": "",
    "\u200b": "", "\u200c": "", "\u200d": "", "\ufeff": "",
    "\u0430": "a", "\u0435": "e", "\u043e": "o", "\u0440": "p", "\u0441": "c", "\u0443": "y", "\u0445": "x",
    "\u0456": "i", "\u0455": "s", "\u0458": "j", "\u0501": "d", "\u043a": "k", "\u0442": "t", "\u043d": "h",
    "\u03bf": "o", "\u03b1": "a", "\u03bd": "v", "\u03c1": "p", "\u03b9": "i", "\u03ba": "k", "\u0391": "A",
    "\u0410": "A", "\u0415": "E", "\u041e": "O", "\u0420": "P", "\u0421": "C", "\u0422": "T", "\u0425": "X",
})


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
    approval: ApprovalSettings = ApprovalSettings()  # -c approve_hourly, approval_threshold (stacks/approval.py)
    on_end: str = "stop"  # when a job with a command finishes or fails for good: stop its cluster, or keep it

    def __post_init__(self) -> None:
        if self.market is None:
            object.__setattr__(self, "market", "spot" if self.spot else "on-demand")
        if self.spot != (self.market == "spot"):
            raise ValueError(f"Settings: spot={self.spot} contradicts market={self.market}")

    @property
    def multi_node(self) -> bool:
        return self.nodes > 1


# ---- showing a value: escaped, short, one line ----------------------------------------------------
def show(value: Any, limit: int = 60) -> str:
    """A value as an error message may quote it: ASCII escapes for control and non-ASCII
    characters (never raw), JSON for what cdk.json carries, cut short with its length."""
    if isinstance(value, str):
        if len(value) > limit:
            return f"{ascii(value[:limit - 20])}... ({len(value)} characters)"
        return ascii(value)
    try:
        text = json.dumps(value, ensure_ascii=True, allow_nan=True)
    except (TypeError, ValueError):
        text = ascii(value)
    return text if len(text) <= limit else text[:limit - 20] + f"... ({len(text)} characters)"


def _json_kind(value: Any) -> str:
    if value is None:
        return "JSON null"
    if isinstance(value, bool):
        return f"JSON {str(value).lower()}"
    if isinstance(value, (int, float)):
        return "a JSON number"
    if isinstance(value, (list, tuple)):
        return "a JSON list"
    if isinstance(value, dict):
        return "a JSON object"
    return type(value).__name__


def _fold(value: str) -> str:
    """The plain-ASCII text a look-alike most likely meant."""
    folded = unicodedata.normalize("NFKC", value).translate(_LOOKALIKES)
    return "".join(c for c in folded if c.isascii())


def _closest(key: str, suggestion: Optional[str]) -> str:
    return f"; closest: {suggestion}" if suggestion else f"; e.g. {key}={EXAMPLES[key]}"


def _check_type(key: str, value: Any) -> None:
    """Each key's JSON type; cdk.json can carry any, `-c` only strings."""
    if key in _BOOL_KEYS:
        ok, wanted = isinstance(value, (bool, str)), "true or false"
    elif key in _NUMBER_KEYS:
        ok = isinstance(value, str) or (isinstance(value, (int, float)) and not isinstance(value, bool))
        wanted = {"nodes": "a whole number from 1 to 64", "max_price": f"USD per hour per node, above 0 and at most "
                  f"{MAX_PRICE:g}", "idle_minutes": "a whole number of minutes",
                  "idle_threshold": "a percentage", "idle_warning": "a whole number of minutes",
                  "budget": "a whole number of USD per month", "approve_hourly": "USD per hour",
                  "approval_threshold": "USD per hour"}[key]
    else:
        ok, wanted = isinstance(value, str), "a string"
    if ok:
        return
    near = None
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        near = ",".join(value) if key == "subnet_ids" else (value[0] if len(value) == 1 else None)
    elif isinstance(value, (int, float)) and not isinstance(value, bool) and key not in _BOOL_KEYS:
        near = json.dumps(str(value))
    hint = "; leave the key out for its default" if value is None else ""
    raise UserError(f"context {key}={show(value)} ({_json_kind(value)}): expected {wanted}{hint}"
                    + _closest(key, near))


def _check_text(key: str, value: str) -> None:
    """Empty, control characters, look-alikes and length, for every string value."""
    if not value.strip():
        what = "leave it out for nodes that wait for you" if key == "command" else "leave the key out for its default"
        raise UserError(f"context {key} is empty: give a value or {what}" + _closest(key, None))
    if key in JOB_LONG_KEYS:
        bad = [c for c in value if (ord(c) < 32 or ord(c) == 127) and c != "\t"]
        if bad and not (key == "setup" and set(bad) <= {"\n", "\r"}):
            shown = "" if key == "secrets" else f"={show(value)}"  # a pasted value must not be echoed
            raise UserError(f"context {key}{shown} has a control character ({ascii(bad[0])}): not allowed")
        if len(value) > 16 * 1024:
            raise UserError(f"context {key} is {len(value)} characters: at most {16 * 1024}")
        return
    if key == "command":
        if "\n" in value.strip() or "\r" in value.strip():
            raise UserError("context command has a line break: the CDK CLI cuts -c values at one, so a multi-line "
                            "command goes in a file: -c command_file=PATH")
        allowed_controls = "\t"
    else:
        allowed_controls = ""
    bad = [c for c in value if (ord(c) < 32 or ord(c) == 127) and c not in allowed_controls]
    if bad:
        clean = "".join(c for c in re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", value) if c not in bad).strip()  # ANSI colours too
        raise UserError(f"context {key}={show(value)} has a control character ({ascii(bad[0])}): not allowed"
                        + _closest(key, ascii(clean) if clean and key != "command" else None))
    if key == "command":
        if len(value.encode()) > COMMAND_LIMIT:
            raise UserError(f"context command is {len(value.encode())} bytes: at most {COMMAND_LIMIT} (the node's "
                            f"bootstrap takes the rest of EC2's {USER_DATA_LIMIT}-byte user data); put the script "
                            "in the image or S3 and run it from there")
        return
    if key not in _PATH_KEYS + _NUMBER_KEYS and not value.isascii():  # numbers: see _float
        c = next(c for c in value if not c.isascii())
        folded = _fold(value)
        if key in ("region", "instance_type", "profile", "market", "interchange", "availability_zone", "vpc_id",
                   "subnet_ids", "capacity_reservation"):
            folded = folded.strip().lower() if key != "capacity_reservation" else folded.strip()
        if key == "job":
            folded = re.sub(r"[^a-z0-9-]+", "-", folded.lower()).strip("-")
        raise UserError(f"context {key}={show(value)} has a character that is not plain ASCII "
                        f"(U+{ord(c):04X} {unicodedata.name(c, '?')}): names are ASCII"
                        + _closest(key, ascii(folded) if folded else None))
    limit = _PATH_LIMIT if key in _PATH_KEYS else _NAME_LIMIT
    if len(value) > limit:
        raise UserError(f"context {key}={show(value)}: at most {limit} characters" + _closest(key, None))


def _named(key: str, value: str, allowed) -> None:
    """Names are case-sensitive and lower-case: say so, with the name meant, instead of a guess."""
    if value in allowed:
        return
    lowered = {a.lower(): a for a in allowed}
    if value.lower() in lowered:
        raise UserError(f"context {key}={show(value)}: names are case-sensitive"
                        f"{' and lower-case' if lowered[value.lower()].islower() else ''}; "
                        f"closest: {lowered[value.lower()]}")


def _bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    v = str(value).strip().lower()
    if v in _TRUE | _FALSE:
        return v in _TRUE
    near = closest(v, sorted(_TRUE | _FALSE), n=1) if v else []
    raise UserError(f"context {key}={show(value)}: expected true or false"
                    + (f"; closest: {'true' if near[0] in _TRUE else 'false'}" if near else ""))


def _float(value: Any) -> Optional[float]:
    return plain_number(value)


def _int(key: str, value: Any, lo: int, hi: int) -> int:
    x = _float(value)
    shown = value if isinstance(value, (int, float)) and not isinstance(value, bool) else show(value)
    if x is None:
        near = _fold(str(value)).strip()
        near = near if re.fullmatch(r"[0-9]+", near) and lo <= int(near) <= hi else None
        raise UserError(f"context {key}={show(value)}: expected a whole number from {lo} to {hi}"
                        + (f"; closest: {near}" if near else ""))
    if not math.isfinite(x):
        raise UserError(f"context {key}={show(value)}: not a finite number; expected a whole number from {lo} to {hi}")
    n = round(x)
    if x != n:
        raise UserError(f"context {key}={shown}: expected a whole number from {lo} to {hi}; "
                        f"closest: {min(max(math.floor(x + 0.5), lo), hi)}")
    if not lo <= n <= hi:
        where = f"{shown} ({n})" if isinstance(value, str) and value.strip() != str(n) else str(n)
        raise UserError(f"context {key}={where}: allowed {lo} to {hi}; closest: {min(max(n, lo), hi)}")
    return int(n)


def _price(value: Any) -> float:
    x = _float(value)
    allowed = f"USD per hour per node, above 0 and at most {MAX_PRICE:g}"
    if x is None:
        v = str(value).strip()
        near = v.replace(",", ".") if re.fullmatch(r"[0-9]+,[0-9]+", v) else None
        if near is None and _float(_fold(v)) is not None and math.isfinite(_float(_fold(v))):
            near = _fold(v).strip()
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


def _choice(key: str, value: Any, allowed: tuple[str, ...]) -> str:
    v = str(value).strip()
    _named(key, v, allowed)
    if v not in allowed:
        near = [a for a in allowed if v and a.startswith(v)] or closest(v, allowed, n=1)  # "same-acc"
        raise UserError(f"context {key}={show(value)}: allowed {', '.join(allowed)}"
                        + (f"; closest: {near[0]}" if near else ""))
    return v


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


def _check_keys(ctx: Mapping[str, Any]) -> None:
    """Every key must be ours or the CDK's own: an unknown key is an error (with the closest of ours
    where one is near), never ignored, or a user's safety setting (on_end, budget) could vanish
    behind a typo or a key from another version."""
    by_form = {k.replace("-", "_"): k for k in KEYS}
    for key in ctx:
        if key in KEYS or ":" in key or key.startswith(("aws:", "@aws-cdk", "cli-", "acknowledged")):
            continue
        form = key.strip().lower().replace("-", "_").replace(" ", "_")
        near = [by_form[form]] if form in by_form else closest(key, KEYS, n=1) or closest(form, KEYS, n=1)
        if not near and len(form) >= 4:
            near = [k for k in KEYS if k.replace("_", "") == form.replace("_", "")]
        raise UserError(f"unknown context key {show(key)}" + (f"; closest: {near[0]}" if near else "")
                        + f"; allowed: {', '.join(KEYS)}")


def check_only(ctx: Mapping[str, Any], allowed: tuple[str, ...], refuse) -> None:
    """For a mode that reads only `allowed` keys (bench, portfolio): any other key of ours is an
    error, `refuse(key)` its message; each allowed key present gets its type and text checked."""
    _check_keys(ctx)
    extra = [k for k in KEYS if k in ctx and k not in allowed]
    if extra:
        raise UserError(refuse(extra[0]))
    for key in allowed:
        if key in ctx:
            _check_type(key, ctx[key])
            if isinstance(ctx[key], str):
                _check_text(key, ctx[key])


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
    _check_keys(ctx)
    if "product" in ctx or "snapshots" in ctx:
        raise UserError(f"context {'product' if 'product' in ctx else 'snapshots'} belongs to a portfolio: pass "
                        "-c portfolio=NAME with it, or -c profile=NAME for a training stack")
    if "command" in ctx and "command_file" in ctx:
        raise UserError("context command and command_file are both given: pass one (command_file for a "
                        "multi-line script)")
    for key in KEYS:
        if key in ctx:
            _check_type(key, ctx[key])
            if isinstance(ctx[key], str):
                _check_text(key, ctx[key])
    profiles = load_profiles(ctx["profiles_file"]) if "profiles_file" in ctx else None
    profile_name = ctx.get("profile", DEFAULT_PROFILE).strip()
    _named("profile", profile_name, profiles if profiles is not None else load_profiles())
    profile = get_profile(profile_name, profiles)
    catalog = load_catalog()
    region, region_source = resolve_region(ctx)
    if region_source != "context region":
        try:
            catalog.check_region(region)
        except UserError as e:
            raise UserError(f"{e} (from {region_source}; -c region=NAME sets it)") from None
    _named("region", region, catalog.regions)
    region = catalog.check_region(region)
    instance_type = ctx["instance_type"].strip() if "instance_type" in ctx else None
    if instance_type is not None:
        _named("instance_type", instance_type, catalog.types)
        catalog.get(instance_type)  # unknown type: closest names
    nodes = _int("nodes", ctx.get("nodes", profile.nodes), *NODES)
    reservation = _reservation(ctx["capacity_reservation"], region) if "capacity_reservation" in ctx else None
    market = _market(ctx, profile, reservation)
    interchange = _choice("interchange", ctx.get("interchange", DEFAULT_RULE), RULES)
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
                    max_price=max_price, local=_bool("local", ctx.get("local", False)),
                    market=market, interchange=interchange, capacity_reservation=reservation,
                    observability=observability_from_context(ctx, profile, region, has_command=bool(command)),
                    job_settings=job_from_context(ctx, region, read_script, job), region_source=region_source,
                    preflight=_bool("preflight", ctx.get("preflight", True)),
                    budget=_int("budget", ctx["budget"], *BUDGET) if "budget" in ctx else None,
                    approval=approval_from_context(ctx),
                    on_end=_choice("on_end", ctx.get("on_end", "stop"), ON_END))
