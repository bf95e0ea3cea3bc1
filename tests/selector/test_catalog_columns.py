"""The catalog's explicit columns: the accelerator fabric and scaling class (no matching words in a
description), and the types AWS sells only as Capacity Blocks for ML (AWS EC2 User Guide, "Capacity Blocks for ML": p5e, trn2)."""
from __future__ import annotations

import csv
import shutil

import pytest

from dl_selector.accelerators import FABRICS, SCALING_CLASSES, load_accelerators
from dl_selector.catalog import load_catalog
from dl_selector.errors import UserError
from dl_selector.paths import data_file
from dl_selector.prices import load_prices
from dl_selector.profiles import get_profile
from dl_selector.recommend import recommend
from dl_selector.throughput import FAST_FABRIC_EFFICIENCY, PCIE_EFFICIENCY, scaling


def test_every_row_names_its_fabric_and_scaling_class():
    with open(data_file("accelerators.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows
    for row in rows:
        assert row["fabric"] in FABRICS and row["scaling_class"] in SCALING_CLASSES, row["name"]
    md = open(data_file("accelerators.md")).read()
    for row in rows:  # and its reason in accelerators.md's table
        assert f"| {row['name']} | {row['fabric']} | {row['scaling_class']} |" in md, row["name"]


def test_fabrics_match_the_hardware():
    acc = load_accelerators()
    assert {n for n, a in acc.items() if a.fabric == "nvswitch"} == {"A100", "A100 80GB", "B200", "B300", "H100", "H200"}
    assert acc["V100"].fabric == "nvlink"  # hybrid cube-mesh, no NVSwitch (P3)
    assert {acc[n].fabric for n in ("Trainium", "Trainium2", "Inferentia", "Inferentia2")} == {"neuronlink"}
    # "PCIe Gen5 (no NVLink)" mentions NVLink: the column, not the words, decides
    assert acc["RTX PRO Server 6000"].fabric == "pcie" and not acc["RTX PRO Server 6000"].nvlink


@pytest.mark.parametrize("instance_type,efficiency", [
    ("p4d.24xlarge", FAST_FABRIC_EFFICIENCY), ("p3dn.24xlarge", FAST_FABRIC_EFFICIENCY),
    ("trn1.32xlarge", FAST_FABRIC_EFFICIENCY), ("dl1.24xlarge", FAST_FABRIC_EFFICIENCY),
    ("g5.48xlarge", PCIE_EFFICIENCY), ("g7e.48xlarge", PCIE_EFFICIENCY), ("dl2q.24xlarge", PCIE_EFFICIENCY),
])
def test_scaling_class_drives_data_parallel_efficiency(instance_type, efficiency):
    f = load_catalog().get(instance_type)
    eff, _ = scaling(f, load_accelerators()[f.accelerator], get_profile("training"))
    assert eff == efficiency


def test_a_bad_fabric_value_stops_the_table(tmp_path):
    path = tmp_path / "accelerators.csv"
    shutil.copy(data_file("accelerators.csv"), path)
    text = path.read_text().replace(",NVLink 3 / NVSwitch,600,nvswitch,", ",NVLink 3 / NVSwitch,600,nvswich,", 1)
    path.write_text(text)
    with pytest.raises(UserError, match="'A100' has fabric='nvswich'; allowed: nvswitch") as e:
        load_accelerators(str(path))
    assert "\n" not in str(e.value)


def test_capacity_block_only_types_are_marked_with_a_source():
    catalog = load_catalog()
    marked = {f.instance_type for f in catalog if f.capacity_block_only}
    assert marked == {"p5e.48xlarge", "trn2.48xlarge"}
    for name in marked:
        f = catalog.get(name)
        assert "Capacity Blocks" in f.capacity_block_source and not f.prices
        assert name not in load_prices(), "a type sold only as Capacity Blocks has no on-demand price anywhere"


def test_capacity_block_only_types_are_named_as_such(capsys):
    from dl_selector.cli import main
    assert main(["show", "p5e.48xlarge"]) == 0
    out = capsys.readouterr().out
    assert "sold only as Capacity Blocks for ML" in out and "market=capacity-block" in out
    assert "none on record" not in out
    # On-demand it is excluded with the way to rank it, not ranked on a price it does not have.
    rec = recommend("multi-node-training", region="us-east-2")
    (p5e,) = [e for e in rec.excluded if e.instance_type == "p5e.48xlarge"]
    assert any("sold only as Capacity Blocks for ML (rank it with --capacity-block" in r for r in p5e.reasons)
    # With --capacity-block it is ranked on AWS's published rate (capacity_blocks.toml: $43.26 in us-east-2).
    rec = recommend("multi-node-training", region="us-east-2", market="capacity-block")
    p5e = next(c for c in rec.candidates if c.instance_type == "p5e.48xlarge")
    assert p5e.capacity_block_price_per_hour == 43.26 and p5e.hourly("capacity-block") == 43.26
    assert any(r.startswith("Capacity Block rate $43.26/h in us-east-2 (as of 2024-12") for r in p5e.reasons)
    assert main(["recommend", "--profile", "multi-node-training", "--region", "us-east-2", "--capacity-block"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if " p5e.48xlarge " in x)
    assert "CB only" in line and "43.26" in line


def test_capacity_block_market_ranks_only_what_aws_reserves_as_blocks():
    rec = recommend("multi-gpu-training", region="us-east-2", market="capacity-block")
    blocks = {"p6-b200.48xlarge", "p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge", "p4d.24xlarge", "p4de.24xlarge",
              "trn1.32xlarge", "trn2.48xlarge"}  # AWS EC2 User Guide, "How Capacity Blocks work"
    assert rec.candidates and {c.instance_type for c in rec.candidates} <= blocks
    (g := [e for e in rec.excluded if e.instance_type == "p3dn.24xlarge"])
    assert g and "not sold as Capacity Blocks for ML" in g[0].reasons
    # min_price on block rates: the cheapest published block wins; unpriced blocks rank last.
    rec = recommend("cost-efficient-multi-node", region="us-east-2", market="capacity-block")
    assert rec.pick.instance_type == "p4d.24xlarge" and rec.pick.hourly("capacity-block") == 14.75
    assert rec.candidates[-1].capacity_block_price_per_hour is None


def test_capacity_block_only_types_are_not_spot_candidates():
    rec = recommend("multi-node-training", region="us-east-2", spot=True)
    (p5e,) = [e for e in rec.excluded if e.instance_type == "p5e.48xlarge"]
    assert p5e.reasons[0].startswith("not sold as spot: sold only as Capacity Blocks for ML")
