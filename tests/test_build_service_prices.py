"""scripts/build_service_prices.py against real Price List answers (tests/data/service_pricing, cited in
its README) replayed through botocore's Stubber, which also checks each call against the pricing
service model; and the stack's reader (dl_stacks/stack_cost.py) on the written table."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber

ROOT = Path(__file__).resolve().parents[1]
RECORDS = Path(__file__).parent / "data" / "service_pricing"
BOOK = ROOT / "dl_selector" / "data" / "service_prices.json"

_spec = importlib.util.spec_from_file_location("build_service_prices", ROOT / "scripts" / "build_service_prices.py")
bsp = importlib.util.module_from_spec(_spec)
sys.modules["build_service_prices"] = bsp  # dataclasses look their module up there
_spec.loader.exec_module(bsp)

SG = "ap-southeast-1"


def records(name: str) -> list[str]:
    return json.loads((RECORDS / name).read_text())["PriceList"]


def page(items, token=None):
    out = {"FormatVersion": "aws_v1", "PriceList": list(items)}
    if token:
        out["NextToken"] = token
    return out


# The queries a Singapore run makes, in order, and the recorded answer to each (empty where the
# record holds none). The NAT query is spelled out: it is what the Price List docs and the records
# say selects NAT gateway products (AmazonEC2, productFamily "NAT Gateway").
SINGAPORE = [
    ({"ServiceCode": "AmazonEC2", "FormatVersion": "aws_v1", "MaxResults": 100, "Filters": [
        {"Type": "TERM_MATCH", "Field": "regionCode", "Value": SG},
        {"Type": "TERM_MATCH", "Field": "productFamily", "Value": "NAT Gateway"}]}, "nat-gateway.json"),
    (None, None),  # AmazonVPC: public IPv4
    (None, "ebs-gp3.json"),
    (None, "cloudwatch.json"),
    ({"ServiceCode": "AmazonCloudWatch", "FormatVersion": "aws_v1", "MaxResults": 100, "Filters": [
        {"Type": "TERM_MATCH", "Field": "productFamily", "Value": "Dashboard"}]}, None),  # global: no regionCode
    (None, "s3-storage.json"),
    (None, "s3-requests.json"),
    (None, "kms.json"),
]


def singapore_client():
    client = boto3.client("pricing", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    stub = Stubber(client)
    for expected, name in SINGAPORE:
        stub.add_response("get_products", page(records(name) if name else []), expected)
    stub.activate()
    return client, stub


def test_singapore_figures_from_real_records():
    client, stub = singapore_client()
    figures, missing = bsp.fetch_region(client, SG, sleep=lambda s: None)
    stub.assert_no_pending_responses()
    got = {k: (f.price, f.sku) for k, f in figures.items()}
    assert got == {
        # not the Regional NAT gateway products (same family, same price here, other SKUs)
        "nat_gateway_hour": (0.059, "98TA3WPUP3A4AH4Y"),
        "nat_gateway_gb": (0.059, "E9U985ZGMWKXKT47"),
        "ebs_gp3_gb_month": (0.096, "X8SY8CJFS8WV7VQN"),
        "cw_metric_month": (0.30, "2BF5WZ4QVWF9XRRT"),  # the first 10,000 metrics, not 0.10/0.05/0.02
        "cw_alarm_metric_month": (0.10, "ERS2PGV5BX4XH4WQ"),  # standard, not high resolution (0.30)
        "cw_metrics_requested_1000": (0.01, "9J7G2HNBW96AU3AP"),  # $0.00001 per metric, written per 1,000
        "logs_ingested_gb": (0.70, "ZEKCE7VGMSM5XZPW"),  # Standard class, not Infrequent Access (0.35)
        "logs_stored_gb_month": (0.03, "RKCBFFXUWXG8KUQY"),  # not TimedStorage-IA (0.018)
        "s3_put_1000": (0.005, "VHRJWKRHEA6VHEFY"),  # not the Annotation requests of the same group
        "s3_standard_gb_month": (0.025, "M6MTARCQFUQBQ2V3"),  # first 50 TB; not the Annotation storage
        "kms_key_month": (1.0, "R8AEZWXXE7G5EHRZ"),
    }
    assert figures["nat_gateway_hour"].usagetype == "APS1-NatGateway-Hours"
    assert figures["nat_gateway_hour"].publication == "2026-08-10T21:57:58Z"
    assert set(missing) == {"public_ipv4_hour", "cw_dashboard_month"}
    assert missing["public_ipv4_hour"] == "no AmazonVPC product with usagetype *PublicIPv4:InUseAddress in ap-southeast-1"
    assert missing["cw_dashboard_month"] == "no AmazonCloudWatch product with usagetype *DashboardsUsageHour (global)"


def test_the_global_dashboard_query_is_asked_once_for_all_regions():
    client, stub = singapore_client()
    answers: dict = {}
    bsp.fetch_region(client, SG, sleep=lambda s: None, answers=answers)
    stub.assert_no_pending_responses()
    for expected, _ in SINGAPORE:  # the next region: its own queries only (one more call would find no answer)
        if expected is None or any(f["Field"] == "regionCode" for f in expected["Filters"]):
            stub.add_response("get_products", page([]))
    figures, missing = bsp.fetch_region(client, "ap-south-1", sleep=lambda s: None, answers=answers)
    stub.assert_no_pending_responses()
    assert figures == {} and set(missing) == set(bsp.ITEMS)


def test_committed_singapore_row_is_what_the_records_give():
    client, _ = singapore_client()
    figures, missing = bsp.fetch_region(client, SG, sleep=lambda s: None)
    book = json.loads(BOOK.read_text())
    assert book["regions"][SG] == {k: f.price for k, f in figures.items()}
    assert {k: v["sku"] for k, v in book["figures"][SG].items()} == {k: f.sku for k, f in figures.items()}
    assert set(book["missing"][SG]) == set(missing)  # reasons: "not in the recorded answers"
    assert book["region_as_of"][SG] == "2026-08-10"


def test_pages_followed_and_throttling_retried():
    nat = records("nat-gateway.json")
    client = boto3.client("pricing", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    stub = Stubber(client)
    stub.add_client_error("get_products", "ThrottlingException", "Rate exceeded", 400)
    stub.add_response("get_products", page(nat[2:], token="t1"))
    stub.add_client_error("get_products", "ThrottlingException", "Rate exceeded", 400)
    stub.add_response("get_products", page(nat[:2]), {
        "ServiceCode": "AmazonEC2", "FormatVersion": "aws_v1", "MaxResults": 100, "NextToken": "t1",
        "Filters": [{"Type": "TERM_MATCH", "Field": "regionCode", "Value": SG},
                    {"Type": "TERM_MATCH", "Field": "productFamily", "Value": "NAT Gateway"}]})
    stub.activate()
    slept = []
    items = bsp.get_products(client, "AmazonEC2", bsp._filters(SG, bsp.ITEMS["nat_gateway_hour"]), slept.append)
    stub.assert_no_pending_responses()
    assert len(items) == 4 and len(slept) == 2
    fig, _ = bsp.pick(items, "nat_gateway_hour", bsp.ITEMS["nat_gateway_hour"], SG)
    assert fig.sku == "98TA3WPUP3A4AH4Y"


def _edited(record: str, **changes) -> str:
    p = json.loads(record)
    dim = next(iter(next(iter(p["terms"]["OnDemand"].values()))["priceDimensions"].values()))
    dim.update(changes)
    return json.dumps(p)


@pytest.mark.parametrize("change, reason", [
    ({"unit": "Quantity"}, "its unit is 'Quantity', the stack multiplies by 'Hrs'"),
    ({"pricePerUnit": {"USD": "0.0000000000"}}, "the Price List quotes $0"),
])
def test_unusable_product_is_missing_with_its_reason(change, reason):
    hours = records("nat-gateway.json")[0]
    fig, why = bsp.pick([_edited(hours, **change)], "nat_gateway_hour", bsp.ITEMS["nat_gateway_hour"], SG)
    assert fig is None and "98TA3WPUP3A4AH4Y (APS1-NatGateway-Hours)" in why and reason in why


def test_two_products_that_disagree_are_missing_not_guessed():
    hours = records("nat-gateway.json")[0]
    other = json.loads(_edited(hours, pricePerUnit={"USD": "0.0650000000"}))
    other["product"]["sku"] = "ZZZZZZZZZZZZZZZZ"
    fig, why = bsp.pick([hours, json.dumps(other)], "nat_gateway_hour", bsp.ITEMS["nat_gateway_hour"], SG)
    assert fig is None and "disagree (98TA3WPUP3A4AH4Y 0.059, ZZZZZZZZZZZZZZZZ 0.065)" in why


def test_main_writes_fetched_region_and_keeps_the_rest(tmp_path, capsys):
    out = tmp_path / "service_prices.json"
    out.write_text(BOOK.read_text())
    client, stub = singapore_client()
    assert bsp.main(["--regions", SG, "--out", str(out), "--date", "2026-11-27"], pricing=client) == 0
    new, old = json.loads(out.read_text()), json.loads(BOOK.read_text())
    assert new["regions"]["us-east-1"] == old["regions"]["us-east-1"]  # fsx key and all: not asked for
    assert new["regions"][SG]["nat_gateway_hour"] == 0.059
    assert "public_ipv4_hour" not in new["regions"][SG]  # never us-east-1's copied in
    assert new["price_list"]["fetched"] == "2026-11-27"


def test_api_failure_writes_nothing(tmp_path, capsys):
    out = tmp_path / "service_prices.json"
    out.write_text(BOOK.read_text())
    before = out.read_text()
    client = boto3.client("pricing", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    stub = Stubber(client)
    stub.add_client_error("get_products", "AccessDeniedException", "not allowed pricing:GetProducts", 400)
    stub.activate()
    assert bsp.main(["--regions", SG, "--out", str(out)], pricing=client) == 1
    assert out.read_text() == before
    assert "nothing written" in capsys.readouterr().err


def test_unknown_region_is_one_line_exit_2():
    r = subprocess.run([sys.executable, "scripts/build_service_prices.py", "--regions", "ap-southeast-9"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "closest: ap-southeast-" in r.stderr


def test_reader_uses_the_regions_own_figures_and_names_what_it_borrows():
    from dl_stacks.stack_cost import prices_for
    p = prices_for(SG)
    assert p.priced_as == SG and p["nat_gateway_hour"] == 0.059 and p["ebs_gp3_gb_month"] == 0.096
    assert p["public_ipv4_hour"] == 0.005  # us-east-1's, and said so
    assert "us-east-1's for" in p.note and "public_ipv4_hour" in p.note and "2026-08-10" in p.note
    assert "nat_gateway_hour" not in p.note
    other = prices_for("eu-north-1")
    assert other.priced_as == "us-east-1" and "none on record for eu-north-1" in other.note
    assert prices_for("us-east-2").note == "AWS list prices of 2026-11-25"


def test_a_singapore_stack_is_priced_with_singapores_nat_and_names_what_it_borrows():
    import aws_cdk as cdk

    from dl_stacks.settings import from_context
    from dl_stacks.training_stack import TrainingStack
    hours = json.loads(records("nat-gateway.json")[0])  # the record, not the product's table
    rate = float(next(iter(next(iter(hours["terms"]["OnDemand"].values()))["priceDimensions"].values()))
                 ["pricePerUnit"]["USD"])
    stack = TrainingStack.for_settings(cdk.App(), from_context({"profile": "dev-prototyping", "region": SG}), quiet=True)
    (nat,) = [line for line in stack.cost.lines if line.what == "NAT gateway"]
    assert nat.per_hour == pytest.approx(rate) == pytest.approx(0.059)
    assert "us-east-1's for public_ipv4_hour, cw_dashboard_month (none on record for ap-southeast-1)" in stack.cost.note
