"""Issue 39 item 1: every embedded spot figure is dated and sourced.

Read from what the selector ranks on (the embedded catalog's per-region price files) and from the
cited table they were built from (prices.csv), so a figure undated in either fails here."""
from __future__ import annotations

import csv
import tomllib
from pathlib import Path

from dl_selector.catalog import load_catalog
from dl_selector.freshness import parse_as_of

DATA = Path(__file__).resolve().parents[2] / "dl_selector" / "data"


def test_every_spot_figure_in_the_embedded_catalog_has_a_date_and_a_source():
    catalog = load_catalog()
    undated, unsourced, seen = [], [], 0
    for facts in catalog:
        for region in list(facts.prices):
            p = facts.prices[region]
            if p.spot is None:
                continue
            seen += 1
            # spot_as_of itself, not spot_date: an on-demand date must not stand in for the spot one
            if parse_as_of(p.spot_as_of) is None:
                undated.append(f"{facts.instance_type} {region}: {p.spot_as_of!r}")
            if not p.spot_source:
                unsourced.append(f"{facts.instance_type} {region}")
    assert seen > 800  # the check ran over the whole table
    assert not undated, f"{len(undated)} undated spot figures, e.g. {undated[:3]}"
    assert not unsourced, f"{len(unsourced)} spot figures without a source, e.g. {unsourced[:3]}"


def test_the_cited_table_dates_every_spot_row_with_its_sources_date():
    sources = tomllib.loads((DATA / "prices_sources.toml").read_text(encoding="utf-8"))
    assert parse_as_of(sources["spot_as_of"]) is not None, "prices_sources.toml: spot_as_of is no date"
    assert sources["spot_date_note"], "say how the spot date was established"
    with open(DATA / "prices.csv", newline="", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r["spot_usd_per_hour"]]
    assert rows
    wrong = [r for r in rows if r["spot_as_of"] != sources["spot_as_of"] or r["spot_source"] != sources["spot_ref"]]
    assert not wrong, wrong[:2]


def test_a_spot_figure_without_a_date_is_caught(tmp_path):
    """The check above is not vacuous: a price file row with spot but no spot_as_of is undated."""
    from dl_selector.prices import load_prices
    f = tmp_path / "p.csv"
    f.write_text("instance_type,region,on_demand_usd_per_hour,spot_usd_per_hour,as_of\n"
                 "p5en.48xlarge,us-east-1,63.296,20.1,2026-08-26\n")
    p = load_prices(str(f))["p5en.48xlarge"]["us-east-1"]
    assert parse_as_of(p.spot_as_of) is None and p.spot_date == "2026-08-26"
