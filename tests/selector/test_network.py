"""Network figures: the catalog against AWS's published per-instance figures (tests/data/
published_network.csv, sources in published_network.md), and the NetworkPerformance reader against
every string in the DescribeInstanceTypes records the catalog is built from."""
from __future__ import annotations

import copy
import csv
import gzip
import json
import math
from pathlib import Path

import pytest

from dl_selector.build import facts_from_record, family_of, load_network, parse_network_performance
from dl_selector.catalog import load_catalog
from dl_selector.errors import UserError

PUBLISHED = Path(__file__).parent.parent / "data" / "published_network.csv"


def published() -> list[dict[str, str]]:
    with open(PUBLISHED, newline="") as f:
        return list(csv.DictReader(f))


def moto_records() -> dict[str, dict]:
    """The DescribeInstanceTypes records moto bundles: AWS's own data, which scripts/build_catalog.py builds from."""
    import moto
    path = Path(moto.__file__).parent / "ec2" / "resources" / "instance_types.json.gz"
    with gzip.open(path, "rt") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


@pytest.fixture(scope="module")
def records():
    return moto_records()


def _num(text: str):
    return float(text) if text else None


def test_published_file_is_well_formed():
    rows = published()
    names = [r["instance_type"] for r in rows]
    assert len(names) == len(set(names)), "a type appears twice"
    for r in rows:
        assert float(r["network_gbps"]) > 0 and r["burst"] in ("yes", "no") and r["published"] and r["source"], r


def test_catalog_network_figures_are_aws_published_ones(catalog):
    rows = published()
    for r in rows:
        name = r["instance_type"]
        assert name in catalog, f"{name} is in published_network.csv but not in the catalog"
        f = catalog.get(name)
        assert f.network_gbps == pytest.approx(float(r["network_gbps"])), (name, r["published"], f.network_gbps)
        assert f.network_burst == (r["burst"] == "yes"), (name, r["published"])
        for key in ("efa_gbps", "ena_gbps"):
            if r[key]:
                assert getattr(f, key) == pytest.approx(float(r[key])), (name, key)


def test_published_figures_cover_every_current_family(catalog):
    covered = {family_of(r["instance_type"]) for r in published()}
    current = {f.family for f in catalog if not f.retired}
    assert current - covered == set(), "families with no published network figure to check against"


def test_the_sum_over_network_cards_is_not_the_instance_figure(catalog, records):
    # AWS: four 400 Gbps cards, 400 Gbps in all (g6e.48xlarge); eight 200 Gbps cards, 3,200 Gbps (p6-b200).
    # A type whose cards' peaks add up to something other than the published figure must show the latter.
    rows = {r["instance_type"]: r for r in published()}
    differ = []
    for name, r in rows.items():
        cards = (records.get(name) or {}).get("NetworkInfo", {}).get("NetworkCards") or []
        if sum(c.get("PeakBandwidthInGbps", 0) for c in cards) != float(r["network_gbps"]):
            differ.append(name)
            assert catalog.get(name).network_gbps == pytest.approx(float(r["network_gbps"]))
    assert {"g6e.24xlarge", "g6e.48xlarge", "p6-b200.48xlarge", "p6-b300.48xlarge", "trn2.3xlarge"} <= set(differ)


def test_efa_and_ena_figures_fit_the_instance(catalog):
    for f in catalog:
        assert f.network_source, f"{f.instance_type}: network figure without a source"
        if f.efa_gbps is not None:
            assert f.efa, f"{f.instance_type}: an EFA figure on a type without EFA"
        for v in (f.efa_gbps, f.ena_gbps):
            # EFA and ENA share the instance's bandwidth: neither can exceed it.
            assert v is None or 0 < v <= f.network_gbps, f.instance_type
        if f.network_gbps is None:
            assert f.retired, f"{f.instance_type}: a current type with no network figure"


