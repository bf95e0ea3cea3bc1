"""Live Capacity Block rates from DescribeCapacityBlockOfferings, against responses in the shape
EC2 returns them (botocore's Stubber validates every request and response against the EC2 API
model, so a wrong parameter or field name fails here, not in a user's account)."""
from __future__ import annotations

import datetime as dt

import boto3
import pytest
from botocore.stub import Stubber

from dl_selector.capacity_block_quotes import quote_rates
from dl_selector.catalog import load_catalog
from dl_selector.recommend import recommend

NOW = dt.datetime(2026, 11, 22, 10, 31, tzinfo=dt.timezone.utc)
START = dt.datetime(2026, 11, 25, 11, 30, tzinfo=dt.timezone.utc)


def _offering(name: str, fee: str, az: str = "us-east-2a", hours: int = 24, count: int = 1, currency: str = "USD",
              offering_id: str = "cbr-0123456789abcdef0") -> dict:
    return {"CapacityBlockOfferingId": offering_id, "InstanceType": name, "AvailabilityZone": az,
            "InstanceCount": count, "StartDate": START, "EndDate": START + dt.timedelta(hours=hours),
            "CapacityBlockDurationHours": hours, "UpfrontFee": fee, "CurrencyCode": currency, "Tenancy": "default"}


def _params(name: str) -> dict:
    return {"InstanceType": name, "InstanceCount": 1, "CapacityDurationHours": 24}


@pytest.fixture
def ec2():
    client = boto3.client("ec2", region_name="us-east-2", aws_access_key_id="x", aws_secret_access_key="x")
    with Stubber(client) as stub:
        yield client, stub
        stub.assert_no_pending_responses()


def test_cheapest_offering_per_instance_hour_across_pages(ec2):
    client, stub = ec2
    stub.add_response("describe_capacity_block_offerings", {
        "CapacityBlockOfferings": [_offering("p5e.48xlarge", "1038.24"),  # 43.26/h
                                   _offering("p5e.48xlarge", "2000.00", az="us-east-2b", count=2)],  # 41.67/h
        "NextToken": "page-2"}, _params("p5e.48xlarge"))
    stub.add_response("describe_capacity_block_offerings", {
        "CapacityBlockOfferings": [_offering("p5e.48xlarge", "7200.00", hours=168)]},  # 42.86/h
        {**_params("p5e.48xlarge"), "NextToken": "page-2"})
    logs: list[str] = []
    rates = quote_rates(client, ["p5e.48xlarge"], now=NOW, log=logs.append)
    r = rates["p5e.48xlarge"]
    assert r.usd_per_hour == pytest.approx(2000 / 48, abs=1e-4)
    assert r.as_of == "2026-11-22T10:31Z" and "cheapest of 3 offering(s)" in r.source and "us-east-2" in r.source
    assert logs == []


def test_refusals_empty_answers_and_implausible_quotes_keep_the_rate_on_record(ec2):
    client, stub = ec2
    stub.add_client_error("describe_capacity_block_offerings", service_error_code="InvalidParameterValue",
                          service_message="The instance type g5.xlarge is not supported for Capacity Blocks.",
                          expected_params=_params("g5.xlarge"))
    stub.add_response("describe_capacity_block_offerings", {"CapacityBlockOfferings": []}, _params("p5.48xlarge"))
    stub.add_response("describe_capacity_block_offerings", {"CapacityBlockOfferings": [
        _offering("p4d.24xlarge", "0.00"), _offering("p4d.24xlarge", "354.00", currency="EUR")]}, _params("p4d.24xlarge"))
    logs: list[str] = []
    assert quote_rates(client, ["g5.xlarge", "p5.48xlarge", "p4d.24xlarge"], now=NOW, log=logs.append) == {}
    assert any("g5.xlarge" in x and "not supported for Capacity Blocks" in x for x in logs)
    assert any("p5.48xlarge" in x and "quotes no Capacity Block offering" in x for x in logs)
    assert any("zero or negative" in x for x in logs) and any("not a USD figure" in x for x in logs)


def test_quoted_rates_replace_the_rate_on_record_and_rank(ec2):
    client, stub = ec2
    stub.add_response("describe_capacity_block_offerings", {
        "CapacityBlockOfferings": [_offering("trn2.48xlarge", "720.00")]}, _params("trn2.48xlarge"))
    rates = quote_rates(client, ["trn2.48xlarge"], now=NOW)
    catalog = load_catalog()
    assert catalog.get("trn2.48xlarge").capacity_block_prices["us-east-2"].usd_per_hour == 35.7608  # on record
    live = catalog.with_capacity_block_prices("us-east-2", rates)
    rec = recommend("neuron-training", region="us-east-2", market="capacity-block", catalog=live)
    trn2 = next(c for c in rec.candidates if c.instance_type == "trn2.48xlarge")
    assert trn2.capacity_block_price_per_hour == 30.0
    assert trn2.to_dict()["capacity_block_price"]["as_of"] == "2026-11-22T10:31Z"


def test_cli_live_capacity_block_ranks_on_todays_quote(capsys, monkeypatch):
    """recommend --live --capacity-block: spot/on-demand from a fresh cache (no AWS call), the block
    rates from EC2's quotes through the stubbed client; the quote replaces the rate on record."""
    import json

    from dl_selector import live_prices
    from dl_selector.cli import main
    from tests.selector.test_live_prices import live, us_east_1_session

    live(us_east_1_session(), now=live_prices.utcnow())  # fresh list-price cache for us-east-1
    client = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    stub = Stubber(client)
    stub.activate()
    names = [f.instance_type for f in load_catalog() if f.capacity_block_source and "us-east-1" in f.regions]
    for name in names:
        offerings = [_offering(name, "1200.00", az="us-east-1a")] if name == "p5.48xlarge" else []
        stub.add_response("describe_capacity_block_offerings", {"CapacityBlockOfferings": offerings}, _params(name))

    class Session:
        def __init__(self, *a, **kw):
            pass

        def client(self, service, region_name=None):
            assert (service, region_name) == ("ec2", "us-east-1")
            return client

    monkeypatch.setattr(boto3.session, "Session", Session)
    assert main(["recommend", "--profile", "multi-node-training", "--live", "--capacity-block", "--json"]) == 0
    out, err = capsys.readouterr()
    p5 = next(c for c in json.loads(out)["candidates"] if c["instance_type"] == "p5.48xlarge")
    assert p5["capacity_block_price_per_hour"] == 50.0  # 1200 / 24 h, not the $39.33 on record
    assert "DescribeCapacityBlockOfferings in us-east-1" in p5["capacity_block_price"]["source"]
    assert "live Capacity Block quotes: 1 type(s) in us-east-1" in err
    stub.assert_no_pending_responses()
