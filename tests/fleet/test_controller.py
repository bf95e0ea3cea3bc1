"""The controller's decisions against moto, with capacity failures injected as AWS reports them.
Every reconcile goes through cloud.reconcile, which fails the test if the cluster ever held two
instance types (checked after each run and after each launch inside it)."""
from __future__ import annotations

import dataclasses
import json
import threading
import time

import boto3
import pytest
from botocore.exceptions import ClientError

from constructs_lib.fleet import KINDS
from constructs_lib.fleet.state import LEASE_SECONDS
from constructs_lib.runtime.contract import TAG_CLUSTER, TAG_HEALTH
from tests.fleet.conftest import CLUSTER, REGION, Clock, FlakyEc2, live_instances

P5, P5EN, P4D, P5E = "p5.48xlarge", "p5en.48xlarge", "p4d.24xlarge", "p5e.48xlarge"


def kinds(done) -> list[str]:
    return [t.kind for t in done]


def state_of(cloud, spec):
    return cloud.store(spec).load()


def test_gang_launch_is_one_instant_fleet_of_exactly_one_type(cloud):
    spec = cloud.spec()
    ctl = cloud.controller(spec)
    done = cloud.reconcile(ctl)
    assert kinds(done) == ["launched"] and len(done[0].instances) == 4
    assert cloud.types() == {P5: 4}
    (request,) = cloud.ec2.requests
    assert request["Type"] == "instant"
    assert request["TargetCapacitySpecification"] == {"TotalTargetCapacity": 4, "DefaultTargetCapacityType": "spot"}
    assert request["SpotOptions"] == {"AllocationStrategy": "capacity-optimized", "SingleInstanceType": True,
                                      "SingleAvailabilityZone": True, "MinTargetCapacity": 4, "MaxTotalPrice": "200"}
    assert "OnDemandOptions" not in request
    (config,) = request["LaunchTemplateConfigs"]
    assert config["LaunchTemplateSpecification"] == {"LaunchTemplateId": cloud.templates[P5], "Version": "$Latest"}
    assert config["Overrides"] == [{"InstanceType": P5, "SubnetId": s, "MaxPrice": "50"} for s in cloud.subnets]
    assert request["TagSpecifications"] == [{"ResourceType": "instance", "Tags": [{"Key": TAG_CLUSTER, "Value": CLUSTER}]}]
    assert all({t["Key"] for t in i["Tags"]} >= {TAG_CLUSTER, "dl-launcher:nodes"} for i in live_instances(cloud.raw))

    assert cloud.reconcile(ctl) == [] and len(cloud.ec2.requests) == 1, "a full cluster needs nothing"
    state = state_of(cloud, spec)
    assert state.instance_type == P5 and [h["kind"] for h in state.history] == ["launched"]
    line = json.loads(cloud.logs[0])
    assert line["cluster"] == CLUSTER and line["kind"] == "launched" and len(line["instances"]) == 4


def test_no_capacity_for_the_pick_puts_the_whole_cluster_on_the_next_option(cloud):
    cloud.ec2.unavailable.add(P5)
    done = cloud.reconcile(cloud.controller(cloud.spec()))
    assert kinds(done) == ["launch-failed", "launched"]
    assert "got 0 of 4: InsufficientInstanceCapacity" in done[0].reason and done[0].instance_type == P5
    assert done[1].instance_type == P5EN and cloud.types() == {P5EN: 4}


def test_a_partial_fleet_is_terminated_all_or_nothing(cloud):
    # moto always fills the whole request and ignores MinTargetCapacity: the controller's own
    # count is what keeps a launch all-or-nothing (as it must for Capacity Blocks, which fill what they can).
    cloud.ec2.partial[P5] = 2
    done = cloud.reconcile(cloud.controller(cloud.spec()))
    assert kinds(done) == ["launch-failed", "launched"]
    assert "got 2 of 4 and terminated them (all or nothing)" in done[0].reason
    partial = cloud.raw.describe_instances(InstanceIds=list(done[0].instances))["Reservations"][0]["Instances"]
    assert {i["State"]["Name"] for i in partial} <= {"shutting-down", "terminated"}
    assert cloud.types() == {P5EN: 4}


