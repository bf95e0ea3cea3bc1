"""The measured-selection loop's contract, in one place: the plan file (`bench plan` writes it,
the benchmark stack reads it), and the S3 layout and result object each node writes for `bench
collect`. Standard library only: benchmark nodes import it. The samples/s line a benchmark prints
is dl_core/benchline.py (the node monitor reads it too, and nodes ship dl_core, not the selector).
"""
from __future__ import annotations

import json
import re
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any, Optional

from dl_core.markets import OPEN_MARKETS as MARKETS

PLAN_VERSION = 1
RESULT_VERSION = 1
# The most output a node keeps in its result object: the last bytes of stdout+stderr together.
OUTPUT_TAIL_BYTES = 64 * 1024
# A plan's name names the stack (dl-bench-<name>) and the S3 prefix (bench/<name>/).
NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9-]{0,39}\Z")


# --- S3 layout: s3://<bucket>/bench/<name>/{started,results}/<instance_type>.json ---------------

def _check_keys(cls: type, data: dict, where: str) -> None:
    """Names the first missing or unknown key, as a user editing the file sees it."""
    known = {f.name: f for f in fields(cls)}
    missing = [k for k, f in known.items() if k not in data and f.default is MISSING and f.default_factory is MISSING]
    if missing:
        raise ValueError(f"{where}: missing key {missing[0]!r} (required: {', '.join(missing)})")
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r} (allowed: {', '.join(known)})")


def prefix_for(name: str) -> str:
    return f"bench/{name}"


def started_key(prefix: str, instance_type: str) -> str:
    """Written by the node as soon as it boots: tells 'never launched' from 'hung'."""
    return f"{prefix.rstrip('/')}/started/{instance_type}.json"


def result_key(prefix: str, instance_type: str) -> str:
    return f"{prefix.rstrip('/')}/results/{instance_type}.json"


@dataclass(frozen=True)
class Result:
    """What one node reports (results/<type>.json). The node does not judge its output: the
    collector parses `output_tail` for dl-bench lines, so the rules live in one place."""

    instance_type: str
    exit_code: Optional[int]  # None: the command could not be started (see reason)
    timed_out: bool
    started: str  # ISO 8601 UTC
    ended: str
    output_tail: str
    instance_id: str = ""
    availability_zone: str = ""
    market: str = ""
    reason: str = ""  # the runner's own failure, e.g. the command was not found
    version: int = RESULT_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)


# --- The plan --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PlannedCandidate:
    instance_type: str
    price_per_hour: float  # in the plan's market: what one instance costs while it runs
    price_source: str
    cost_usd: float  # price_per_hour x minutes / 60: the most one candidate can cost
    modelled_samples_per_second: float
    uncertainty: float
    basis: str
    accelerators: str  # e.g. "8 x H100"
    on_demand_per_hour: Optional[float] = None
    spot_per_hour: Optional[float] = None
    # The most EC2 may charge per hour: on spot, the maximum price sent with the request (the
    # on-demand price, EC2's own default cap); on-demand, the price itself.
    max_price_per_hour: Optional[float] = None
    worst_cost_usd: Optional[float] = None  # max_price_per_hour x minutes / 60


@dataclass(frozen=True)
class Plan:
    name: str
    profile: str
    region: str
    market: str  # spot | on-demand
    minutes: int  # the hard limit per instance, boot included
    command: str  # what each instance runs; prints dl-bench lines
    candidates: tuple[PlannedCandidate, ...]
    total_cost_usd: float
    max_cost_usd: Optional[float]
    catalog_as_of: str
    created: str
    version: int = PLAN_VERSION
    # The market samples per dollar is ranked in (recommend --spot): a benchmark may run on spot
    # to save money and still rank for an on-demand job; throughput does not depend on the market.
    rank_market: str = "on-demand"
    worst_total_cost_usd: Optional[float] = None

    @property
    def prefix(self) -> str:
        return prefix_for(self.name)

    def to_json(self) -> str:
        d = asdict(self)
        return json.dumps(d, indent=1) + "\n"

    @classmethod
    def from_dict(cls, data: Any) -> "Plan":
        """From parsed JSON; ValueError names the key that is wrong (callers add the file name)."""
        if not isinstance(data, dict):
            raise ValueError("expected a JSON object written by 'bench plan'")
        if data.get("version") != PLAN_VERSION:
            raise ValueError(f"version must be {PLAN_VERSION}, got {data.get('version')!r}")
        _check_keys(cls, data, "the plan")
        if not isinstance(data["candidates"], list):
            raise ValueError("candidates: expected a list of objects")
        for i, c in enumerate(data["candidates"]):
            if not isinstance(c, dict):
                raise ValueError(f"candidates[{i}]: expected an object")
            _check_keys(PlannedCandidate, c, f"candidates[{i}]")
        plan = cls(**{**data, "candidates": tuple(PlannedCandidate(**c) for c in data["candidates"])})
        if not isinstance(plan.name, str) or not NAME_PATTERN.match(plan.name):
            raise ValueError(f"name {plan.name!r}: lower-case letters, digits and hyphens, at most 40")
        for key in ("market", "rank_market"):
            if getattr(plan, key) not in MARKETS:
                raise ValueError(f"{key} {getattr(plan, key)!r}: allowed {', '.join(MARKETS)}")
        if not isinstance(plan.minutes, int) or not 1 <= plan.minutes <= 24 * 60:
            raise ValueError(f"minutes {plan.minutes!r}: a whole number from 1 to 1440")
        if not isinstance(plan.command, str) or not plan.command.strip():
            raise ValueError("command is empty")
        if not plan.command.isprintable():  # a hand-edited line break would split the node's user data
            raise ValueError("command must be one line of printable characters (no line breaks or control "
                             "characters)")
        if not plan.candidates:
            raise ValueError("no candidates")
        seen = set()
        for c in plan.candidates:
            if not isinstance(c.instance_type, str) or c.instance_type in seen:
                raise ValueError(f"candidate {c.instance_type!r} is missing a name or listed twice")
            seen.add(c.instance_type)
        return plan


# --- What `bench collect` writes (`bench-results.json`), read by `recommend --throughput` and
# `bench report` ------------------------------------------------------------------------------------
#
# {"version": 1, "collected": "2026-11-24T01:02Z", "source": "s3://bucket/bench/<name>/",
#  "plan": {...the Plan as written by to_json...},
#  "measurements": [{"instance_type": "g5.xlarge", "samples_per_second": 812.3 (median window),
#                    "min": 800.1, "max": 820.5, "windows": 5, "spread": 0.025 ((max-min)/median),
#                    "labels": {"model": "resnet50", ...}, "result": "s3://.../results/g5.xlarge.json"}],
#  "failed": [{"instance_type": "g6.xlarge", "reason": "ran past the 20-minute limit and was killed"}]}
#
# Every planned candidate is in exactly one of the two lists: never a zero, never dropped.
COLLECTED_VERSION = 1
from . import DEFAULT_PLAN_FILE, DEFAULT_RESULTS_FILE  # noqa: E402,F401  (where they were first named)
