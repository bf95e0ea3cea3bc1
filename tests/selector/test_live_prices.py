"""Live prices (dl_selector/live_prices.py) against independent stand-ins for AWS:

- recorded response shapes played through botocore's Stubber (tests/data/pricing/README.md says
  where each figure comes from), which also checks them against botocore's service model;
- moto, whose spot history is a placeholder that must be rejected, and which has no Price List API.

No test has credentials for, or can reach, real AWS: an unstubbed call fails the test."""
from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import boto3
import pytest
from botocore.stub import ANY, Stubber

from dl_selector import live_prices
from dl_selector.catalog import load_catalog
from dl_selector.errors import UserError
from tests.selector.cli_run import run

DATA = Path(__file__).resolve().parents[1] / "data" / "pricing"
NOW = dt.datetime(2026, 11, 22, 10, 31, 7, tzinfo=dt.timezone.utc)
STAMP = "2026-11-22T10:31Z"


def recorded(name: str) -> dict:
    return json.loads((DATA / name).read_text())


def spot_page(n: int) -> dict:
    page = recorded(f"describe_spot_price_history_us-east-1_page{n}.json")
    for r in page["SpotPriceHistory"]:  # botocore hands timestamps over parsed
        r["Timestamp"] = dt.datetime.fromisoformat(r["Timestamp"].replace("Z", "+00:00"))
    return page


_SESSION = boto3.session.Session(aws_access_key_id="testing", aws_secret_access_key="testing")


def client(service: str, region: str):
    return _SESSION.client(service, region_name=region)  # one session: the service models load once


class StubSession:
    """A boto3 Session stand-in that hands out Stubber-backed clients and records what it made."""

    def __init__(self):
        self.clients: dict[tuple[str, str], tuple] = {}
        self.made: list[tuple[str, str]] = []

    def stub(self, service: str, region: str) -> Stubber:
        c = client(service, region)
        s = Stubber(c)
        s.activate()
        self.clients[service, region] = (c, s)
        return s

    def get_credentials(self):
        return object()

    def client(self, service, region_name=None):
        self.made.append((service, region_name))
        return self.clients[service, region_name][0]

    def done(self) -> None:
        for _c, s in self.clients.values():
            s.assert_no_pending_responses()


class NoCallSession:
    """Fails the test on any attempt to reach AWS."""

    def get_credentials(self):
        raise AssertionError("credentials looked up: an AWS call was about to be made")

    def client(self, *a, **kw):
        raise AssertionError(f"AWS client created: {a}")


def us_east_1_session() -> StubSession:
    """Both us-east-1 sources answering: spot history (two pages) and the Price List (two pages)."""
    s = StubSession()
    ec2 = s.stub("ec2", "us-east-1")
    for n in (1, 2):
        ec2.add_response("describe_spot_price_history", spot_page(n), {
            "InstanceTypes": ANY, "ProductDescriptions": ["Linux/UNIX"], "StartTime": ANY,
            **({"NextToken": ANY} if n == 2 else {})})
    pricing = s.stub("pricing", "us-east-1")
    for n in (1, 2):
        pricing.add_response("get_products", recorded(f"get_products_us-east-1_page{n}.json"))
    return s


def live(session, regions=("us-east-1",), logs=None, **kw):
    kw.setdefault("max_age_minutes", 60)
    kw.setdefault("now", NOW)
    return live_prices.for_catalog(load_catalog(), list(regions), session=session,
                                   log=(logs.append if logs is not None else lambda m: None), **kw)


EMBEDDED = load_catalog()


def embedded(name: str, region: str):
    return EMBEDDED.get(name).price(region)


# ---- the Price List API ------------------------------------------------------------------------