def test_show_prints_the_published_figures(capsys):
    from dl_selector.cli import main
    assert main(["show", "p6-b300.48xlarge"]) == 0
    out = capsys.readouterr().out
    assert "6,400 Gbps" in out and "EFA up to 6,400 Gbps" in out and "ENA up to 3,870 Gbps" in out
    assert "efa-acc-inst-types" in out, "the EFA/ENA source is shown"
    assert main(["show", "g5.xlarge"]) == 0
    assert "up to 10 Gbps" in capsys.readouterr().out
    assert main(["show", "p6-b300.48xlarge", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["network_gbps"], d["efa_gbps"], d["ena_gbps"], d["network_burst"]) == (6400, 6400, 3870, False)
    assert "DescribeInstanceTypes" in d["network_source"]


# ---- the NetworkPerformance reader -------------------------------------------------------------

def test_every_network_string_in_the_records_is_read(records):
    strings = {r["NetworkInfo"].get("NetworkPerformance") for r in records.values()}
    assert len(strings) > 50
    for s in sorted(strings, key=str):
        gbps, burst = parse_network_performance(s)
        if any(ch.isdigit() for ch in s):
            assert gbps is not None and math.isfinite(gbps) and gbps > 0, s
            assert burst == s.lower().startswith("up to"), s
        else:  # AWS's ratings for old types ("High", "Moderate"): no figure, and none made up
            assert (gbps, burst) == (None, False), s


def test_the_records_strings_read_as_aws_publishes_them(records):
    """Every string form an accelerated type uses ("3200 Gigabit", "Up to 12.5 Gigabit", "16x 200
    Gigabit") against the figure AWS's specification pages print for that type."""
    checked = 0
    for r in published():
        rec = records.get(r["instance_type"])
        if rec is None:  # retired types moto no longer carries
            continue
        s = rec["NetworkInfo"]["NetworkPerformance"]
        assert parse_network_performance(s) == (pytest.approx(float(r["network_gbps"])), r["burst"] == "yes"), \
            (r["instance_type"], s, r["published"])
        checked += 1
    assert checked >= 70


@pytest.mark.parametrize("text,expected", [
    # cells of AWS's specification tables, as published_network.csv quotes them
    ("2.083 / 15.0", (15.0, True)),    # inf2.xlarge
    ("4.167 / 10.0", (10.0, True)),    # g4ad.2xlarge
    ("3.12 Gigabit", (3.12, False)),   # vt1.3xlarge
    ("Up to 10 Gbps", (10.0, True)),   # p3.2xlarge, 2020 user guide
    ("4x 100 Gigabit", (400.0, False)),  # p4d.24xlarge
])
def test_aws_table_cells(text, expected):
    assert parse_network_performance(text) == expected


@pytest.mark.parametrize("text", ["", "Fast", "Gigabit", "100", "100 Megabit", "Up to Gigabit", "0 Gigabit",
                                  "-25 Gigabit", "25 / 5", "1e999 Gigabit", "x100 Gigabit", "100 Gigabit!", None])
def test_unreadable_strings_are_refused(text):
    with pytest.raises(ValueError):
        parse_network_performance(text)


def _build(record, network=None):
    from dl_selector.accelerators import load_accelerators
    return facts_from_record(record, load_accelerators(), ["us-east-1"], {}, {}, "test records", None,
                             network=network or {})


def test_an_unreadable_string_fails_the_build_naming_type_and_string(records):
    rec = copy.deepcopy(records["p5.48xlarge"])
    rec["NetworkInfo"]["NetworkPerformance"] = "Lots of Gigabit"
    with pytest.raises(UserError) as e:
        _build(rec)
    assert "p5.48xlarge" in str(e.value) and "Lots of Gigabit" in str(e.value)
    del rec["NetworkInfo"]["NetworkPerformance"]
    with pytest.raises(UserError) as e:
        _build(rec)
    assert "p5.48xlarge" in str(e.value) and "network.toml" in str(e.value)


def test_network_toml_supplies_a_figure_the_record_lacks(records):
    rec = copy.deepcopy(records["trn2.3xlarge"])
    del rec["NetworkInfo"]["NetworkPerformance"]
    f = _build(rec, {"trn2.3xlarge": {"network_gbps": 200, "source": "ac.html"}})
    assert (f.network_gbps, f.network_burst, f.efa_gbps) == (200, False, None)
    assert "network.toml" in f.network_source and "ac.html" in f.network_source


def test_every_network_toml_entry_is_cited_and_in_the_catalog(catalog):
    for name, entry in load_network().items():
        assert name in catalog, name
        assert "http" in entry["source"], name


@pytest.mark.parametrize("body,message", [
    ('[types."p5.48xlarge"]\nefa_gbps = 3200\n', "needs a source"),
    ('[types."p5.48xlarge"]\nefa_gbps = -1\nsource = "x"\n', "efa_gbps must be a number above 0"),
    ('[types."p5.48xlarge"]\nena_gbps = "800"\nsource = "x"\n', "ena_gbps must be a number above 0"),
    ('[types."p5.48xlarge"]\nefa = 3200\nsource = "x"\n', "unknown key"),
    ('[types."p5.48xlarge"]\nnote = "n"\nsource = "x"\n', "gives no figure"),
    ('[types."p5.48xlarge"]\nefa_gbps = 1\nnetwork_burst = true\nsource = "x"\n', "network_burst only goes with"),
])
def test_network_toml_mistakes_are_refused(tmp_path, body, message):
    p = tmp_path / "network.toml"
    p.write_text(body)
    with pytest.raises(ValueError) as e:
        load_network(str(p))
    assert message in str(e.value)