def test_a_lost_node_is_replaced_by_the_same_type_in_the_same_subnet(cloud):
    spec = cloud.spec()
    ctl = cloud.controller(spec)
    cloud.reconcile(ctl)
    cloud.kill(1)
    survivors_subnet = {i["SubnetId"] for i in live_instances(cloud.raw)}
    done = cloud.reconcile(ctl)
    assert kinds(done) == ["replaced"] and len(done[0].instances) == 1
    request = cloud.ec2.requests[-1]
    assert request["LaunchTemplateConfigs"] == [{
        "LaunchTemplateSpecification": {"LaunchTemplateId": cloud.templates[P5], "Version": "$Latest"},
        "Overrides": [{"InstanceType": P5, "SubnetId": survivors_subnet.pop(), "MaxPrice": "50"}]}]
    assert request["TargetCapacitySpecification"]["TotalTargetCapacity"] == 1
    assert request["SpotOptions"]["MinTargetCapacity"] == 1 and request["SpotOptions"]["MaxTotalPrice"] == "50"
    new = cloud.raw.describe_instances(InstanceIds=list(done[0].instances))["Reservations"][0]["Instances"][0]
    assert new["InstanceType"] == P5 and new["SubnetId"] == request["LaunchTemplateConfigs"][0]["Overrides"][0]["SubnetId"]
    assert cloud.types() == {P5: 4} and state_of(cloud, spec).loss_since is None


def test_a_node_that_marked_itself_broken_is_terminated_and_replaced_beside_the_others(cloud):
    spec = cloud.spec()
    ctl = cloud.controller(spec)
    cloud.reconcile(ctl)
    ids = [i["InstanceId"] for i in live_instances(cloud.raw)]
    # What the node's monitor does on an XID 79 (constructs_lib/runtime/monitor.py): a tag on itself.
    cloud.raw.create_tags(Resources=[ids[2]], Tags=[{"Key": TAG_HEALTH, "Value": "replace: XID 79 on GPU 3"}])
    cloud.raw.create_tags(Resources=[ids[0]], Tags=[{"Key": TAG_HEALTH, "Value": "ok"}])
    done = cloud.reconcile(ctl)
    assert kinds(done) == ["terminated-unhealthy", "replaced"]
    assert done[0].instances == (ids[2],) and "XID 79" in done[0].reason
    assert ids[2] not in {i["InstanceId"] for i in live_instances(cloud.raw)}
    assert cloud.types() == {P5: 4} and len(done[1].instances) == 1
    assert cloud.reconcile(ctl) == [], "the replacement carries no mark: nothing more to do"


def test_past_the_bound_the_whole_cluster_moves_to_the_next_option(cloud):
    clock = Clock()
    spec = cloud.spec(replace_within_seconds=600)
    ctl = cloud.controller(spec, clock)
    cloud.reconcile(ctl)
    cloud.kill(1)
    cloud.ec2.unavailable.add(P5)
    clock.advance(30)
    done = cloud.reconcile(ctl)
    assert kinds(done) == ["launch-failed"] and "moves after 600 s" in done[0].reason
    assert state_of(cloud, spec).loss_since == clock.now and cloud.types() == {P5: 3}
    clock.advance(300)
    assert kinds(cloud.reconcile(ctl)) == ["launch-failed"] and cloud.types() == {P5: 3}, "within the bound: keep trying"
    survivors = {i["InstanceId"] for i in live_instances(cloud.raw)}
    clock.advance(300)
    done = cloud.reconcile(ctl)
    assert kinds(done) == ["launch-failed", "moved", "launched"]
    assert set(done[1].instances) == survivors and "3 of 4 x p5.48xlarge for 600 s" in done[1].reason
    assert done[2].instance_type == P5EN and cloud.types() == {P5EN: 4}
    state = state_of(cloud, spec)
    assert state.instance_type == P5EN and state.loss_since is None


def test_after_the_last_option_it_starts_again_from_the_top(cloud):
    clock = Clock()
    spec = cloud.spec(replace_within_seconds=0)
    ctl = cloud.controller(spec, clock)
    cloud.ec2.unavailable.update({P5, P5EN})
    assert kinds(cloud.reconcile(ctl)) == ["launch-failed", "launch-failed", "launched"]
    assert cloud.types() == {P4D: 4}
    cloud.kill(2)
    cloud.ec2.unavailable = {P4D}  # the pick is back, the last option is not
    done = cloud.reconcile(ctl)
    assert kinds(done) == ["launch-failed", "moved", "wrapped", "launched"]
    assert "past the last option (p4d.24xlarge)" in done[2].reason
    assert cloud.types() == {P5: 4}