def test_price_list_is_one_paginated_query_per_region_with_the_linux_filters():
    pricing = client("pricing", "us-east-1")
    calls: list[dict] = []
    pricing.meta.events.register("provide-client-params.pricing.GetProducts", lambda params, **kw: calls.append(dict(params)))
    with Stubber(pricing) as stub:
        for n in (1, 2):
            stub.add_response("get_products", recorded(f"get_products_us-east-1_page{n}.json"))
        od = live_prices.fetch_on_demand(pricing, "us-east-1")
        stub.assert_no_pending_responses()  # both pages read
    assert len(calls) == 2 and "NextToken" not in calls[0]
    assert calls[1]["NextToken"] == recorded("get_products_us-east-1_page1.json")["NextToken"]
    for call in calls:  # the whole region at once: no instanceType filter
        assert call["ServiceCode"] == "AmazonEC2"
        assert {(f["Field"], f["Value"]) for f in call["Filters"]} == {
            ("regionCode", "us-east-1"), ("productFamily", "Compute Instance"), ("operatingSystem", "Linux"),
            ("tenancy", "Shared"), ("preInstalledSw", "NA"), ("capacitystatus", "Used")}
    # Figures of the offer file, page 1 and page 2; the $0.00 Capacity Block row is not a p5 price,
    # and the m5.large Reserved terms' 0.0 hourly dimensions are not its on-demand rate.
    assert od.prices == {"p4d.24xlarge": 21.957642, "p5.48xlarge": 55.04, "g6.xlarge": 0.8048,
                         "trn1.32xlarge": 21.5, "m5.large": 0.096}
    assert od.publication == "2026-09-10T19:55:14Z"


def test_a_zero_only_product_is_not_a_price():
    page = recorded("get_products_us-east-1_page1.json")
    capacity_block_only = [i for i in page["PriceList"] if '"CapacityBlock"' in i]
    assert len(capacity_block_only) == 1
    od = live_prices.on_demand_from_price_list(capacity_block_only, "us-east-1")
    assert od.prices == {} and "p5.48xlarge" not in od.unpriced  # a Capacity Block row is skipped outright
    item = json.loads(capacity_block_only[0])
    item["product"]["attributes"]["marketoption"] = "OnDemand"  # a $0.00 rate among the on-demand rows
    od = live_prices.on_demand_from_price_list([json.dumps(item)], "us-east-1")
    assert od.prices == {} and "$0.00" in od.unpriced["p5.48xlarge"]


def _p4d_variant(**attrs) -> str:
    """The recorded us-east-1 p4d.24xlarge product with some attributes and its rate changed."""
    item = json.loads(recorded("get_products_us-east-1_page1.json")["PriceList"][0])
    usd = attrs.pop("usd", None)
    family = attrs.pop("productFamily", None)
    item["product"]["attributes"].update(attrs)
    if family:
        item["product"]["productFamily"] = family
    if usd:
        (term,) = item["terms"]["OnDemand"].values()
        (dim,) = term["priceDimensions"].values()
        dim["pricePerUnit"]["USD"] = usd
    return json.dumps(item)


def test_products_outside_the_filters_are_not_read_even_if_the_api_returned_them():
    items = [_p4d_variant(),
             _p4d_variant(tenancy="Dedicated", usd="24.1534100000"),
             _p4d_variant(operatingSystem="Windows", usd="25.8136420000"),
             _p4d_variant(preInstalledSw="SQL Std", usd="28.0000000000"),
             _p4d_variant(capacitystatus="UnusedCapacityReservation", usd="21.9576420000"),
             _p4d_variant(regionCode="us-west-2", usd="21.9576400000"),
             _p4d_variant(productFamily="Compute Instance (bare metal)", usd="30.0000000000")]
    od = live_prices.on_demand_from_price_list(items, "us-east-1")
    assert od.prices == {"p4d.24xlarge": 21.957642} and od.unpriced == {}


