"""What the capacity controller keeps running: the cluster's spec, written by the CDK at synth and
read by the controller's Lambda from DL_CLUSTER_SPEC. Standard library only (the CDK imports it).

Every check runs on construction and fails with one ValueError line that names the field, so a
bad spec stops the synth instead of a Lambda failing at 3 a.m.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Optional

from dl_core.markets import MARKETS

# CreateFleet's MinTargetCapacity is at most 1000.
MAX_NODES = 1000

_INSTANCE_TYPE = re.compile(r"^[a-z][a-z0-9-]*\.[a-z0-9-]+\Z")
_LAUNCH_TEMPLATE = re.compile(r"^lt-[0-9a-f]{8,17}\Z")
_VERSION = re.compile(r"^(\$Latest|\$Default|[1-9][0-9]*)\Z")
_SUBNET = re.compile(r"^subnet-[0-9a-f]{8,17}\Z")
_RESERVATION = re.compile(r"^(cr-[0-9a-f]{8,17}|arn:aws[a-z-]*:resource-groups:[a-z0-9-]+:\d{12}:group/[\w.+=,@-]+)\Z", re.ASCII)
_STACK = re.compile(r"^arn:aws[a-z-]*:cloudformation:[a-z0-9-]+:\d{12}:stack/[A-Za-z][A-Za-z0-9-]*/[0-9a-f-]+\Z", re.ASCII)
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]\Z")


def _positive_price(value: Any, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{what} must be a number of USD per hour above zero, got {value!r}")


def _fields_from(cls: type, data: Any) -> dict[str, Any]:
    """data as constructor keywords; unknown keys are an error that names the closest field."""
    if not isinstance(data, dict):
        raise ValueError(f"{cls.__name__} JSON must be an object, got {type(data).__name__}")
    names = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1)
            raise ValueError(f"{cls.__name__}: unknown field {key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    missing = [f.name for f in dataclasses.fields(cls)
               if f.name not in data and f.default is dataclasses.MISSING]
    if missing:
        raise ValueError(f"{cls.__name__}: missing {', '.join(missing)}")
    return dict(data)


def _loads(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except (TypeError, json.JSONDecodeError) as e:
        raise ValueError(f"{what} is not valid JSON: {e}") from None


@dataclass(frozen=True)
class CapacityOption:
    """One whole-cluster alternative: every node of this type, from this launch template (which
    carries the AMI, EFA layout, placement group and, for reservations, the reservation target)."""
    instance_type: str
    launch_template_id: str
    launch_template_version: str = "$Latest"
    # Per node USD/h in the job's market, from the catalog; None = unknown, never launched.
    price: Optional[float] = None

    def __post_init__(self) -> None:
        if not isinstance(self.instance_type, str) or not _INSTANCE_TYPE.match(self.instance_type):
            raise ValueError(f"instance_type {self.instance_type!r} is not an EC2 instance type such as p5.48xlarge")
        if not isinstance(self.launch_template_id, str) or not _LAUNCH_TEMPLATE.match(self.launch_template_id):
            raise ValueError(f"{self.instance_type}: launch_template_id {self.launch_template_id!r} is not an lt- id")
        if not isinstance(self.launch_template_version, str) or not _VERSION.match(self.launch_template_version):
            raise ValueError(f"{self.instance_type}: launch_template_version {self.launch_template_version!r}: "
                             "use $Latest, $Default or a version number")
        if self.price is not None:
            _positive_price(self.price, f"{self.instance_type}: price")

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "CapacityOption":
        return cls(**_fields_from(cls, _loads(text, "CapacityOption")))


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    """`nodes` instances of one option at a time, in one AZ, kept by the controller.

    Keyword-only: ten fields read better named than in order.
    """
    cluster: str                          # the value of the dl-launcher:cluster tag
    nodes: int
    options: tuple[CapacityOption, ...]   # priority order: the pick first
    subnet_ids: tuple[str, ...]           # one AZ (the cluster placement group's)
    market: str                           # one of MARKETS
    max_price: float                      # per node USD/h ceiling
    capacity_reservation: Optional[str] = None  # a cr- id or a resource-group ARN
    replace_within_seconds: int = 600
    state_bucket: str
    state_key: str
    # The CloudFormation stack (id or ARN) whose own tags (Service Catalog's TagOptions, `cdk deploy
    # --tags`) every node and its volumes carry, so that cost allocation sees them; None: none.
    stack: Optional[str] = None

    def __post_init__(self) -> None:
        # Lists from JSON (or a caller) become tuples, so the spec stays hashable and immutable.
        object.__setattr__(self, "options", tuple(self.options) if isinstance(self.options, (list, tuple)) else self.options)
        object.__setattr__(self, "subnet_ids",
                           tuple(self.subnet_ids) if isinstance(self.subnet_ids, (list, tuple)) else self.subnet_ids)
        if not isinstance(self.cluster, str) or not 1 <= len(self.cluster) <= 256 or self.cluster != self.cluster.strip():
            raise ValueError(f"cluster {self.cluster!r} must be 1-256 characters (it is a tag value), no outer spaces")
        if isinstance(self.nodes, bool) or not isinstance(self.nodes, int) or not 1 <= self.nodes <= MAX_NODES:
            raise ValueError(f"nodes must be a whole number from 1 to {MAX_NODES}, got {self.nodes!r}")
        if not isinstance(self.options, tuple) or not self.options:
            raise ValueError("options must list at least one capacity option (the pick first)")
        if not all(isinstance(o, CapacityOption) for o in self.options):
            raise ValueError("options must be CapacityOption values")
        types = [o.instance_type for o in self.options]
        repeated = sorted({t for t in types if types.count(t) > 1})
        if repeated:
            raise ValueError(f"options name {', '.join(repeated)} more than once: each option is a distinct instance type")
        if not isinstance(self.subnet_ids, tuple) or not self.subnet_ids:
            raise ValueError("subnet_ids must list at least one subnet (all in one AZ)")
        bad = [s for s in self.subnet_ids if not isinstance(s, str) or not _SUBNET.match(s)]
        if bad:
            raise ValueError(f"subnet_ids: {bad[0]!r} is not a subnet- id")
        if self.market not in MARKETS:
            close = difflib.get_close_matches(str(self.market), MARKETS, n=1)
            raise ValueError(f"market {self.market!r} must be one of {', '.join(MARKETS)}"
                             + (f" (did you mean {close[0]!r}?)" if close else ""))
        _positive_price(self.max_price, "max_price")
        if self.capacity_reservation is not None and (
                not isinstance(self.capacity_reservation, str) or not _RESERVATION.match(self.capacity_reservation)):
            raise ValueError(f"capacity_reservation {self.capacity_reservation!r} is neither a cr- id nor a "
                             "resource-groups group ARN")
        if self.market == "capacity-block" and self.capacity_reservation is None:
            raise ValueError("market capacity-block needs capacity_reservation (the Capacity Block's cr- id)")
        if self.market == "spot" and self.capacity_reservation is not None:
            raise ValueError("a capacity reservation holds on-demand or Capacity Block capacity, not spot: "
                             "use market on-demand or capacity-block")
        if (isinstance(self.replace_within_seconds, bool) or not isinstance(self.replace_within_seconds, int)
                or self.replace_within_seconds < 0):
            raise ValueError(f"replace_within_seconds must be a whole number >= 0, got {self.replace_within_seconds!r}")
        if not isinstance(self.state_bucket, str) or not _BUCKET.match(self.state_bucket):
            raise ValueError(f"state_bucket {self.state_bucket!r} is not an S3 bucket name")
        if not isinstance(self.state_key, str) or not self.state_key or self.state_key.startswith("/"):
            raise ValueError(f"state_key {self.state_key!r} must be a non-empty S3 key without a leading /")
        if self.stack is not None and (not isinstance(self.stack, str) or not _STACK.match(self.stack)):
            raise ValueError(f"stack {self.stack!r} is not a CloudFormation stack ARN")

    def option_index(self, instance_type: Optional[str]) -> Optional[int]:
        for i, o in enumerate(self.options):
            if o.instance_type == instance_type:
                return i
        return None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ClusterSpec":
        data = _fields_from(cls, _loads(text, "ClusterSpec"))
        if not isinstance(data["options"], list):
            raise ValueError("ClusterSpec: options must be a JSON list")
        data["options"] = tuple(CapacityOption(**_fields_from(CapacityOption, o)) for o in data["options"])
        return cls(**data)
