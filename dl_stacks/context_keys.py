"""Every context key the app knows, its JSON type, its example, and the checks every value gets
before any setting reads it: the key is ours (an unknown key is an error with the closest of
ours), the type is the key's (cdk.json can carry lists, objects, null), the text has no control
characters or look-alikes and is not too long.
"""
from __future__ import annotations

import json
import re
import unicodedata
from typing import Any, Mapping, Optional

from dl_selector.errors import UserError, closest

from .approval import EXAMPLES as APPROVAL_EXAMPLES
from .approval import KEYS as APPROVAL_KEYS
from .approval import NUMBER_KEYS as APPROVAL_NUMBER_KEYS
from .context_values import fold, json_kind, show
from . import memory_tier_settings as memory_tier
from .job_settings import EXAMPLES as JOB_EXAMPLES
from .job_settings import KEYS as JOB_KEYS
from .job_settings import LONG_KEYS as JOB_LONG_KEYS
from .job_settings import PATH_KEYS as JOB_PATH_KEYS
from .observability_settings import BOOL_KEYS as OBS_BOOL_KEYS
from .observability_settings import EXAMPLES as OBS_EXAMPLES
from .observability_settings import KEYS as OBS_KEYS
from .observability_settings import NUMBER_KEYS as OBS_NUMBER_KEYS

KEYS = ("profile", "instance_type", "nodes", "spot", "market", "region", "vpc_id", "subnet_ids", "availability_zone",
        "command", "command_file", "job", "max_price", "interchange", "capacity_reservation", "profiles_file", "local",
        "bench", "portfolio", "product", "snapshots", "preflight", "budget", "on_end", "health_check", "hang_timeout",
        "first_step_timeout", "collective_check", memory_tier.KEY, *JOB_KEYS, *OBS_KEYS, *APPROVAL_KEYS)
BOOL_KEYS = ("spot", "local", "preflight", *OBS_BOOL_KEYS)
NUMBER_KEYS = ("nodes", "max_price", "budget", "hang_timeout", "first_step_timeout", memory_tier.KEY, *OBS_NUMBER_KEYS, *APPROVAL_NUMBER_KEYS)
PATH_KEYS = ("profiles_file", "command_file", "bench", "snapshots", *JOB_PATH_KEYS)
_NAME_LIMIT, _PATH_LIMIT = 256, 4096
EXAMPLES = {"profile": "multi-node-training", "instance_type": "p4d.24xlarge", "nodes": "2", "spot": "true",
            "market": "spot", "region": "us-east-1", "vpc_id": "vpc-0123456789abcdef0",
            "subnet_ids": "subnet-0123456789abcdef0,subnet-0123456789abcdef1", "availability_zone": "us-east-1a",
            "command": "dl-torchrun train.py", "command_file": "train.sh", "job": "my-job", "max_price": "12.5",
            "interchange": "same-accelerator", "capacity_reservation": "cr-0123456789abcdef0",
            "profiles_file": "profiles.toml", "local": "false", "bench": "bench-plan.json", "portfolio": "platform",
            "product": "dev-prototyping", "snapshots": "product-stack-snapshots", "preflight": "false",
            "budget": "5000", "on_end": "keep", "health_check": "quick", "hang_timeout": "600",
            "first_step_timeout": "3600", "collective_check": "256MiB", memory_tier.KEY: memory_tier.EXAMPLE,
            **JOB_EXAMPLES, **OBS_EXAMPLES, **APPROVAL_EXAMPLES}

# The marker that ends the job file in the user data (constructs_lib.userdata.HEREDOC; kept here so
# that validating context needs no CDK import; tests/test_bad_context.py checks they agree).
HEREDOC = "DL_LAUNCHER_EOF"
USER_DATA_LIMIT = 16 * 1024  # EC2's maximum; the whole user data is checked again at synth
# What the command may take of it: the node's bootstrap and settings are about 8 KB of the rest.
COMMAND_LIMIT = 8 * 1024
MAX_PRICE = 1000.0  # USD per hour per node: above any instance or Capacity Block on record


def _closest(key: str, suggestion: Optional[str]) -> str:
    return f"; closest: {suggestion}" if suggestion else f"; e.g. {key}={EXAMPLES[key]}"


def check_type(key: str, value: Any) -> None:
    """Each key's JSON type; cdk.json can carry any, `-c` only strings."""
    if key in BOOL_KEYS:
        ok, wanted = isinstance(value, (bool, str)), "true or false"
    elif key in NUMBER_KEYS:
        ok = isinstance(value, str) or (isinstance(value, (int, float)) and not isinstance(value, bool))
        wanted = {"nodes": "a whole number from 1 to 64", "max_price": f"USD per hour per node, above 0 and at most "
                  f"{MAX_PRICE:g}", "idle_minutes": "a whole number of minutes",
                  "idle_threshold": "a percentage", "idle_warning": "a whole number of minutes",
                  "budget": "a whole number of USD per month", "approve_hourly": "USD per hour",
                      "hang_timeout": "a whole number of seconds", "first_step_timeout": "a whole number of seconds",
                  "approval_threshold": "USD per hour", memory_tier.KEY: memory_tier.WANTED}[key]
    else:
        ok, wanted = isinstance(value, str), "a string"
    if ok:
        return
    near = None
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        near = ",".join(value) if key == "subnet_ids" else (value[0] if len(value) == 1 else None)
    elif isinstance(value, (int, float)) and not isinstance(value, bool) and key not in BOOL_KEYS:
        near = json.dumps(str(value))
    hint = "; leave the key out for its default" if value is None else ""
    raise UserError(f"context {key}={show(value)} ({json_kind(value)}): expected {wanted}{hint}"
                    + _closest(key, near))


def check_text(key: str, value: str) -> None:
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
    if key not in PATH_KEYS + NUMBER_KEYS and not value.isascii():  # numbers: see number
        c = next(c for c in value if not c.isascii())
        folded = fold(value)
        if key in ("region", "instance_type", "profile", "market", "interchange", "availability_zone", "vpc_id",
                   "subnet_ids", "capacity_reservation"):
            folded = folded.strip().lower() if key != "capacity_reservation" else folded.strip()
        if key == "job":
            folded = re.sub(r"[^a-z0-9-]+", "-", folded.lower()).strip("-")
        raise UserError(f"context {key}={show(value)} has a character that is not plain ASCII "
                        f"(U+{ord(c):04X} {unicodedata.name(c, '?')}): names are ASCII"
                        + _closest(key, ascii(folded) if folded else None))
    limit = _PATH_LIMIT if key in PATH_KEYS else _NAME_LIMIT
    if len(value) > limit:
        raise UserError(f"context {key}={show(value)}: at most {limit} characters" + _closest(key, None))


def check_keys(ctx: Mapping[str, Any]) -> None:
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
    check_keys(ctx)
    extra = [k for k in KEYS if k in ctx and k not in allowed]
    if extra:
        raise UserError(refuse(extra[0]))
    for key in allowed:
        if key in ctx:
            check_type(key, ctx[key])
            if isinstance(ctx[key], str):
                check_text(key, ctx[key])