def test_two_different_rates_for_one_type_are_not_guessed_between():
    s = StubSession()
    ec2 = s.stub("ec2", "us-east-1")
    for n in (1, 2):
        ec2.add_response("describe_spot_price_history", spot_page(n))
    s.stub("pricing", "us-east-1").add_response("get_products", {
        "FormatVersion": "aws_v1", "PriceList": [_p4d_variant(), _p4d_variant(usd="23.0000000000")]})
    table, (summary,) = live(s)
    p4d = table["p4d.24xlarge"]["us-east-1"]
    assert p4d.on_demand == embedded("p4d.24xlarge", "us-east-1").on_demand
    assert "2 different Linux on-demand rates (21.9576, 23)" in p4d.source
    assert p4d.spot == 8.13555  # spot is judged against the embedded on-demand figure instead


# ---- spot history ----------------------------------------------------------------------------

def test_spot_is_the_median_of_the_latest_quote_in_each_az_and_on_demand_is_live():
    s = us_east_1_session()
    table, summaries = live(s)
    s.done()
    p5 = table["p5.48xlarge"]["us-east-1"]
    assert (p5.spot, p5.spot_min, p5.spot_max, p5.spot_azs) == (20.48385, 18.992, 23.0154, 4)
    assert p5.spot_as_of == STAMP and "DescribeSpotPriceHistory" in p5.spot_source
    assert p5.on_demand == 55.04 and p5.as_of == STAMP and "Price List API" in p5.source
    p4d = table["p4d.24xlarge"]["us-east-1"]
    assert (p4d.spot, p4d.spot_min, p4d.spot_max, p4d.spot_azs) == (8.13555, 7.7504, 8.412, 4)
    g6 = table["g6.xlarge"]["us-east-1"]
    assert (g6.spot, g6.spot_azs, g6.on_demand) == (0.3821, 1, 0.8048)
    (summary,) = summaries
    assert summary.spot.live == 3 and summary.on_demand.live == 4  # p4d, p5, g6, trn1


def test_a_type_without_live_figures_keeps_the_embedded_ones_and_says_so():
    s = us_east_1_session()
    table, _ = live(s)
    # g5.2xlarge: in the catalog and offered in us-east-1, in neither recorded response.
    g5, old = table["g5.2xlarge"]["us-east-1"], embedded("g5.2xlarge", "us-east-1")
    assert (g5.on_demand, g5.as_of, g5.spot, g5.spot_date) == (old.on_demand, old.as_of, old.spot, old.spot_date)
    assert g5.source.startswith("embedded figure kept (no Linux on-demand product")
    assert g5.spot_source.startswith("embedded figure kept (no spot quote in us-east-1)")
    # trn1.32xlarge: live on-demand, no spot quote: the two figures carry their own dates.
    trn1, old = table["trn1.32xlarge"]["us-east-1"], embedded("trn1.32xlarge", "us-east-1")
    assert (trn1.on_demand, trn1.as_of) == (21.5, STAMP)
    assert (trn1.spot, trn1.spot_date) == (old.spot, old.spot_date) and "embedded figure kept" in trn1.spot_source


def test_only_the_azs_asked_for_count():
    s = us_east_1_session()
    logs: list[str] = []
    table, _ = live(s, logs=logs, azs=["us-east-1a", "us-east-1d"])
    p5 = table["p5.48xlarge"]["us-east-1"]
    assert (p5.spot, p5.spot_min, p5.spot_max, p5.spot_azs) == (21.60955, 20.2037, 23.0154, 2)
    p4d = table["p4d.24xlarge"]["us-east-1"]
    assert (p4d.spot, p4d.spot_azs) == (8.0001, 1)
    g6 = table["g6.xlarge"]["us-east-1"]  # quoted only in us-east-1b
    assert g6.spot == embedded("g6.xlarge", "us-east-1").spot
    assert "no spot quote in us-east-1a, us-east-1d" in g6.spot_source
    assert not any("no spot quote at all" in line for line in logs)