def test_above_the_ceiling_is_never_launched_and_spot_bids_the_ceiling(cloud):
    spec = cloud.spec(max_price=42.0)  # p5 40 and p4d 20 are under it, p5en 45 is not
    cloud.ec2.unavailable.add(P5)
    done = cloud.reconcile(cloud.controller(spec))
    assert kinds(done) == ["launch-failed", "skipped-price", "launched"]
    assert done[1].instance_type == P5EN and "45.0 USD/h per node (spot), above the ceiling 42.0" in done[1].reason
    assert cloud.types() == {P4D: 4}
    assert [r["LaunchTemplateConfigs"][0]["Overrides"][0]["InstanceType"] for r in cloud.ec2.requests] == [P5, P4D]
    for r in cloud.ec2.requests:
        assert {float(o["MaxPrice"]) for o in r["LaunchTemplateConfigs"][0]["Overrides"]} == {spec.max_price}
        assert float(r["SpotOptions"]["MaxTotalPrice"]) == spec.max_price * spec.nodes


def test_an_option_without_a_price_is_never_launched(cloud):
    spec = cloud.spec((P5, P5E))
    cloud.ec2.unavailable.add(P5)
    done = cloud.reconcile(cloud.controller(spec))
    assert kinds(done) == ["launch-failed", "skipped-price", "waiting"]
    assert "no spot price is known for p5e.48xlarge" in done[1].reason and "none running" in done[2].reason
    assert cloud.types() == {} and all(r["LaunchTemplateConfigs"][0]["Overrides"][0]["InstanceType"] == P5
                                       for r in cloud.ec2.requests)
    assert state_of(cloud, spec).instance_type is None


def test_extras_and_strays_are_terminated(cloud):
    spec = cloud.spec()
    ctl = cloud.controller(spec)
    cloud.reconcile(ctl)
    first = {i["InstanceId"] for i in live_instances(cloud.raw)}
    time.sleep(1.1)  # LaunchTime has whole seconds: the extras must be visibly newer

    def run(instance_type, count):
        tags = [{"ResourceType": "instance", "Tags": [{"Key": TAG_CLUSTER, "Value": CLUSTER}]}]
        return {i["InstanceId"] for i in cloud.raw.run_instances(
            ImageId="ami-12c6146b", InstanceType=instance_type, MinCount=count, MaxCount=count,
            SubnetId=cloud.subnets[0], TagSpecifications=tags)["Instances"]}

    extras, stray = run(P5, 2), run(P4D, 1)
    done = cloud.reconcile(ctl)
    assert kinds(done) == ["terminated-stray", "terminated-extra"]
    assert set(done[0].instances) == stray and "1 x p4d.24xlarge: not the cluster's type p5.48xlarge" in done[0].reason
    assert set(done[1].instances) == extras and "6 running, 4 wanted: the newest go" in done[1].reason
    assert {i["InstanceId"] for i in live_instances(cloud.raw)} == first


def test_teardown_terminates_everything_and_nothing_comes_back_until_resumed(cloud):
    spec = cloud.spec()
    ctl = cloud.controller(spec)
    cloud.reconcile(ctl)
    done = ctl.teardown()
    assert kinds(done) == ["torn-down"] and len(done[0].instances) == 4 and cloud.types() == {}
    # The terminations' own state-change events reach the controller next: they launch nothing.
    again = cloud.reconcile(ctl)
    assert kinds(again) == ["waiting"] and "torn down" in again[0].reason
    assert cloud.types() == {} and len(cloud.ec2.requests) == 1 and state_of(cloud, spec).stopped
    assert kinds(cloud.reconcile(ctl, resume=True)) == ["resumed", "launched"] and cloud.types() == {P5: 4}
    assert not state_of(cloud, spec).stopped


