"""`catalog refresh` against moto: the same code path as against AWS, no credentials needed."""
from __future__ import annotations

import boto3

from selector.catalog import load_catalog
from selector.refresh import refresh


def test_refresh_rebuilds_the_embedded_specs(aws):
    logs: list[str] = []
    fresh = refresh(regions=["us-east-1", "us-west-2"], live_prices=False,
                    session=boto3.session.Session(region_name="us-east-1"), log=logs.append)
    embedded = load_catalog()
    assert set(fresh.types) == set(embedded.types)
    for name, f in fresh.types.items():
        e = embedded.get(name)
        for field in ("vcpus", "memory_gib", "accelerator", "accelerator_count", "accelerator_memory_gib",
                      "network_cards", "max_efa_interfaces", "nvme", "architectures", "efa", "retired"):
            assert getattr(f, field) == getattr(e, field), (name, field)
        if not f.retired:
            assert set(f.regions) == set(e.regions) & {"us-east-1", "us-west-2"}, name
    assert logs == []


def test_refresh_with_live_prices_uses_spot_history_and_survives_no_price_list(aws):
    logs: list[str] = []
    fresh = refresh(regions=["us-west-2"], live_prices=True,
                    session=boto3.session.Session(region_name="us-east-1"), log=logs.append)
    p = fresh.get("p4d.24xlarge").price("us-west-2")
    # moto's spot history quotes a placeholder price in every AZ; the median of it is taken.
    assert p.spot == 0.00001 and "DescribeSpotPriceHistory" in p.source
    # moto has no Price List API: the cited on-demand price stays, and the log says so.
    assert p.on_demand == load_catalog().get("p4d.24xlarge").price("us-west-2").on_demand
    assert any("Price List API unavailable" in line for line in logs)


def test_cli_refresh_writes_a_catalog_the_cli_reads(aws, tmp_path, capsys):
    from selector.cli import main
    out = tmp_path / "cat.json"
    assert main(["catalog", "refresh", "--region", "us-east-1", "--no-live-prices", "--out", str(out)]) == 0
    assert main(["show", "p5.48xlarge", "--catalog", str(out), "--json"]) == 0
    assert '"instance_type": "p5.48xlarge"' in capsys.readouterr().out