def test_azs_named_for_one_region_leave_another_region_whole():
    s = us_east_1_session()
    s.stub("ec2", "us-west-2").add_response("describe_spot_price_history", {"SpotPriceHistory": [
        {"AvailabilityZone": az, "InstanceType": "p4d.24xlarge", "ProductDescription": "Linux/UNIX",
         "SpotPrice": price, "Timestamp": NOW - dt.timedelta(minutes=40)}
        for az, price in (("us-west-2a", "8.352700"), ("us-west-2b", "8.901000"), ("us-west-2c", "7.998000"))]})
    s.clients["pricing", "us-east-1"][1].add_response("get_products", recorded("get_products_us-west-2.json"))
    table, _ = live(s, regions=["us-east-1", "us-west-2"], azs=["us-east-1a", "us-east-1d"])
    s.done()
    assert table["p5.48xlarge"]["us-east-1"].spot_azs == 2
    west = table["p4d.24xlarge"]["us-west-2"]
    assert (west.spot, west.spot_min, west.spot_max, west.spot_azs) == (8.3527, 7.998, 8.901, 3)


def test_an_az_with_no_quotes_at_all_is_named():
    s = us_east_1_session()
    logs: list[str] = []
    live(s, logs=logs, azs=["us-east-1a", "us-east-1e"])
    assert [line for line in logs if "no spot quote at all" in line] == [
        "warning: us-east-1: no spot quote at all in us-east-1e (is it an AZ of us-east-1?)"]


def test_moto_spot_placeholders_are_rejected_and_the_embedded_figures_kept(aws):
    logs: list[str] = []
    table, (summary,) = live(boto3.session.Session(region_name="us-east-1"), regions=["us-west-2"],
                             logs=logs, max_age_minutes=0, now=None)
    p, old = table["p4d.24xlarge"]["us-west-2"], embedded("p4d.24xlarge", "us-west-2")
    assert p.spot == old.spot and p.spot_date == old.spot_date
    assert p.spot_source.startswith("embedded figure kept (live spot price 1e-05")
    assert p.on_demand == old.on_demand and "Price List API unavailable" in p.source
    assert summary.spot.live == 0 and summary.spot.rejected > 0
    rejections = [line for line in logs if "rejected implausible live prices" in line]
    assert len(rejections) == 1 and "us-west-2" in rejections[0] and "1e-05" in rejections[0]
    assert sum("Price List API unavailable" in line for line in logs) == 1


# ---- partial failure -------------------------------------------------------------------------

def test_one_region_failing_keeps_the_others_with_one_warning():
    s = us_east_1_session()
    s.stub("ec2", "us-west-2").add_client_error(
        "describe_spot_price_history", service_error_code="RequestLimitExceeded",
        service_message="Request limit exceeded.", http_status_code=503)
    s.clients["pricing", "us-east-1"][1].add_response("get_products", recorded("get_products_us-west-2.json"))
    logs: list[str] = []
    table, _ = live(s, regions=["us-east-1", "us-west-2"], logs=logs)
    s.done()
    assert table["p5.48xlarge"]["us-east-1"].spot == 20.48385  # us-east-1 untouched by us-west-2's failure
    west = table["p4d.24xlarge"]["us-west-2"]
    assert west.spot == embedded("p4d.24xlarge", "us-west-2").spot and "spot price history unavailable" in west.spot_source
    assert (west.on_demand, west.as_of) == (21.95764, STAMP)  # its Price List answer still counts
    warnings = [line for line in logs if line.startswith("warning:")]
    assert warnings == [line for line in warnings if "us-west-2" in line] and len(warnings) == 1
    assert "RequestLimitExceeded" in warnings[0]


def test_the_price_list_failing_keeps_spot_live():
    s = StubSession()
    ec2 = s.stub("ec2", "us-east-1")
    for n in (1, 2):
        ec2.add_response("describe_spot_price_history", spot_page(n))
    s.stub("pricing", "us-east-1").add_client_error("get_products", service_error_code="AccessDeniedException",
                                                    http_status_code=400)
    logs: list[str] = []
    table, _ = live(s, logs=logs)
    p5 = table["p5.48xlarge"]["us-east-1"]
    assert p5.spot == 20.48385 and p5.on_demand == embedded("p5.48xlarge", "us-east-1").on_demand
    assert "Price List API unavailable" in p5.source
    assert len(logs) == 1 and "AccessDeniedException" in logs[0]


