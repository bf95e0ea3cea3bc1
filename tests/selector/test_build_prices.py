"""scripts/build_prices.py and dl_selector/price_sources.py against cuts of the two real source files
(tests/data/price_sources, see its README), with every expected figure worked out by hand from
the fixture rows; load_prices on the new optional columns; the committed prices.md against the
committed prices.csv."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dl_selector.errors import UserError
from dl_selector.price_sources import (
    CSV_COLUMNS,
    REGIONS,
    Quote,
    is_region,
    is_regular_az,
    parse_on_demand_js,
    read_csv_rows,
    read_spot_quotes,
    spot_stats,
    unlisted_regions,
)
from dl_selector.prices_page import load_sources_toml, render_markdown
from dl_selector.prices import load_prices

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "data" / "price_sources"
DATA = ROOT / "dl_selector" / "data"
SCRIPT = ROOT / "scripts" / "build_prices.py"
TYPES = ("p5.48xlarge", "p5.4xlarge", "p5e.48xlarge", "p6-b200.48xlarge", "inf2.24xlarge")


def _od():
    return parse_on_demand_js((FIXTURES / "all_gpu_instances.js").read_text(), "all_gpu_instances.js")


def _quotes():
    return read_spot_quotes((FIXTURES / "vms.csv").read_text(), "vms.csv")


# ---- on-demand: all_gpu_instances.js -----------------------------------------------------------

def test_on_demand_figures_are_the_files_own():
    od = _od()
    assert od.last_updated == "2026-08-26" and od.declared_total == 99 and od.entries == 4
    assert od.prices["p5.48xlarge", "us-east-1"] == 55.04
    assert od.prices["p5.48xlarge", "ap-northeast-2"] == 75.9552
    assert od.prices["p6-b200.48xlarge", "us-west-2"] == 113.9328
    assert od.prices["p5.4xlarge", "us-west-2"] == 6.88
    # The Local Zone key is its own entry, never mixed into its parent region.
    assert od.prices["p6-b200.48xlarge", "us-east-1-atl-1"] == 113.9328
    assert ("p6-b200.48xlarge", "eu-west-1") not in od.prices
    assert not any(name == "u-p6e-gb200x72" for name, _ in od.prices)  # it has an empty pricing
    assert od.rejected == ()


@pytest.mark.parametrize("text, expected", [
    ("export default {};\n", "no `const NAME = [` array declaration"),
    ("const allGPUInstances = [\n  {\"name\": \"x\",}\n];\n", "not JSON (line 2"),
    ("const allGPUInstances = [\n  {\"pricing\": {}}\n];\n", "array item 0 has no apiName/name"),
])
def test_on_demand_file_that_is_not_the_format_is_one_clear_error(text, expected):
    with pytest.raises(UserError) as e:
        parse_on_demand_js(text, "x.js")
    assert expected in str(e.value) and str(e.value).startswith("x.js: ")


# ---- spot: vms.csv -----------------------------------------------------------------------------

@pytest.mark.parametrize("az, region, regular", [
    ("use1-az4", "us-east-1", True), ("us-east-1a", "us-east-1", True),
    ("use1-atl2-az1", "us-east-1", False), ("usw2-lax1-az2", "us-west-2", False),  # Local Zones (IDs)
    ("us-west-2-lax-1a", "us-west-2", False), ("us-east-1-atl-2a", "us-east-1", False),  # Local Zones (names)
    ("usw2-wl1-sfo-wlz1", "us-west-2", False), ("us-east-1-wl1-bos-wlz-1", "us-east-1", False),  # Wavelength
    ("us-west-2a", "us-east-1", False),  # another region's AZ name
])
def test_local_and_wavelength_zones_are_told_by_their_name(az, region, regular):
    assert is_regular_az(az, region) is regular


FOUR = ("us-east-1", "us-west-2", "eu-west-1", "ap-northeast-2")  # the regions of the first build


def test_spot_median_min_max_and_az_count_by_hand():
    s = spot_stats(_quotes(), TYPES, regions=FOUR, on_demand=_od().prices)
    # p5.48xlarge us-east-1, six regular AZs (the Atlanta Local Zone's 10.2397 left out):
    # 17.6289 19.2531 21.1543 25.7522 55.04 55.04 -> median (21.1543 + 25.7522) / 2.
    # The two AZs at on-demand (55.04) count: without them the median would be 20.2037.
    p5 = s.stats["p5.48xlarge", "us-east-1"]
    assert (p5.median, p5.low, p5.high, p5.azs, p5.at_on_demand) == (23.45325, 17.6289, 55.04, 6, 2)
    # us-west-2: 12.6935 12.9785 12.9727, the altered 0.000000 rejected -> 12.9727.
    w = s.stats["p5.48xlarge", "us-west-2"]
    assert (w.median, w.low, w.high, w.azs, w.at_on_demand) == (12.9727, 12.6935, 12.9785, 3, 0)
    # p6-b200 us-east-1: the Local Zone quote is left out, one AZ is left.
    one = s.stats["p6-b200.48xlarge", "us-east-1"]
    assert (one.median, one.low, one.high, one.azs) == (21.0148, 21.0148, 21.0148, 1)
    assert s.stats["p6-b200.48xlarge", "us-west-2"].median == 25.106  # of 23.0826 25.106 28.442
    # No quote at all: no figure, rather than a zero.
    assert ("p5.4xlarge", "us-east-1") not in s.stats
    # Rows counted: the 4 regions asked for only (us-east-2, ap-south-1 and eu-central-1 rows are not).
    assert s.rows == 19 and s.no_quote == 2
    assert s.zones_excluded == {"use1-atl2-az1": 2}
    assert s.rejected == [("p5.48xlarge", "us-west-2", "usw2-az4", "0", "spot price 0 is zero or negative")]
    # By default every region counts: those rows too, with their own figures; the others are unchanged.
    every = spot_stats(_quotes(), TYPES, on_demand=_od().prices)
    assert every.rows == 23 and every.no_quote == 2
    assert every.stats["p5.48xlarge", "us-east-2"].median == 11.2543
    assert every.stats["p5.4xlarge", "ap-south-1"].at_on_demand == 1
    assert {k: v for k, v in every.stats.items() if k[1] in FOUR} == s.stats


def test_every_region_the_sources_price_is_listed():
    # us-east-2, ap-south-1 (both sources) and eu-central-1 (spot) are regions; us-east-1-atl-1 is a Local Zone.
    assert unlisted_regions(_od(), _quotes(), TYPES) == []
    # Against the first build's four regions: p5.48xlarge's on-demand regions (the fixture's JS entry),
    # p6-b200.48xlarge's us-gov-east-1, and eu-central-1, which only the spot file has (inf2.24xlarge).
    assert unlisted_regions(_od(), _quotes(), TYPES, regions=FOUR) == [
        "ap-northeast-1", "ap-south-1", "ap-southeast-2", "ap-southeast-3", "ca-central-1", "eu-central-1",
        "eu-north-1", "eu-west-2", "sa-east-1", "us-east-2", "us-gov-east-1", "us-gov-west-1", "us-west-1"]
    assert is_region("us-gov-west-1") and is_region("il-central-1")
    assert not is_region("us-east-1-atl-1") and not is_region("us-west-2-wl1-lax1")


def test_quote_a_rounding_step_above_on_demand_is_at_on_demand_not_rejected():
    # inf2.24xlarge euc1-az2: SpotPrice 9.736000 (4 decimals) against Price 9.73595.
    s = spot_stats(_quotes(), TYPES, regions=("eu-central-1",))
    st = s.stats["inf2.24xlarge", "eu-central-1"]
    assert s.rejected == []
    assert (st.median, st.low, st.high, st.azs, st.at_on_demand) == (8.8714, 8.0068, 9.736, 2, 1)


def test_implausible_quotes_are_rejected_with_the_reason():
    quotes = [Quote("g6.xlarge", "us-east-1", "use1-az1", 0.8048, 0.9),  # above on-demand
              Quote("g6.xlarge", "us-east-1", "use1-az2", 0.8048, 0.03),  # under 5% of on-demand
              Quote("g6.xlarge", "us-east-1", "use1-az4", 0.8048, -1.0),
              Quote("g6.xlarge", "us-east-1", "use1-az5", 0.8048, 0.3821)]
    s = spot_stats(quotes, ["g6.xlarge"])
    reasons = {az: why for _, _, az, _, why in s.rejected}
    assert "above the row's on-demand 0.8048" in reasons["use1-az1"]
    assert "below 5% of on-demand" in reasons["use1-az2"]
    assert "zero or negative" in reasons["use1-az4"]
    assert s.stats["g6.xlarge", "us-east-1"].azs == 1


def test_spot_file_without_the_vms_columns_is_refused():
    with pytest.raises(UserError, match="needs the vms.csv columns .*missing SpotPrice"):
        read_spot_quotes("InstanceType,Price,Region,AvailabilityZone\n", "v.csv")


def test_an_az_quoted_twice_is_refused():
    q = Quote("g6.xlarge", "us-east-1", "use1-az1", 0.8048, 0.3)
    with pytest.raises(UserError, match="quoted twice"):
        spot_stats([q, q], ["g6.xlarge"])


# ---- the script, end to end --------------------------------------------------------------------

def _run_build(tmp_path: Path, out: str, *extra: str) -> Path:
    catalog = tmp_path / "catalog.json"
    if not catalog.exists():
        catalog.write_text(json.dumps({"types": [{"instance_type": t, "retired": False} for t in TYPES[:4]]}))
    d = tmp_path / out
    d.mkdir()
    r = subprocess.run([sys.executable, str(SCRIPT), "--on-demand", str(FIXTURES / "all_gpu_instances.js"),
                        "--spot", str(FIXTURES / "vms.csv"), "--catalog", str(catalog),
                        "--on-demand-ref", "OD@299375be", "--spot-ref", "SPOT@00148f2a", "--spot-as-of", "2026-02-01",
                        "--out", str(d / "prices.csv"), "--sources", str(d / "prices_sources.toml"),
                        "--md", str(d / "prices.md"), *extra], check=False, capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    return d


def test_build_writes_the_hand_computed_rows_and_is_byte_identical_on_rerun(tmp_path):
    a, b = _run_build(tmp_path, "a"), _run_build(tmp_path, "b")
    for name in ("prices.csv", "prices_sources.toml", "prices.md"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    rows = read_csv_rows((a / "prices.csv").read_text())
    assert tuple(rows[0]) == CSV_COLUMNS
    got = {(r["instance_type"], r["region"]): r for r in rows}
    # A row wherever the on-demand file prices a type in a region (its Local Zone keys are not
    # regions); p5e has none. In the first build's four regions:
    assert sorted(k for k in got if k[1] in FOUR) == [
        ("p5.48xlarge", "ap-northeast-2"), ("p5.48xlarge", "us-east-1"), ("p5.48xlarge", "us-west-2"),
        ("p5.4xlarge", "us-east-1"), ("p5.4xlarge", "us-west-2"),
        ("p6-b200.48xlarge", "us-east-1"), ("p6-b200.48xlarge", "us-west-2")]
    assert set(got) == {(t, r) for t, r in _od().prices if t in TYPES[:4] and is_region(r)}
    assert ("p5.48xlarge", "us-east-1-atl-1") not in got and ("p6-b200.48xlarge", "us-gov-east-1") in got
    # Beyond them, by hand from the fixture rows: us-east-2 has one AZ (11.2543), ap-south-1 one AZ at on-demand.
    assert got["p5.48xlarge", "us-east-2"]["spot_usd_per_hour"] == "11.2543"
    assert got["p5.4xlarge", "ap-south-1"]["spot_max"] == got["p5.4xlarge", "ap-south-1"]["on_demand_usd_per_hour"] == "8.256"
    p5 = got["p5.48xlarge", "us-east-1"]
    assert (p5["on_demand_usd_per_hour"], p5["spot_usd_per_hour"], p5["spot_min"], p5["spot_max"], p5["spot_azs"]) == \
        ("55.04", "23.45325", "17.6289", "55.04", "6")
    assert (p5["as_of"], p5["spot_as_of"], p5["source"], p5["spot_source"]) == \
        ("2026-08-26", "2026-02-01", "OD@299375be", "SPOT@00148f2a")
    assert p5["note"] == "after 2025-06 P4/P5 price cut"
    assert got["p5.48xlarge", "ap-northeast-2"]["note"] == "after 2025-06 P4/P5 price cut; no spot quote in the snapshot"
    assert got["p6-b200.48xlarge", "us-east-1"]["note"] == "spot from 1 AZ"
    empty = got["p5.4xlarge", "us-east-1"]
    assert empty["spot_usd_per_hour"] == empty["spot_azs"] == empty["spot_as_of"] == empty["spot_source"] == ""

    sources = load_sources_toml((a / "prices_sources.toml").read_text())
    assert sources.spot_without_on_demand == (("p5e.48xlarge", "us-west-2", "19.5387", 1),)
    assert sources.rejected == (("p5.48xlarge", "us-west-2", "usw2-az4", "0", "spot price 0 is zero or negative"),)
    # at on-demand: p5.48xlarge in use1-az1 and use1-az4, p5.4xlarge in aps1-az1
    assert sources.zones_excluded == (("use1-atl2-az1", 2),) and sources.spot_at_on_demand == 3

    md = (a / "prices.md").read_text()
    assert "/tmp" not in md
    assert "- p6-b200.48xlarge in us-east-1: 21.0148" in md  # single-AZ list
    assert "| p5.48xlarge | us-west-2 | usw2-az4 | 0 | spot price 0 is zero or negative |" in md
    assert "- p5e.48xlarge in us-west-2: median 19.5387 over 1 AZ(s)" in md
    assert "- p5e.48xlarge\n" in md  # a catalog type no on-demand row could be made for
    assert "| us-east-1 | 3 | 2 | 1 |" in md  # rows, with spot, single-AZ

    # What the builder writes, load_prices reads back.
    table = load_prices(str(a / "prices.csv"))
    p = table["p5.48xlarge"]["us-east-1"]
    assert (p.spot, p.spot_min, p.spot_max, p.spot_azs, p.spot_date, p.spot_source) == \
        (23.45325, 17.6289, 55.04, 6, "2026-02-01", "SPOT@00148f2a")


def test_build_keeps_an_earlier_comparison_when_asked(tmp_path):
    """--comparison-from: an older snapshot no longer at hand keeps its [comparison] as written."""
    earlier = tmp_path / "earlier.toml"
    earlier.write_text('on_demand_ref = "x"\non_demand_as_of = "2026-08-26"\nspot_ref = "y"\nspot_as_of = "unknown"\n'
                       '[comparison]\n"older snapshot" = "OLD@e385a0d3"\n"pairs compared" = "42"\n')
    d = _run_build(tmp_path, "a", "--comparison-from", str(earlier), "--spot-previous-ref", "OLD@e385a0d3 (us-east-1 only)")
    sources = load_sources_toml((d / "prices_sources.toml").read_text())
    assert sources.comparison == (("older snapshot", "OLD@e385a0d3 (us-east-1 only)"), ("pairs compared", "42"))
    assert "- pairs compared: 42" in (d / "prices.md").read_text()
    r = subprocess.run([sys.executable, str(SCRIPT), "--on-demand", str(FIXTURES / "all_gpu_instances.js"),
                        "--spot", str(FIXTURES / "vms.csv"), "--spot-previous", str(FIXTURES / "vms.csv"),
                        "--comparison-from", str(earlier), "--out", str(tmp_path / "p.csv"),
                        "--sources", str(tmp_path / "s.toml"), "--md", str(tmp_path / "p.md")],
                       check=False, capture_output=True, text=True)
    assert r.returncode == 2 and "pass one" in r.stderr and not (tmp_path / "p.csv").exists()


def test_build_refuses_a_missing_source_with_one_line(tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPT), "--on-demand", str(tmp_path / "none.js"),
                        "--spot", str(FIXTURES / "vms.csv"), "--out", str(tmp_path / "p.csv"),
                        "--sources", str(tmp_path / "s.toml"), "--md", str(tmp_path / "p.md")], check=False,
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("error: cannot read on-demand file") and r.stderr.count("\n") == 1
    assert not (tmp_path / "p.csv").exists()


# ---- load_prices: the optional spot columns ----------------------------------------------------

HEADER = "instance_type,region,on_demand_usd_per_hour,spot_usd_per_hour,spot_min,spot_max,spot_azs\n"


@pytest.mark.parametrize("row, expected", [
    ("g6.xlarge,us-east-1,0.8048,0.38,0.40,0.45,3", "line 2: spot_min 0.4 is above spot_usd_per_hour 0.38"),
    ("g6.xlarge,us-east-1,0.8048,0.38,0.30,0.35,3", "line 2: spot_max 0.35 is below spot_usd_per_hour 0.38"),
    ("g6.xlarge,us-east-1,0.8048,0.38,0.30,0.45,2.5", "line 2: spot_azs = 2.5"),
    ("g6.xlarge,us-east-1,0.8048,0.38,0.30,0.45,-1", "line 2: spot_azs must be at least 0 and at most 1000 (a whole number), got -1"),
    ("g6.xlarge,us-east-1,0.8048,0.38,0.30,0.45,three", "line 2: spot_azs = 'three' is not a number"),
    ("g6.xlarge,us-east-1,0.8048,,0.30,0.45,3", "line 2: spot_min, spot_max, spot_azs given without spot_usd_per_hour"),
    ("g6.xlarge,us-east-1,0.8048,,,,2", "line 2: spot_azs given without spot_usd_per_hour"),
])
def test_bad_spot_spread_is_one_line_naming_file_line_and_what_is_allowed(tmp_path, row, expected):
    f = tmp_path / "mine.csv"
    f.write_text(HEADER + row + "\n")
    with pytest.raises(UserError) as e:
        load_prices(str(f))
    msg = str(e.value)
    assert msg.startswith("price file ") and "mine.csv" in msg and expected in msg and "\n" not in msg


def test_bad_spot_spread_through_the_cli_is_exit_2(capsys, tmp_path):
    from dl_selector.cli import main
    f = tmp_path / "mine.csv"
    f.write_text(HEADER + "g6.xlarge,us-east-1,0.8048,0.38,0.40,0.45,3\n")
    assert main(["recommend", "--profile", "dev-prototyping", "--prices", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: price file ") and "spot_min" in err and err.count("\n") == 1


def test_a_users_four_column_file_still_loads(tmp_path):
    f = tmp_path / "mine.csv"
    f.write_text("instance_type,region,on_demand_usd_per_hour,spot_usd_per_hour\ng6.xlarge,us-east-1,0.70,0.30\n")
    p = load_prices(str(f))["g6.xlarge"]["us-east-1"]
    assert (p.on_demand, p.spot, p.spot_min, p.spot_max, p.spot_azs, p.spot_as_of, p.spot_source) == \
        (0.70, 0.30, None, None, 0, "", "")
    assert p.as_of == "unknown" and p.spot_date == "unknown"


# ---- the committed files -----------------------------------------------------------------------

def test_committed_prices_md_is_what_the_script_renders_from_the_committed_csv():
    rows = read_csv_rows((DATA / "prices.csv").read_text(encoding="utf-8"))
    sources = load_sources_toml((DATA / "prices_sources.toml").read_text(encoding="utf-8"))
    assert (DATA / "prices.md").read_text(encoding="utf-8") == render_markdown(rows, sources), \
        "prices.md is stale: run scripts/build_prices.py --md-only (or rebuild from the sources)"


def test_md_only_rerenders_the_committed_page(tmp_path):
    for name in ("prices.csv", "prices_sources.toml"):
        shutil.copy(DATA / name, tmp_path / name)
    r = subprocess.run([sys.executable, str(SCRIPT), "--md-only", "--out", str(tmp_path / "prices.csv"),
                        "--sources", str(tmp_path / "prices_sources.toml"), "--md", str(tmp_path / "prices.md")],
                       check=False, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "prices.md").read_bytes() == (DATA / "prices.md").read_bytes()


def test_committed_prices_csv_keeps_its_own_promises():
    rows = read_csv_rows((DATA / "prices.csv").read_text(encoding="utf-8"))
    assert tuple(rows[0]) == CSV_COLUMNS
    assert {r["region"] for r in rows} <= set(REGIONS)
    keys = [(r["instance_type"], r["region"]) for r in rows]
    assert keys == sorted(keys), "rows are sorted by type, then region"
    for r in rows:
        single = r["spot_azs"] == "1"
        assert single == ("spot from 1 AZ" in r["note"]), r
        if r["spot_usd_per_hour"]:
            assert r["spot_source"] and r["spot_as_of"] and int(r["spot_azs"]) >= 1, r
            assert float(r["spot_usd_per_hour"]) <= float(r["on_demand_usd_per_hour"]) + 0.0001, r
    load_prices(str(DATA / "prices.csv"))  # the spread checks hold for every row
    assert "/tmp" not in (DATA / "prices.md").read_text(encoding="utf-8")


def test_snapshot_comparison_by_hand():
    from dl_selector.price_sources import SpotSource, SpotStats, compare_snapshots

    def src(**medians):
        return SpotSource(stats={tuple(k.split("__")): SpotStats(m, m, m, 1, 0) for k, m in medians.items()})
    old = src(**{"inf2.48xlarge__us-east-1": 2.0, "p4d.24xlarge__us-west-2": 10.0, "g6.xlarge__us-east-1": 1.0})
    new = src(**{"inf2.48xlarge__us-east-1": 5.0, "p4d.24xlarge__us-west-2": 5.0, "g6.xlarge__us-east-1": 9.0,
                 "p5.48xlarge__us-east-1": 20.0})
    lines = dict(compare_snapshots(new, old, families=["inf2", "p4d", "p5"]))
    assert lines["pairs compared"] == "2"  # g6 is out of scope; p5 is only in the new one
    assert lines["median change"] == "+50%"  # median of +150% and -50%
    assert lines["largest fall 1"] == "p4d.24xlarge us-west-2: 10.0 -> 5.0 (-50%)"
    assert lines["largest rise 1"] == "inf2.48xlarge us-east-1: 2.0 -> 5.0 (+150%)"
    assert (lines["only in this snapshot"], lines["only in the older snapshot"]) == ("1", "0")
