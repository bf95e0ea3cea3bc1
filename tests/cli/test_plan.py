"""`dl-launcher plan`: one test per market, the offline path, AWS errors degrading one market, bad
input, and the read-only guarantee.

moto 5.2 implements none of GetSpotPlacementScores, DescribeCapacityBlockOfferings or
DescribeCapacityReservations, nor EC2's quotas in Service Quotas, so those answers go through
botocore's Stubber, which checks every request and response against botocore's own EC2 and Service
Quotas service models (botocore/data/ec2/2016-11-15/service-2.json: SpotPlacementScore,
CapacityBlockOffering, CapacityReservation; service-quotas: ServiceQuota). EC2's running instances
come from moto (DescribeInstances), as the account would report them."""
from __future__ import annotations

import datetime as dt
import json

import boto3
import pytest
from botocore.stub import Stubber

from dl_launcher import cli, plan
from dl_launcher.plan import blocks, on_demand, reservations, spot
from dl_launcher.plan.lines import HELD, NOW
from dl_launcher.plan.request import ranked
from dl_selector.catalog import load_catalog

P5 = load_catalog().types["p5.48xlarge"]
EAST, WEST = "us-east-1", "us-west-2"


def _req(nodes=16, regions=(EAST, WEST), block_hours=24):
    return plan.parse(nodes, "H100:8", None, list(regions), 3, block_hours)


def _stubbed(service: str, region: str):
    client = boto3.client(service, region_name=region)
    return client, Stubber(client)


def _by_market(req, market):
    return {r: ranked(req, market, r) for r in req.regions}


def test_spot_lines_carry_the_placement_score_for_n_in_one_az():
    req = _req()
    east, east_stub = _stubbed("ec2", EAST)
    west, west_stub = _stubbed("ec2", WEST)
    east_stub.add_response("get_spot_placement_scores", {"SpotPlacementScores": [
        {"Region": EAST, "AvailabilityZoneId": "use1-az4", "Score": 9},
        {"Region": EAST, "AvailabilityZoneId": "use1-az6", "Score": 3},
        {"Region": WEST, "AvailabilityZoneId": "usw2-az1", "Score": 2}]},
        {"InstanceTypes": ["p5.48xlarge"], "TargetCapacity": 16, "TargetCapacityUnitType": "units",
         "SingleAvailabilityZone": True, "RegionNames": [EAST, WEST]})
    east_stub.add_response("describe_availability_zones", {"AvailabilityZones": [
        {"ZoneName": "us-east-1a", "ZoneId": "use1-az4"}, {"ZoneName": "us-east-1b", "ZoneId": "use1-az6"}]})
    west_stub.add_response("describe_availability_zones", {"AvailabilityZones": [
        {"ZoneName": "us-west-2a", "ZoneId": "usw2-az1"}]})
    with east_stub, west_stub:
        got, degraded = spot.lines(req, _by_market(req, "spot"), {EAST: east, WEST: west}.__getitem__)
        east_stub.assert_no_pending_responses()
    assert degraded == []
    lines = {line.region: line for line in got}
    e, w = lines[EAST], lines[WEST]
    assert (e.placement_score, e.availability_zone, e.earliest_start) == (9, "us-east-1a", NOW)
    assert e.usd_per_hour == pytest.approx(16 * P5.price(EAST).spot)
    assert "other AZs 3" in e.start_note
    assert (w.placement_score, w.earliest_start) == (2, None) and w.start_note.startswith("unlikely now")
    assert e.context == {"profile": "training", "instance_type": "p5.48xlarge", "nodes": "16", "market": "spot",
                         "region": EAST}


def _quotas(region: str, value: float):
    client, stub = _stubbed("service-quotas", region)
    stub.add_response("get_service_quota", {"Quota": {
        "ServiceCode": "ec2", "QuotaArn": f"arn:aws:servicequotas:{region}:123456789012:ec2/L-417A185B",
        "QuotaCode": "L-417A185B", "QuotaName": "Running On-Demand P instances", "Value": value, "Unit": "None",
        "Adjustable": True, "GlobalQuota": False}}, {"ServiceCode": "ec2", "QuotaCode": "L-417A185B"})
    stub.activate()
    return client