def test_nothing_obtained_is_one_error_and_no_cache_file(price_cache):
    s = StubSession()
    s.stub("ec2", "us-east-1").add_client_error("describe_spot_price_history", service_error_code="AuthFailure",
                                                http_status_code=401)
    s.stub("pricing", "us-east-1").add_client_error("get_products", service_error_code="UnrecognizedClientException",
                                                    http_status_code=400)
    with pytest.raises(UserError, match="no live prices could be fetched .*AuthFailure"):
        live(s)
    assert list(price_cache.iterdir()) == []  # nothing half-written, no temporary file left


# ---- the cache -------------------------------------------------------------------------------

def test_a_fresh_cache_is_used_without_any_api_call(price_cache):
    first, _ = live(us_east_1_session())
    assert (price_cache / "us-east-1.json").is_file()
    again, (summary,) = live(NoCallSession(), now=NOW + dt.timedelta(minutes=59))
    assert again == first
    assert summary.quotes.spot_origin == summary.quotes.on_demand_origin == "cached"


def test_a_stale_cache_is_fetched_again():
    live(us_east_1_session())
    s = us_east_1_session()
    later = NOW + dt.timedelta(minutes=61)
    table, _ = live(s, now=later)
    s.done()  # every page asked for again
    assert table["p5.48xlarge"]["us-east-1"].spot_as_of == "2026-11-22T11:32Z"


def test_max_age_zero_always_fetches():
    live(us_east_1_session())
    s = us_east_1_session()
    live(s, max_age_minutes=0, now=NOW + dt.timedelta(seconds=30))
    s.done()


def test_a_cache_for_fewer_types_is_not_fresh_for_spot(price_cache):
    live(us_east_1_session())
    path = price_cache / "us-east-1.json"
    data = json.loads(path.read_text())
    data["spot"]["types"] = ["p5.48xlarge"]  # as written by a run over a smaller catalog
    path.write_text(json.dumps(data))
    s = StubSession()
    ec2 = s.stub("ec2", "us-east-1")
    for n in (1, 2):
        ec2.add_response("describe_spot_price_history", spot_page(n))
    s.stub("pricing", "us-east-1")  # on-demand stays cached: no get_products queued
    live(s)
    s.done()


@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe\x00garbage", b'{"format": "something else"}',
                                     b'{"format": "dl-launcher live prices", "version": 1, "region": "us-east-1",'
                                     b' "spot": {"fetched_at": "yesterday", "types": [], "quotes": {}}}', b""])
def test_a_corrupt_cache_is_ignored_with_a_warning(price_cache, content):
    price_cache.joinpath("us-east-1.json").write_bytes(content)
    s = us_east_1_session()
    logs: list[str] = []
    table, _ = live(s, logs=logs)
    s.done()
    assert table["p5.48xlarge"]["us-east-1"].spot == 20.48385
    assert len(logs) == 1 and logs[0].startswith("warning: ignoring price cache") and "fetching afresh" in logs[0]
    json.loads(price_cache.joinpath("us-east-1.json").read_text())  # replaced by a good one


def test_a_failed_fetch_falls_back_to_the_older_cache_with_its_date():
    live(us_east_1_session())
    s = StubSession()
    s.stub("ec2", "us-east-1").add_client_error("describe_spot_price_history", service_error_code="InternalError",
                                                http_status_code=500)
    s.stub("pricing", "us-east-1").add_client_error("get_products", service_error_code="ThrottlingException",
                                                    http_status_code=400)
    logs: list[str] = []
    table, _ = live(s, logs=logs, now=NOW + dt.timedelta(hours=5))
    p5 = table["p5.48xlarge"]["us-east-1"]
    assert (p5.spot, p5.spot_as_of, p5.on_demand, p5.as_of) == (20.48385, STAMP, 55.04, STAMP)
    assert len(logs) == 2 and all("using the cached" in line and STAMP in line for line in logs)


