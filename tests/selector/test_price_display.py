"""Every price the selector shows carries its date, its age and its source, in the table and in
--json; a spot figure says how many AZs stand behind it, and a single-AZ figure is flagged."""
from __future__ import annotations

import datetime as dt
import json
from dl_selector.record import replace

import pytest

from dl_selector import freshness
from dl_selector.catalog import load_catalog
from dl_selector.cli import main
from dl_selector.facts import Price
from dl_selector.recommend import recommend


@pytest.mark.parametrize("as_of, days", [
    ("2026-08-26", 88), ("2026-11-22T10:31Z", 0), ("2024-12", 721), ("unknown", None), ("", None), ("26/08/2026", None),
])
def test_age_in_days_from_every_stamp_the_catalog_holds(as_of, days):
    assert freshness.age_days(as_of, dt.date(2026, 11, 22)) == days


def test_a_future_stamp_is_not_a_negative_age():
    assert freshness.age_days("2027-01-01", dt.date(2026, 11, 22)) == 0
    assert freshness.describe("2027-01-01", dt.date(2026, 11, 22)) == "as of 2027-01-01, today"


def _catalog_with(name: str, region: str, price: Price):
    catalog = load_catalog()
    f = catalog.get(name)
    return replace(catalog, types={**catalog.types, name: replace(f, prices={**f.prices, region: price})})


def test_json_carries_source_date_age_and_spot_spread(capsys):
    assert main(["recommend", "--profile", "multi-node-training", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["market"] == "on-demand"
    assert out["prices"], "the recommendation names the price sources behind its candidates"
    for s in out["prices"]:
        assert s["kind"] in ("on-demand", "spot", "capacity-block") and s["source"] and s["as_of"]
        assert s["age_days"] == freshness.age_days(s["as_of"])
    for c in out["candidates"]:
        p = c["price"]
        if p is None:
            continue
        assert p["on_demand"]["usd_per_hour"] == c["price_per_hour"]
        assert p["on_demand"]["source"] and p["on_demand"]["age_days"] is not None
        if p["spot"]:
            assert p["spot"]["usd_per_hour"] == c["spot_price_per_hour"] and p["spot"]["source"]
            assert p["spot"]["single_az"] == (p["spot"]["azs"] == 1)


def test_single_az_spot_is_flagged_in_table_reasons_and_json():
    region = "us-east-1"
    one_az = Price(on_demand=113.9328, spot=21.01, as_of="2026-08-26", source="od-src", spot_min=21.01,
                   spot_max=21.01, spot_azs=1, spot_as_of="2026-10-01", spot_source="spot-src")
    catalog = _catalog_with("p6-b200.48xlarge", region, one_az)
    rec = recommend("multi-node-training", region=region, catalog=catalog)
    c = next(c for c in rec.candidates if c.instance_type == "p6-b200.48xlarge")
    line = next(r for r in c.reasons if "spot" in r and "on-demand" in r)
    assert "from 1 AZ only: not a market-wide figure" in line and "as of 2026-10-01" in line and "spot-src" in line
    d = c.to_dict()["price"]["spot"]
    assert d["single_az"] is True and d["azs"] == 1 and d["as_of"] == "2026-10-01"
    from dl_selector.render import recommendation_text
    text = recommendation_text(rec)
    row = next(x for x in text.splitlines() if " p6-b200.48xlarge " in x)
    assert "21.01!" in row and "! spot price from a single AZ" in text


def test_spot_spread_is_shown_with_its_azs():
    region = "us-east-1"
    spread = Price(on_demand=21.957642, spot=8.0, as_of="2026-08-26", source="od", spot_min=6.9, spot_max=9.1,
                   spot_azs=4, spot_as_of="2026-08-20", spot_source="sp")
    rec = recommend("multi-node-training", region=region, catalog=_catalog_with("p4d.24xlarge", region, spread))
    c = next(c for c in rec.candidates if c.instance_type == "p4d.24xlarge")
    assert any("median of 4 AZs, $6.90/h-$9.10/h" in r for r in c.reasons)
    assert ["on-demand", "2026-08-26", "od"] in [[s["kind"], s["as_of"], s["source"]] for s in rec.to_dict()["prices"]]
    assert ["spot", "2026-08-20", "sp"] in [[s["kind"], s["as_of"], s["source"]] for s in rec.to_dict()["prices"]]


def test_table_footer_names_each_source_with_its_age(capsys):
    assert main(["recommend", "--profile", "inference", "--top", "3"]) == 0
    out = capsys.readouterr().out
    footer = [x for x in out.splitlines() if x.startswith("prices: ")]
    assert footer and all(" days old)" in x or "date unknown" in x for x in footer)


def test_ages_count_days_as_datetime_does():
    """freshness counts day numbers without datetime (a cold start): datetime is the oracle, over
    every day of four years (a leap year, a century rule), each month, and stamps that are no date."""
    day, end = dt.date(2023, 1, 1), dt.date(2027, 1, 1)
    while day < end:
        assert freshness.day_number(day.isoformat()) == day.toordinal(), day
        assert freshness.day_number(day.isoformat() + "T10:31Z") == day.toordinal(), day
        day += dt.timedelta(days=1)
    for stamp, expected in (("1900-02-28", dt.date(1900, 2, 28)), ("2000-02-29", dt.date(2000, 2, 29)),
                            ("2024-12", dt.date(2024, 12, 1)), ("2026-01", dt.date(2026, 1, 1))):
        assert freshness.parse_as_of(stamp) == expected, stamp
    for bad in ("1900-02-29", "2026-02-30", "2026-13", "2026-00-10", "unknown", "", "26-01-01", "2026-1-05",
                "2026-01-5", "0000-01-01", "２０２６-01-01"):
        assert freshness.day_number(bad) is None and freshness.parse_as_of(bad) is None, bad
    assert freshness.age_days("2026-11-20") == max(0, dt.date.today().toordinal() - dt.date(2026, 11, 20).toordinal())
