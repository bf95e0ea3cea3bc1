"""The spec the CDK writes and the Lambda reads: one clear line for every mistake, JSON both ways."""
from __future__ import annotations

import dataclasses
import json

import pytest

from constructs_lib.fleet import CapacityOption, ClusterSpec

P5 = CapacityOption("p5.48xlarge", "lt-0123456789abcdef0", price=40.0)
P5EN = CapacityOption("p5en.48xlarge", "lt-0fedcba9876543210", "3", 45.0)


def _spec(**kw) -> ClusterSpec:
    base = dict(cluster="llm-7b", nodes=4, options=(P5, P5EN), subnet_ids=("subnet-0a1b2c3d4e5f60718",),
                market="spot", max_price=50.0, state_bucket="dl-fleet-state", state_key="jobs/llm-7b/_fleet/state.json")
    return ClusterSpec(**{**base, **kw})


def test_json_round_trip_is_exact_and_lists_become_tuples():
    spec = _spec(market="on-demand", capacity_reservation="cr-0123456789abcdef0", replace_within_seconds=300)
    again = ClusterSpec.from_json(spec.to_json())
    assert again == spec and hash(again) == hash(spec)
    assert isinstance(again.options, tuple) and isinstance(again.subnet_ids, tuple)
    assert CapacityOption.from_json(P5EN.to_json()) == P5EN
    assert json.loads(spec.to_json())["options"][1]["launch_template_version"] == "3"
    defaults = ClusterSpec.from_json(json.dumps({k: v for k, v in json.loads(_spec().to_json()).items()
                                                 if k not in ("capacity_reservation", "replace_within_seconds")}))
    assert defaults.replace_within_seconds == 600 and defaults.capacity_reservation is None
    assert CapacityOption("g5.xlarge", "lt-0123456789abcdef0").launch_template_version == "$Latest"
    assert _spec(options=[P5]).options == (P5,), "a list from a caller becomes a tuple too"


@pytest.mark.parametrize("change, message", [
    (dict(nodes=0), "nodes must be a whole number from 1 to 1000"),
    (dict(nodes=True), "nodes must be a whole number"),
    (dict(nodes=1001), "from 1 to 1000"),
    (dict(options=()), "at least one capacity option"),
    (dict(options=(P5, P5)), "p5.48xlarge more than once"),
    (dict(market="spots"), "market 'spots' must be one of spot, on-demand, capacity-block (did you mean 'spot'?)"),
    (dict(market="capacity-block"), "capacity-block needs capacity_reservation"),
    (dict(capacity_reservation="cr-0123456789abcdef0"), "not spot"),
    (dict(market="on-demand", capacity_reservation="odcr-1"), "neither a cr- id nor a resource-groups group ARN"),
    (dict(max_price=0), "max_price must be a number of USD per hour above zero"),
    (dict(max_price=float("nan")), "max_price must be"),
    (dict(subnet_ids=()), "at least one subnet"),
    (dict(subnet_ids=("sn-1",)), "'sn-1' is not a subnet- id"),
    (dict(cluster=""), "cluster '' must be 1-256 characters"),
    (dict(replace_within_seconds=-1), "replace_within_seconds must be a whole number >= 0"),
    (dict(state_bucket="Bad_Bucket"), "not an S3 bucket name"),
    (dict(state_key="/abs"), "without a leading /"),
])
def test_every_mistake_is_one_line_naming_the_field(change, message):
    with pytest.raises(ValueError) as e:
        _spec(**change)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("args, message", [
    (("p5", "lt-0123456789abcdef0"), "not an EC2 instance type"),
    (("p5.48xlarge", "launch-template-1"), "is not an lt- id"),
    (("p5.48xlarge", "lt-0123456789abcdef0", "latest"), "use $Latest, $Default or a version number"),
    (("p5.48xlarge", "lt-0123456789abcdef0", "$Latest", -1.0), "price must be a number of USD per hour above zero"),
])
def test_option_mistakes(args, message):
    with pytest.raises(ValueError, match=message.replace("$", r"\$")):
        CapacityOption(*args)


def test_capacity_blocks_and_resource_groups_are_accepted():
    arn = "arn:aws:resource-groups:us-east-1:123456789012:group/p5-blocks"
    assert _spec(market="capacity-block", capacity_reservation="cr-0123456789abcdef0").market == "capacity-block"
    assert _spec(market="on-demand", capacity_reservation=arn).capacity_reservation == arn


def test_bad_json_is_one_line_with_the_closest_field():
    data = json.loads(_spec().to_json())
    data["max_prize"] = data.pop("max_price")
    with pytest.raises(ValueError, match="unknown field 'max_prize' \\(did you mean 'max_price'\\?\\)"):
        ClusterSpec.from_json(json.dumps(data))
    with pytest.raises(ValueError, match="missing max_price"):
        ClusterSpec.from_json(json.dumps({k: v for k, v in data.items() if k != "max_prize"}))
    with pytest.raises(ValueError, match="not valid JSON"):
        ClusterSpec.from_json("{nope")
    with pytest.raises(ValueError, match="must be a JSON list"):
        ClusterSpec.from_json(json.dumps({**json.loads(_spec().to_json()), "options": "p5"}))


def test_spec_is_frozen_and_keyword_only():
    with pytest.raises(dataclasses.FrozenInstanceError):
        _spec().nodes = 8
    with pytest.raises(TypeError):
        ClusterSpec("llm-7b", 4)  # type: ignore[misc]