@pytest.mark.parametrize("quota, start", [(4000.0, NOW), (3072.0, None)])
def test_on_demand_lines_say_the_quota_headroom_after_running_instances(aws, quota, start):
    req = _req(regions=(EAST,))
    ec2 = boto3.client("ec2", region_name=EAST)
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1, InstanceType="p4d.24xlarge")  # 96 P vCPUs in use
    ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1, InstanceType="g5.xlarge")  # another quota's
    clients = {"ec2": ec2, "service-quotas": _quotas(EAST, quota)}
    got, degraded = on_demand.lines(req, _by_market(req, "on-demand"), lambda service, region: clients[service])
    assert degraded == []
    (line,) = got
    need = 16 * P5.vcpus
    assert line.quota == {"code": "L-417A185B", "name": "Running On-Demand P instances", "value": quota, "used": 96,
                          "headroom": quota - 96, "needed": need}
    assert line.earliest_start == start
    assert line.usd_per_hour == pytest.approx(16 * P5.price(EAST).on_demand)
    if start is None:
        assert line.start_note.startswith("after a quota increase")
        assert f"--quota-code L-417A185B --desired-value {need + 96}" in line.before


def test_capacity_block_lines_are_ec2s_offerings_for_n_earliest_first():
    req = _req(regions=(EAST,), block_hours=48)
    ec2, stub = _stubbed("ec2", EAST)
    start = dt.datetime(2026, 12, 3, 11, 30, tzinfo=dt.timezone.utc)

    def offering(oid, days, fee):
        return {"CapacityBlockOfferingId": oid, "InstanceType": "p5.48xlarge", "AvailabilityZone": "us-east-1e",
                "InstanceCount": 16, "StartDate": start + dt.timedelta(days=days),
                "EndDate": start + dt.timedelta(days=days, hours=48), "CapacityBlockDurationHours": 48,
                "UpfrontFee": fee, "CurrencyCode": "USD", "Tenancy": "default"}

    stub.add_response("describe_capacity_block_offerings", {"CapacityBlockOfferings": [
        offering("cbr-0later000000000000", 5, "30000.00"), offering("cbr-0first000000000000", 1, "31488.00")]},
        {"InstanceType": "p5.48xlarge", "InstanceCount": 16, "CapacityDurationHours": 48})
    with stub:
        got, degraded = blocks.lines(req, _by_market(req, "capacity-block"), lambda region: ec2)
    assert degraded == [] and [line.offering_id for line in got] == ["cbr-0first000000000000", "cbr-0later000000000000"]
    first = got[0]
    assert (first.earliest_start, first.total_usd, first.duration_hours) == ("2026-12-04T11:30+00:00", 31488.0, 48)
    assert first.usd_per_hour == pytest.approx(31488.0 / 48)
    assert first.before.startswith("aws ec2 purchase-capacity-block --region us-east-1 "
                                   "--capacity-block-offering-id cbr-0first000000000000")
    assert first.context["market"] == "capacity-block" and "capacity_reservation" in first.context


def test_reservations_the_account_holds_rank_first_when_they_fit():
    req = _req(regions=(EAST,))
    ec2, stub = _stubbed("ec2", EAST)
    end = dt.datetime(2026, 12, 31, tzinfo=dt.timezone.utc)

    def reservation(rid, kind, free):
        return {"CapacityReservationId": rid, "InstanceType": "p5.48xlarge", "InstancePlatform": "Linux/UNIX",
                "AvailabilityZone": "us-east-1c", "TotalInstanceCount": 16, "AvailableInstanceCount": free,
                "State": "active", "ReservationType": kind, "EndDate": end, "InstanceMatchCriteria": "targeted"}

    stub.add_response("describe_capacity_reservations", {"CapacityReservations": [
        reservation("cr-0aaaaaaaaaaaaaaaa", "default", 16), reservation("cr-0bbbbbbbbbbbbbbbb", "capacity-block", 8)]},
        {"Filters": [{"Name": "state", "Values": ["active", "scheduled"]},
                     {"Name": "instance-type", "Values": ["p5.48xlarge"]}]})
    with stub:
        got, degraded = reservations.lines(req, {EAST: {"p5.48xlarge": P5}}, lambda region: ec2)
    assert degraded == []
    fits, small = got
    assert (fits.group, fits.earliest_start, fits.reservation_id) == (HELD, NOW, "cr-0aaaaaaaaaaaaaaaa")
    assert fits.context["capacity_reservation"] == "cr-0aaaaaaaaaaaaaaaa" and fits.context["market"] == "on-demand"
    assert small.earliest_start is None and "8 of 16 free, 16 needed" in small.start_note
    assert small.context["market"] == "capacity-block"