def test_a_spot_warning_starts_the_replacement_before_the_node_goes(cloud):
    spec = cloud.spec()
    ctl = cloud.controller(spec)
    cloud.reconcile(ctl)
    doomed = live_instances(cloud.raw)[0]["InstanceId"]
    done = cloud.reconcile(ctl, noticed=[doomed])
    assert kinds(done) == ["replaced"] and cloud.types() == {P5: 5}, "same type: the noticed node is not an extra"
    assert cloud.reconcile(ctl) == [], "the noticed node is left for AWS to take"
    cloud.raw.terminate_instances(InstanceIds=[doomed])
    assert cloud.reconcile(ctl) == [] and cloud.types() == {P5: 4}
    assert state_of(cloud, spec).noticed == {}


def test_a_launch_describe_instances_does_not_list_yet_is_not_launched_again(cloud):
    clock = Clock()
    spec = cloud.spec()
    ctl = cloud.controller(spec, clock)
    (launched,) = cloud.reconcile(ctl)
    cloud.ec2.hidden.update(launched.instances)
    clock.advance(10)
    assert cloud.reconcile(ctl) == [] and len(cloud.ec2.requests) == 1
    cloud.ec2.hidden.clear()
    assert cloud.reconcile(ctl) == [] and state_of(cloud, spec).recent == {}, "listed now: EC2 is the source again"


def test_a_lost_state_adopts_the_running_cluster_instead_of_replacing_it(cloud):
    spec = cloud.spec()
    cloud.ec2.unavailable.add(P5)
    cloud.reconcile(cloud.controller(spec))
    cloud.s3.delete_object(Bucket=spec.state_bucket, Key=spec.state_key)
    cloud.ec2.unavailable.clear()
    done = cloud.reconcile(cloud.controller(spec))
    assert kinds(done) == ["adopted"] and done[0].instance_type == P5EN
    assert cloud.types() == {P5EN: 4} and len(cloud.ec2.requests) == 2


def test_a_type_dropped_from_the_options_is_replaced_whole(cloud):
    cloud.reconcile(cloud.controller(cloud.spec()))
    done = cloud.reconcile(cloud.controller(cloud.spec((P5EN, P4D))))
    assert kinds(done) == ["terminated-stray", "launched"] and "4 x p5.48xlarge: no longer among the cluster's options" in done[0].reason
    assert cloud.types() == {P5EN: 4}


def test_an_error_about_one_option_moves_on_and_throttling_moves_nothing(cloud):
    broken = cloud.spec()
    broken = dataclasses.replace(broken, options=(dataclasses.replace(broken.options[0],
                                                                      launch_template_id="lt-0123456789abcdef0"),
                                                  *broken.options[1:]))
    done = cloud.reconcile(cloud.controller(broken))
    assert kinds(done) == ["launch-failed", "launched"] and "InvalidLaunchTemplate" in done[0].reason
    assert cloud.types() == {P5EN: 4}

    cloud.ec2.refuse[P5EN] = "RequestLimitExceeded"
    cloud.kill(4)
    with pytest.raises(ClientError, match="RequestLimitExceeded"):
        cloud.reconcile(cloud.controller(broken))
    assert cloud.types() == {} and [r["LaunchTemplateConfigs"][0]["Overrides"][0]["InstanceType"]
                                    for r in cloud.ec2.requests][-1] == P5EN, "p4d was not tried"
    del cloud.ec2.refuse[P5EN]
    assert kinds(cloud.reconcile(cloud.controller(broken)))[-1] == "launched", "the lease was released"


def test_on_demand_with_a_reservation_asks_the_fleet_to_use_it_first(cloud):
    spec = cloud.spec(market="on-demand", capacity_reservation="cr-0123456789abcdef0")
    assert kinds(cloud.reconcile(cloud.controller(spec))) == ["launched"]
    (request,) = cloud.ec2.requests
    assert request["TargetCapacitySpecification"]["DefaultTargetCapacityType"] == "on-demand"
    assert request["OnDemandOptions"] == {
        "AllocationStrategy": "prioritized", "SingleInstanceType": True, "SingleAvailabilityZone": True,
        "MinTargetCapacity": 4, "MaxTotalPrice": "200",
        "CapacityReservationOptions": {"UsageStrategy": "use-capacity-reservations-first"}}
    assert "SpotOptions" not in request
    assert all("MaxPrice" not in o for o in request["LaunchTemplateConfigs"][0]["Overrides"])


