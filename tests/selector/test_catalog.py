from __future__ import annotations

import re

import pytest

from dl_selector.catalog import load_catalog

FAMILIES_TODAY = {"p3dn", "p4d", "p4de", "p5", "p5e", "p5en", "p6-b200", "p6-b300", "g4dn", "g5", "g5g",
                  "g6", "g6e", "g6f", "g7e", "gr6", "gr6f", "inf1", "inf2", "trn1", "trn1n", "trn2", "dl2q"}
LEGACY = {"p2", "p3", "g3", "g3s"}
PRICE_REGIONS = ("us-east-1", "us-west-2", "eu-west-1", "ap-northeast-2")


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


def test_catalog_is_dated_and_sourced(catalog):
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", catalog.as_of)
    assert "DescribeInstanceTypes" in catalog.specs_source


def test_every_accelerated_family_and_the_legacy_ones(catalog):
    assert FAMILIES_TODAY | LEGACY <= catalog.families


def test_known_specs_match_the_api_data(catalog):
    p4d = catalog.get("p4d.24xlarge")
    assert (p4d.accelerator, p4d.accelerator_count, p4d.accelerator_memory_gib) == ("A100", 8, 40)
    assert (p4d.vcpus, p4d.memory_gib, p4d.network_cards, p4d.max_efa_interfaces) == (96, 1152, 4, 4)
    assert (p4d.nvme.count, p4d.nvme.size_gb) == (8, 1000)
    assert "NVSwitch" in p4d.interconnect and p4d.efa and "bf16" in p4d.precisions
    p5 = catalog.get("p5.48xlarge")
    assert (p5.network_cards, p5.max_efa_interfaces, p5.network_gbps) == (32, 32, 3200)
    trn1 = catalog.get("trn1.32xlarge")
    assert (trn1.accelerator_kind, trn1.accelerator_count, trn1.neuron_cores, trn1.network_cards) == ("neuron", 16, 32, 8)
    assert trn1.processes_per_node == 32
    g5g = catalog.get("g5g.xlarge")
    assert g5g.architectures == ("arm64",)
    assert catalog.get("g5.xlarge").interconnect.startswith("none")
    assert catalog.get("g5.48xlarge").interconnect == "PCIe"


def test_nvlink_only_where_the_gpus_have_it():
    from dl_selector.accelerators import load_accelerators
    acc = load_accelerators()
    # "A100 80GB" is the table's memory variant of A100 (p4de), not an EC2 name
    assert {n for n, a in acc.items() if a.nvlink} == {"A100", "A100 80GB", "B200", "B300", "H100", "H200", "V100"}


def test_every_type_has_complete_facts(catalog):
    for f in catalog:
        assert f.vcpus > 0 and f.memory_gib > 0 and f.accelerator_count >= 1, f.instance_type
        assert f.accelerator_memory_gib > 0 and f.precisions and f.sdk, f.instance_type
        assert f.regions, f"{f.instance_type} is offered nowhere"
        assert f.efa == (f.max_efa_interfaces > 0), f.instance_type
        for region, p in f.prices.items():
            assert p.as_of and p.source, (f.instance_type, region)
            assert p.on_demand is None or p.on_demand > 0
            assert p.spot is None or (p.on_demand is None or p.spot <= p.on_demand * 1.01), (f.instance_type, region)


def test_prices_cover_the_core_regions(catalog):
    current = [f for f in catalog if not f.retired]
    for region in PRICE_REGIONS:
        offered = [f for f in current if region in f.regions]
        priced = [f for f in offered if f.price(region) and f.price(region).on_demand]
        assert len(priced) >= 0.8 * len(offered), f"{region}: {len(priced)}/{len(offered)} priced"
    p5 = catalog.get("p5.48xlarge").price("us-east-1")
    assert "after" in p5.note.lower() and "2025" in p5.note, "P4/P5 prices say which side of the 2025 cut they are"


def test_legacy_types_are_retired_with_successors(catalog):
    for name in ("p3.2xlarge", "p3.8xlarge", "p2.xlarge", "g3s.xlarge", "dl1.24xlarge", "g4ad.xlarge"):
        f = catalog.get(name)
        assert f.retired and f.successors, name
        assert all(s in catalog for s in f.successors)
    assert not catalog.get("p3dn.24xlarge").retired


def test_unknown_type_names_the_closest(catalog):
    from dl_selector.errors import UserError
    with pytest.raises(UserError, match="closest: p4d.24xlarge"):
        catalog.get("p4d.24xlarg")


def test_the_embedded_catalog_passes_the_checks_a_users_catalog_file_gets():
    """load_catalog() skips check_catalog, and the strict parse (no duplicate key, no NaN), for the
    package's own files (CLI start time): both are checked here."""
    import glob
    import os

    from dl_selector import embedded
    from dl_selector.catalog import DEFAULT_PATH, check_catalog
    from dl_selector.validate import parse_json, read_text
    for path in [DEFAULT_PATH, *glob.glob(os.path.join(os.path.dirname(DEFAULT_PATH), "prices", "*.json"))]:
        parse_json(read_text(path, "catalog"), path, "catalog")
    check_catalog(embedded.joined())


def test_the_embedded_catalog_loads_its_regions_prices_lazily_and_equals_the_joined_file():
    """Specs in catalog.json, each region's prices in prices/<region>.json (dl_selector/embedded.py):
    the lazy catalog and the one dict a refreshed file would hold load to the same catalog."""
    from dl_selector import embedded
    from dl_selector.catalog import Catalog, load_catalog

    whole = embedded.joined()
    eager = Catalog.from_dict(whole)
    lazy = load_catalog()
    assert lazy == eager and lazy.to_dict()["types"] == eager.to_dict()["types"]
    assert lazy.get("p5.48xlarge").price("eu-central-1") == eager.get("p5.48xlarge").price("eu-central-1")
    assert embedded.join(*embedded.split(whole)) == whole
