"""Issue 39 item 4: researchers' units and inputs. GPU memory in the vendor's GB (GiB beside it), so
--min-gpu-memory 24 includes the 24 GB A10G and L4; --gpu alone; SkyPilot's accelerator names;
figures printed with their significant digits; bad input one line, exit 2, the closest match."""
from __future__ import annotations

import json

import pytest

from dl_selector.catalog import load_catalog
from dl_selector.facts import gb_of
from dl_selector.render import sig
from tests.selector.cli_run import run



@pytest.mark.parametrize("gib,gb", [
    (22.35, 24.0),    # A10G and L4: EC2's 22888 MiB, a 24 GB GDDR6 card
    (44.7, 48.0),     # L40S, 48 GB GDDR6
    (80.0, 80.0),     # H100 / A100 80GB: HBM sized in binary units, sold as 80 GB
    (141.0, 141.0),   # H200
    (16.0, 16.0),     # T4, V100 16GB
    (268.59, 288.4),  # B300: 288 GB HBM3e
])
def test_vendor_gb_from_what_ec2_reports(gib, gb):
    assert gb_of(gib) == gb


def test_min_gpu_memory_24_includes_the_24_gb_a10g_and_l4(capsys):
    code, out, _ = run(capsys, "recommend", "--profile", "dev-prototyping", "--min-gpu-memory", "24", "--json")
    doc = json.loads(out)
    accelerators = {c["accelerator"] for c in doc["candidates"]}
    assert code == 0 and {"A10G", "L4"} <= accelerators
    assert all(c["accelerator_memory_gb"] >= 24 for c in doc["candidates"])
    # every 24 GB card the catalog has in the region and the profile would rank is kept
    code, out, _ = run(capsys, "recommend", "--profile", "dev-prototyping", "--json")
    unfiltered = {c["instance_type"] for c in json.loads(out)["candidates"] if c["accelerator_memory_gb"] >= 24}
    assert {c["instance_type"] for c in doc["candidates"]} == unfiltered
    excluded = {e["instance_type"]: e["reasons"] for e in doc["excluded"]}
    assert any("16 GB (16 GiB) per accelerator, below --min-gpu-memory 24 GB" in r for r in excluded["g4dn.xlarge"])


def test_the_table_shows_gb_with_gib_beside(capsys):
    code, out, _ = run(capsys, "recommend", "--profile", "dev-prototyping", "--min-gpu-memory", "24", "--top", "3")
    assert code == 0 and "GB/acc (GiB)" in out and "24 (22.35)" in out


def test_gpu_alone_ranks_for_training(capsys):
    code, out, _ = run(capsys, "recommend", "--gpu", "H100:8", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["profile"] == "training"
    assert [c["instance_type"] for c in doc["candidates"]] == ["p5.48xlarge"]


@pytest.mark.parametrize("gpu,types", [
    ("A100-80GB:8", {"p4de.24xlarge"}),   # SkyPilot's name for p4de's GPU: the -80GB suffix, not the A10G
    ("A100:8", {"p4d.24xlarge", "p4de.24xlarge"}),
    ("V100-32GB:8", {"p3dn.24xlarge"}),
    ("H100-MEGA:8", {"p5.48xlarge"}),       # GCP's a3-megagpu name for the H100 SXM
    ("L40S:1", None),
])
def test_skypilot_accelerator_names(capsys, gpu, types):
    extra = ["--families", "p3dn"] if gpu.startswith("V100") else []  # p3dn is retired: named to rank it
    code, out, _ = run(capsys, "recommend", "--gpu", gpu, "--json", *extra)
    doc = json.loads(out)
    names = {c["instance_type"] for c in doc["candidates"]}
    assert code == 0 and names, doc["why"]
    if types is not None:
        assert names == types
    else:
        assert {c["accelerator"] for c in doc["candidates"]} == {"L40S"}


@pytest.mark.parametrize("argv,expected", [
    (["recommend"], "recommend needs --profile (see `profiles`) or --gpu MODEL[:COUNT]"),
    (["recommend", "--gpu", "Inferentia2"], "Inferentia2 is not built for training: pass --profile inference"),
    (["recommend", "--gpu", "A100-80G:8"], "unknown accelerator model; closest: A100-80GB;"),
    (["recommend", "--gpu", "Z100-80GB"], "unknown accelerator model; closest: A100-80GB"),
    (["recommend", "--gpu", "H100", "--min-gpu-memory", "lots"], "is not a number"),
])
def test_bad_units_and_names_are_one_line_exit_2(capsys, argv, expected):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "" and err.count("\n") == 1 and expected in err, err


@pytest.mark.parametrize("value,shown", [(2.1, "2.1"), (0.0371, "0.0371"), (37.25, "37.2"), (1652174.2, "1,652,174"),
                                         (100.4, "100"), (0, "0")])
def test_figures_keep_their_significant_digits(value, shown):
    assert sig(value) == shown


def test_a_small_measured_figure_prints_as_measured(capsys, tmp_path):
    f = tmp_path / "m.csv"
    f.write_text("instance_type,samples_per_second\ng5.xlarge,2.1\n")
    code, out, _ = run(capsys, "recommend", "--profile", "cost-efficient-training", "--throughput", str(f),
                       "--families", "g5", "--top", "1")
    row = next(line for line in out.splitlines() if " g5.xlarge " in f" {line} ")
    assert code == 0 and " 2.1 " in row


def test_every_catalog_memory_has_a_gb_figure():
    for f in load_catalog():
        assert f.accelerator_memory_gb >= f.accelerator_memory_gib * 0.999 or f.accelerator_memory_gib == 0, f.instance_type