def test_a_capacity_block_request_and_moto_launching_nothing(cloud):
    spec = cloud.spec(market="capacity-block", capacity_reservation="cr-0123456789abcdef0")
    done = cloud.reconcile(cloud.controller(spec))
    # moto launches nothing for capacity-block and says nothing: counted, not trusted.
    assert kinds(done) == ["launch-failed"] * 3 + ["waiting"]
    assert "got 0 of 4: the fleet gave no reason" in done[0].reason
    request = cloud.ec2.requests[0]
    assert request["TargetCapacitySpecification"]["DefaultTargetCapacityType"] == "capacity-block"
    assert "CapacityReservationOptions" not in request["OnDemandOptions"], "capacity blocks reject it"


def test_a_held_lease_makes_a_reconcile_wait_and_an_expired_one_is_taken_over(cloud):
    clock = Clock()
    spec = cloud.spec()
    ctl = cloud.controller(spec, clock)
    assert cloud.store(spec).acquire(clock.now) is not None  # another run holds it, and dies holding it
    done = cloud.reconcile(ctl)
    assert kinds(done) == ["waiting"] and "holds the lease" in done[0].reason and cloud.ec2.requests == []
    clock.advance(LEASE_SECONDS + 1)
    assert kinds(cloud.reconcile(ctl)) == ["launched"]
    assert cloud.store(spec).load().lease_until == 0.0, "released at the end"


def test_a_run_whose_lease_was_taken_over_writes_nothing(cloud):
    clock = Clock()
    spec = cloud.spec()
    ctl = cloud.controller(spec, clock)
    # A stalled run: its lease ends while it waits on EC2, and another run takes over meanwhile.
    cloud.ec2.after_fleet = lambda: cloud.store(spec).acquire(clock.now + LEASE_SECONDS + 1)
    done = cloud.reconcile(ctl)
    assert kinds(done) == ["launched"] and "was taken over" in json.loads(cloud.logs[-1])["reason"]
    assert cloud.store(spec).load().history == [], "the new holder's state stands"


def test_no_ec2_change_starts_near_the_end_of_the_lease(cloud):
    clock = Clock()
    spec = cloud.spec()
    ctl = cloud.controller(spec, clock)
    cloud.ec2.unavailable.update({P5, P5EN})
    cloud.ec2.after_fleet = lambda: clock.advance(55)  # slow fleets: two of them use most of the lease
    done = cloud.reconcile(ctl)
    assert kinds(done) == ["launch-failed", "launch-failed", "waiting"]
    assert "lease about to end before launching p4d.24xlarge" in done[-1].reason and cloud.types() == {}
    cloud.ec2.after_fleet = lambda: None
    assert kinds(cloud.reconcile(ctl))[-1] == "launched" and cloud.types() == {P4D: 4}


def test_racing_reconciles_never_mix_types(cloud):
    spec = cloud.spec()
    runners = []
    for _ in range(6):
        ec2 = FlakyEc2(boto3.client("ec2", region_name=REGION))
        ec2.unavailable.add(P5)   # each racer that got this far would fall back to p5en...
        ec2.delay = 0.2           # ...while the others are still asking for p5
        runners.append((ec2, cloud.controller(spec, ec2=ec2)))
    start = threading.Barrier(len(runners))
    results: list = []

    def race(i, controller):
        start.wait()
        time.sleep(0.2 * i)  # some at once, some while the first is launching, some after
        results.append(controller.reconcile())

    threads = [threading.Thread(target=race, args=(i, c)) for i, (_, c) in enumerate(runners)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(results) == len(runners)
    assert sum(kinds(r).count("launched") for r in results) == 1
    assert all(kinds(r) in (["launch-failed", "launched"], ["waiting"], []) for r in results)
    assert all(not ec2.mixed for ec2, _ in runners)
    cloud.check()
    assert cloud.types() == {P5EN: 4}


def test_every_transition_kind_is_declared(cloud):
    clock = Clock()
    spec = cloud.spec(replace_within_seconds=0)
    ctl = cloud.controller(spec, clock)
    cloud.ec2.unavailable.add(P5)
    seen = kinds(cloud.reconcile(ctl))
    cloud.kill(1)
    cloud.ec2.unavailable = {P5EN}
    seen += kinds(cloud.reconcile(ctl)) + kinds(ctl.teardown())
    assert set(seen) <= set(KINDS)
    assert {json.loads(line)["kind"] for line in cloud.logs} == set(seen)