def test_offline_without_credentials_prints_catalog_lines_and_names_the_account_columns(monkeypatch, capsys):
    from dl_stacks.settings import from_context

    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SECURITY_TOKEN", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    assert cli.main(["plan", "--nodes", "4", "--profile", "multi-node-training", "--regions", "us-east-1", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["offline"] and body["offline_reason"] == "no AWS credentials"
    assert body["needs_account"] == list(plan.ACCOUNT_COLUMNS) and body["degraded"] == []
    assert {line["market"] for line in body["lines"]} == {"spot", "on-demand", "capacity-block"}
    for line in body["lines"]:
        assert line["source"] == "catalog" and line["earliest_start"] is None
        ctx = dict(line["take"]["context"])
        if "capacity_reservation" in ctx:
            ctx["capacity_reservation"] = "cr-0123456789abcdef0"  # what the purchase returns
        settings = from_context(ctx)  # the -c keys are the app's own, and valid
        assert (settings.nodes, settings.market, settings.instance_type) == (4, line["market"], line["instance_type"])
    priced = [line["usd_per_hour"] for line in body["lines"] if line["usd_per_hour"] is not None]
    assert priced == sorted(priced)  # no start known anywhere: cheapest first
    assert cli.main(["plan", "--nodes", "4", "--gpu", "H100:8", "--regions", "us-east-1", "--offline"]) == 0
    assert "offline (--offline)" in capsys.readouterr().out


def _full_stubs(record: list):
    """Clients for every market in us-east-1, each answering once: throttled placement scores and a
    quota refused, offerings and reservations answered. Each records the operations it is asked."""
    ec2, stub = _stubbed("ec2", EAST)
    quotas, qstub = _stubbed("service-quotas", EAST)
    for client in (ec2, quotas):
        client.meta.events.register("before-parameter-build", lambda model, **_: record.append(model.name))
    stub.add_client_error("get_spot_placement_scores", "RequestLimitExceeded", "Request limit exceeded.")
    stub.add_response("describe_instances", {"Reservations": []})
    qstub.add_client_error("get_service_quota", "AccessDeniedException", "not authorized to perform: "
                           "servicequotas:GetServiceQuota")
    stub.add_response("describe_capacity_block_offerings", {"CapacityBlockOfferings": []})
    stub.add_response("describe_capacity_reservations", {"CapacityReservations": []})
    stub.activate()
    qstub.activate()
    return {"ec2": ec2, "service-quotas": quotas}, stub


def test_the_plan_only_reads_and_an_aws_error_degrades_its_market_alone():
    record: list = []
    clients, stub = _full_stubs(record)
    result = plan.build(_req(regions=(EAST,)), lambda service, region: clients[service])
    stub.assert_no_pending_responses()
    assert record and all(name.startswith(("Describe", "Get", "List")) for name in record), record
    assert set(record) == {"GetSpotPlacementScores", "DescribeInstances", "GetServiceQuota",
                           "DescribeCapacityBlockOfferings", "DescribeCapacityReservations"}
    reasons = {d["market"]: d["reason"] for d in result.degraded}
    assert reasons["spot"].startswith("placement score not read (RequestLimitExceeded")
    assert reasons["on-demand"].startswith("quota 'Running On-Demand P instances' (L-417A185B) not read "
                                           "(AccessDeniedException")
    assert set(reasons) == {"spot", "on-demand"}
    by_market = {line.market: line for line in result.lines}
    assert by_market["spot"].usd_per_hour is not None and by_market["spot"].source == "catalog"
    assert by_market["capacity-block"].start_note.startswith("EC2 offers no block of 16 x p5.48xlarge")


