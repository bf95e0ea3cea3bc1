"""`catalog refresh` against moto: the same code path as against AWS, no credentials needed."""
from __future__ import annotations

import boto3

from dl_selector.catalog import load_catalog
from dl_selector.refresh import refresh


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


def test_refresh_with_live_prices_rejects_moto_spot_placeholders_and_survives_no_price_list(aws):
    logs: list[str] = []
    fresh = refresh(regions=["us-west-2"], live_prices=True,
                    session=boto3.session.Session(region_name="us-east-1"), log=logs.append)
    p = fresh.get("p4d.24xlarge").price("us-west-2")
    cited = load_catalog().get("p4d.24xlarge").price("us-west-2")
    # moto's spot history quotes a placeholder (0.00001) in every AZ: not a market price. It is
    # refused, the cited figure stays, and both the price's source and the log say why.
    assert (p.spot, p.spot_date) == (cited.spot, cited.spot_date)
    assert "embedded figure kept" in p.spot_source and "1e-05" in p.spot_source
    assert any("rejected implausible live prices" in line and "1e-05" in line for line in logs)
    # moto has no Price List API: the cited on-demand price stays, and the log says so.
    assert p.on_demand == cited.on_demand and "Price List API unavailable" in p.source
    assert any("Price List API unavailable" in line for line in logs)


def test_cli_refresh_writes_a_catalog_the_cli_reads(aws, tmp_path, capsys):
    from dl_selector.cli import main
    out = tmp_path / "cat.json"
    assert main(["catalog", "refresh", "--region", "us-east-1", "--no-live-prices", "--out", str(out)]) == 0
    assert main(["show", "p5.48xlarge", "--catalog", str(out), "--json"]) == 0
    assert '"instance_type": "p5.48xlarge"' in capsys.readouterr().out