def test_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("DL_LAUNCHER_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert live_prices.cache_dir() == tmp_path / "xdg" / "dl-launcher" / "prices"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/path")  # the XDG spec says to ignore it
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert live_prices.cache_dir() == tmp_path / "home" / ".cache" / "dl-launcher" / "prices"
    monkeypatch.setenv("DL_LAUNCHER_CACHE", str(tmp_path / "own"))
    assert live_prices.cache_dir() == tmp_path / "own"


def test_an_unwritable_cache_folder_is_a_warning_not_a_failure(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("DL_LAUNCHER_CACHE", str(blocker / "prices"))  # a folder under a file
    logs: list[str] = []
    table, _ = live(us_east_1_session(), logs=logs)
    assert table["p5.48xlarge"]["us-east-1"].spot == 20.48385
    assert len(logs) == 1 and logs[0].startswith("warning: could not write price cache")


# ---- AZ names ---------------------------------------------------------------------------------

@pytest.mark.parametrize("az,region", [("us-east-1a", "us-east-1"), ("us-east-1-bos-1a", "us-east-1"),
                                       ("us-west-2d", "us-west-2"), ("us-east-1", None), ("us-east-12a", None),
                                       ("eu-west-1a", None), ("us-east-1a ", None)])
def test_az_region(az, region):
    assert live_prices.az_region(az, ["us-east-1", "us-west-2"]) == region


# ---- the CLI -----------------------------------------------------------------------------------


def no_aws(*a, **kw):
    raise AssertionError("boto3 Session created: an AWS call was about to be made")


def test_recommend_live_ranks_with_cached_live_prices_without_calling_aws(capsys, monkeypatch):
    live(us_east_1_session(), now=live_prices.utcnow())  # the cache a run minutes ago left
    monkeypatch.setattr(boto3.session, "Session", no_aws)
    code, out, err = run(capsys, "recommend", "--profile", "multi-node-training", "--live", "--spot", "--json")
    assert code == 0, err
    p5 = next(c for c in json.loads(out)["candidates"] if c["instance_type"] == "p5.48xlarge")
    assert p5["spot_price_per_hour"] == 20.48385 != embedded("p5.48xlarge", "us-east-1").spot  # the live median
    spot = p5["price"]["spot"]  # with its own spread, date and source, for the table and --json to show
    assert (spot["min"], spot["max"], spot["azs"], spot["age_days"]) == (18.992, 23.0154, 4, 0)
    assert spot["as_of"].endswith("Z") and "T" in spot["as_of"] and "DescribeSpotPriceHistory" in spot["source"]
    assert "Price List API" in p5["price"]["on_demand"]["source"]
    assert err.startswith("live prices: us-east-1:") and "cached" in err and "warning" not in err


def test_recommend_live_with_az_counts_only_those(capsys, monkeypatch):
    live(us_east_1_session(), now=live_prices.utcnow())
    monkeypatch.setattr(boto3.session, "Session", no_aws)
    code, out, err = run(capsys, "recommend", "--profile", "multi-node-training", "--live", "--spot", "--json",
                         "--az", "us-east-1a,us-east-1d")
    assert code == 0, err
    p5 = next(c for c in json.loads(out)["candidates"] if c["instance_type"] == "p5.48xlarge")
    assert p5["spot_price_per_hour"] == 21.60955


def test_recommend_without_live_uses_the_embedded_figures(capsys, monkeypatch):
    live(us_east_1_session(), now=live_prices.utcnow())  # a cache is there, and must not be read
    monkeypatch.setattr(boto3.session, "Session", no_aws)
    code, out, err = run(capsys, "recommend", "--profile", "multi-node-training", "--spot", "--json")
    assert code == 0 and err == ""
    p5 = next(c for c in json.loads(out)["candidates"] if c["instance_type"] == "p5.48xlarge")
    assert p5["spot_price_per_hour"] == embedded("p5.48xlarge", "us-east-1").spot


def test_recommend_live_without_credentials_is_one_line_and_caches_nothing(capsys, monkeypatch, price_cache):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    code, out, err = run(capsys, "recommend", "--profile", "multi-node-training", "--live")
    assert code == 2 and out == ""
    assert err == "error: recommend --live needs AWS credentials (AWS_PROFILE or AWS_ACCESS_KEY_ID); none found\n"
    assert list(price_cache.iterdir()) == []


def test_recommend_live_when_aws_cannot_be_reached_is_one_line_exit_2(capsys, monkeypatch, price_cache):
    # conftest's fake credentials and dead endpoint: every call fails to connect.
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    code, out, err = run(capsys, "recommend", "--profile", "multi-node-training", "--live")
    assert code == 2 and out == ""
    assert err.startswith("error: no live prices could be fetched") and err.count("\n") == 1, err
    assert "Traceback" not in err and list(price_cache.iterdir()) == []


def test_recommend_live_botocore_error_outside_a_fetch_is_one_line(capsys, monkeypatch):
    from botocore.exceptions import ProfileNotFound

    def broken(*a, **kw):
        raise ProfileNotFound(profile="nope")
    monkeypatch.setattr(boto3.session, "Session", broken)
    code, out, err = run(capsys, "recommend", "--profile", "multi-node-training", "--live")
    assert code == 2 and err.startswith("error: recommend --live failed talking to AWS:") and err.count("\n") == 1


def test_catalog_refresh_prices_writes_live_figures_and_keeps_the_specs(capsys, monkeypatch, tmp_path, price_cache):
    import dl_selector.refresh
    s = us_east_1_session()
    monkeypatch.setattr(boto3.session, "Session", lambda *a, **kw: s)
    monkeypatch.setattr(dl_selector.refresh, "describe_accelerated_types", no_aws)  # prices only: no specs call
    out = tmp_path / "cat.json"
    code, text, err = run(capsys, "catalog", "refresh", "--prices", "--region", "us-east-1", "--out", str(out))
    assert code == 0, err
    s.done()
    first, *_rest, last = text.splitlines()
    assert first.startswith("us-east-1: ") and "on-demand 4 live" in first and "spot 3 live" in first
    assert last.endswith(f"written to {out}") and str(price_cache) in last
    written = load_catalog(str(out))
    assert written.specs_source == EMBEDDED.specs_source and written.as_of == EMBEDDED.as_of
    p5 = written.get("p5.48xlarge").price("us-east-1")
    assert (p5.on_demand, p5.spot, p5.spot_azs) == (55.04, 20.48385, 4)
    assert p5.as_of == p5.spot_as_of and len(p5.as_of) == len("2026-11-22T10:31Z") and p5.as_of.endswith("Z")
    assert written.get("p5.48xlarge").price("us-west-2") == embedded("p5.48xlarge", "us-west-2")  # not asked for
    assert (price_cache / "us-east-1.json").is_file()
    # The file round-trips through the CLI as a --catalog.
    code, out_json, err = run(capsys, "recommend", "--profile", "multi-node-training", "--spot", "--json",
                              "--catalog", str(out))
    assert code == 0 and any(c["spot_price_per_hour"] == 20.48385 for c in json.loads(out_json)["candidates"])


def test_catalog_refresh_prices_against_moto_rejects_placeholders(aws, capsys, tmp_path):
    out = tmp_path / "cat.json"
    code, text, err = run(capsys, "catalog", "refresh", "--prices", "--region", "us-west-2", "--out", str(out))
    assert code == 0, err
    assert text.startswith("us-west-2: ") and "spot 0 live" in text
    assert "Price List API unavailable" in err and "rejected implausible live prices" in err
    p = load_catalog(str(out)).get("p4d.24xlarge").price("us-west-2")
    assert p.spot == embedded("p4d.24xlarge", "us-west-2").spot and "1e-05" in p.spot_source