def test_plan_bounds_nodes_as_the_stack_does():
    from dl_launcher.plan.request import NODES
    from dl_stacks.settings import NODES as STACK_NODES
    assert NODES == STACK_NODES


LINE_KEYS = {"rank", "market", "region", "availability_zone", "instance_type", "nodes", "usd_per_hour", "earliest_start",
             "start_note", "duration_hours", "total_usd", "placement_score", "quota", "offering_id", "reservation_id",
             "source", "take", "notes"}  # docs/cli.md's --json keys


def test_one_ranked_list_held_then_now_cheapest_first_then_dated():
    ec2, stub = _stubbed("ec2", EAST)
    start = dt.datetime(2026, 12, 3, 11, 30, tzinfo=dt.timezone.utc)
    stub.add_response("get_spot_placement_scores", {"SpotPlacementScores": [
        {"Region": EAST, "AvailabilityZoneId": "use1-az4", "Score": 8}]})
    stub.add_response("describe_availability_zones", {"AvailabilityZones": [
        {"ZoneName": "us-east-1a", "ZoneId": "use1-az4"}]})
    stub.add_response("describe_instances", {"Reservations": []})
    stub.add_response("describe_capacity_block_offerings", {"CapacityBlockOfferings": [{
        "CapacityBlockOfferingId": "cbr-0123456789abcdef0", "InstanceType": "p5.48xlarge", "InstanceCount": 16,
        "AvailabilityZone": "us-east-1e", "StartDate": start, "EndDate": start + dt.timedelta(hours=24),
        "CapacityBlockDurationHours": 24, "UpfrontFee": "15103.00", "CurrencyCode": "USD"}]})
    stub.add_response("describe_capacity_reservations", {"CapacityReservations": [{
        "CapacityReservationId": "cr-0aaaaaaaaaaaaaaaa", "InstanceType": "p5.48xlarge", "AvailabilityZone": "us-east-1c",
        "TotalInstanceCount": 16, "AvailableInstanceCount": 16, "State": "active", "ReservationType": "default"}]})
    clients = {"ec2": ec2, "service-quotas": _quotas(EAST, 4000.0)}
    with stub:
        result = plan.build(_req(regions=(EAST,)), lambda service, region: clients[service])
    body = result.to_dict()
    assert [(line["market"], line["earliest_start"]) for line in body["lines"]] == [
        ("reservation", "now"), ("spot", "now"), ("on-demand", "now"), ("capacity-block", "2026-12-03T11:30+00:00")]
    assert all(set(line) == LINE_KEYS for line in body["lines"])
    assert not body["offline"] and body["degraded"] == [] and [line["rank"] for line in body["lines"]] == [1, 2, 3, 4]
    assert body["lines"][0]["take"]["command"] == (
        "dl-launcher launch -c profile=training -c instance_type=p5.48xlarge -c nodes=16 -c market=on-demand "
        "-c region=us-east-1 -c capacity_reservation=cr-0aaaaaaaaaaaaaaaa")


@pytest.mark.parametrize("argv, says", [
    (["--nodes", "0", "--gpu", "H100:8"], "--nodes 0: expected a whole number from 1 to 64"),
    (["--nodes", "4", "--gpu", "H1OO:8"], "closest: H100"),
    (["--nodes", "4", "--gpu", "H100:8", "--regions", "us-east-9"], "--regions: unknown region 'us-east-9'; closest: us-east-2, us-east-1"),
    (["--nodes", "4", "--profile", "multi-node-trainin"], "closest: multi-node-training"),
    (["--nodes", "4"], "plan needs one of --gpu MODEL:COUNT"),
    (["--nodes", "4", "--gpu", "H100:8", "--regions", " , "], "--regions is empty"),
    (["--nodes", "4", "--gpu", "H100:8", "--block-hours", "30"], "closest: 24"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, says):
    assert cli.main(["plan", *argv, "--offline"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and says in err, err
