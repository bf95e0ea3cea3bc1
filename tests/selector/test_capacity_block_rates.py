"""Issue 39 item 2: one Capacity Block rate per type and region, with its date and source.

capacity_blocks.toml holds the rates; the catalog carries them. Two p5en and two p5e rates once
disagreed inside the repo (a table derivation quoted a snapshot the catalog did not rank on). These
tests fail on a second rate anywhere: a duplicate key in the catalog, or a quoted dollar figure
beside a Capacity Block type, in a passage about Capacity Blocks, that is not the catalog's rate."""
from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest

from dl_selector.catalog import load_catalog
from dl_selector.paths import data_file

ROOT = Path(__file__).resolve().parents[2]
# Where prices are written for people: the selector's data notes and the docs.
TEXT = [*sorted((ROOT / "dl_selector" / "data").glob("*.md")), *sorted((ROOT / "dl_selector" / "data").glob("*.toml")),
        ROOT / "dl_selector" / "data" / "accelerators.csv", *sorted((ROOT / "docs").glob("*.md")),
        ROOT / "README.md"]


def _no_duplicate_keys(pairs):
    keys = [k for k, _ in pairs]
    dupes = {k for k in keys if keys.count(k) > 1}
    if dupes:
        raise AssertionError(f"duplicate keys {sorted(dupes)}")
    return dict(pairs)


def test_the_catalog_holds_one_dated_sourced_rate_per_type_and_region():
    raw = json.loads(Path(data_file("catalog.json")).read_text(), object_pairs_hook=_no_duplicate_keys)
    assert raw  # parsed without a duplicate key anywhere, capacity_block_prices included
    for facts in load_catalog():
        for region, rate in facts.capacity_block_prices.items():
            assert rate.usd_per_hour > 0 and rate.as_of and rate.source, (facts.instance_type, region)


def test_the_rates_file_gives_every_rate_a_date():
    data = tomllib.loads(Path(data_file("capacity_blocks.toml")).read_text())  # a duplicate key fails to parse
    for name, entry in data["types"].items():
        if entry.get("rates"):
            assert entry.get("rates_as_of") or data.get("rates_as_of"), name
            assert entry.get("rates_source") or data.get("rates_source"), name


def _passages(text: str) -> list[str]:
    """Paragraphs, bullets and CSV rows: the unit a quoted rate belongs to."""
    return [p for p in re.split(r"\n\s*\n|\n(?=\s*[*-] )|\n(?=[^\s#|,][^\n]*,)", text) if p.strip()]


def _quoted_rates(text: str, types: set[str]) -> list[tuple[str, float]]:
    out = []
    for passage in _passages(text):
        if "capacity block" not in passage.lower():
            continue
        for name, figure in re.findall(r"([a-z0-9-]+\.[0-9]*xlarge)[\s:=]*\$([0-9][0-9,]*\.?[0-9]*)", passage):
            if name in types:
                out.append((name, float(figure.replace(",", ""))))
    return out


def test_no_second_capacity_block_rate_is_quoted_anywhere():
    catalog = load_catalog()
    rates = {f.instance_type: {r.usd_per_hour for r in f.capacity_block_prices.values()}
             for f in catalog if f.capacity_block_source}
    found = 0
    for path in TEXT:
        for name, figure in _quoted_rates(path.read_text(), set(rates)):
            found += 1
            assert any(abs(figure - r) < 0.005 for r in rates[name]), (
                f"{path.relative_to(ROOT)} quotes {name} at ${figure}/h beside Capacity Blocks; the catalog's rate(s): "
                f"{sorted(rates[name]) or 'none'} (keep one rate per type and region, in capacity_blocks.toml)")
    assert found >= 4  # the scan sees the quotes that exist (trn2 and p5en in the toml, the md and the csv)


@pytest.mark.parametrize("text", [
    "Capacity Block rates: trn2.48xlarge $35.7608/h, p5en.48xlarge $54.92/h",
    "* **Trainium2**: at the Capacity Block rates\n  of 2026 (p5e.48xlarge $47.76/h)",
])
def test_the_scan_catches_a_second_rate(text):
    catalog = load_catalog()
    rates = {f.instance_type: {r.usd_per_hour for r in f.capacity_block_prices.values()}
             for f in catalog if f.capacity_block_source}
    quoted = _quoted_rates(text, set(rates))
    assert any(not any(abs(fig - r) < 0.005 for r in rates[name]) for name, fig in quoted), quoted
