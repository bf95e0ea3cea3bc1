"""What moto's CreateFleet (instant) really does, pinned: the controller's tests rely on it, and
the controller must not. Run with -s to see the response printed."""
from __future__ import annotations

import json

from constructs_lib.fleet.instances import fleet_request
from tests.fleet.conftest import CLUSTER, cluster_types, live_instances


def test_moto_instant_fleet_launches_everything_or_nothing_and_ignores_the_constraints(cloud):
    spec = cloud.spec(nodes=3, max_price=50.0)
    request = fleet_request(spec, spec.options[0], 3, cloud.subnets, minimum=3)
    # A ceiling no pool could meet: AWS would launch nothing; moto ignores MaxPrice and MaxTotalPrice.
    request["SpotOptions"]["MaxTotalPrice"] = "0.0001"
    request["LaunchTemplateConfigs"][0]["Overrides"] = [dict(o, MaxPrice="0.0001")
                                                         for o in request["LaunchTemplateConfigs"][0]["Overrides"]]
    answer = cloud.raw.create_fleet(**request)
    answer.pop("ResponseMetadata")
    print(json.dumps(answer, indent=1, default=str))
    assert "Errors" not in answer, "moto never reports errors"
    assert [g["InstanceType"] for g in answer["Instances"]] == ["p5.48xlarge"] * 3
    assert {g["Lifecycle"] for g in answer["Instances"]} == {"spot"}
    nodes = live_instances(cloud.raw)
    # Both overrides name a subnet; moto puts every instance in the first. It drops the launch
    # template's placement group, and applies the template's tags and the request's.
    assert {i["SubnetId"] for i in nodes} == {cloud.subnets[0]}
    assert {i["Placement"].get("GroupName") or "" for i in nodes} == {""}
    assert all({"dl-launcher:nodes", "dl-launcher:cluster"} <= {t["Key"] for t in i["Tags"]} for i in nodes)


def test_moto_capacity_block_fleet_launches_nothing_and_says_nothing(cloud):
    spec = cloud.spec(nodes=2, market="capacity-block", capacity_reservation="cr-0123456789abcdef0")
    answer = cloud.raw.create_fleet(**fleet_request(spec, spec.options[0], 2, cloud.subnets, minimum=2))
    assert answer.get("Instances") == [] and "Errors" not in answer
    assert cluster_types(cloud.raw, CLUSTER) == {}
