"""Issue 39 item 2: no pick ranked on a price its market lacks. Under --spot or --capacity-block a
type with no figure in that market ranks after every priced type, whatever the objective, and the
ranking says so (`why`, the table's source column, --json's `unpriced`).

"Priced" is read here from the catalog's own facts (the region's spot figure, the type's Capacity
Block rate), not from the ranking code's helper."""
from __future__ import annotations

import json

import pytest

from dl_selector.catalog import load_catalog
from dl_selector.cli import main
from dl_selector.profiles import builtin_profiles
from dl_selector.recommend import recommend


def _has_price(c, market: str, region: str) -> bool:
    if market == "capacity-block":
        return region in c.facts.capacity_block_prices
    p = c.facts.price(region)
    return p is not None and p.spot is not None and not c.spot_untrusted


def test_multi_node_spot_does_not_pick_p6_b300_which_has_no_spot_price():
    catalog = load_catalog()
    assert catalog.get("p6-b300.48xlarge").price("us-east-1").spot is None  # the premise of the issue
    rec = recommend("multi-node-training", region="us-east-1", market="spot", catalog=catalog)
    names = [c.instance_type for c in rec.candidates]
    assert _has_price(rec.pick, "spot", "us-east-1")
    # the fastest type by the model is still listed, below every priced type, and `why` names it
    assert names.index("p6-b300.48xlarge") > max(i for i, c in enumerate(rec.candidates)
                                                  if _has_price(c, "spot", "us-east-1"))
    assert "unpriced on spot" in rec.why and "p6-b300.48xlarge" in rec.why


def test_capacity_block_in_ohio_does_not_pick_p6_b200_which_has_no_rate():
    catalog = load_catalog()
    assert "us-east-2" not in catalog.get("p6-b200.48xlarge").capacity_block_prices
    rec = recommend("multi-node-training", region="us-east-2", market="capacity-block", catalog=catalog)
    assert _has_price(rec.pick, "capacity-block", "us-east-2")
    assert rec.candidates[-1].instance_type == "p6-b200.48xlarge"
    assert "unpriced on capacity-block" in rec.why and "p6-b200.48xlarge" in rec.why


@pytest.mark.parametrize("market", ["spot", "capacity-block"])
@pytest.mark.parametrize("region", ["us-east-1", "us-east-2", "us-west-2", "eu-north-1"])
def test_no_profile_puts_an_unpriced_type_first_without_saying_so(market, region):
    catalog = load_catalog()
    for profile in builtin_profiles().values():
        rec = recommend(profile, region=region, market=market, catalog=catalog)
        if not rec.candidates:
            continue
        priced = [_has_price(c, market, region) for c in rec.candidates]
        assert priced == sorted(priced, reverse=True), (profile.name, [c.instance_type for c in rec.candidates])
        unpriced = [c.instance_type for c, ok in zip(rec.candidates, priced) if not ok]
        assert rec.to_dict()["unpriced"] == unpriced
        if not priced[0]:
            assert "every row is unpriced" in rec.why, (profile.name, rec.why)
        elif unpriced:
            assert f"unpriced on {market}" in rec.why and unpriced[0] in rec.why, (profile.name, rec.why)
        else:
            assert "unpriced" not in rec.why


def test_the_table_and_json_mark_unpriced_rows(capsys):
    assert main(["recommend", "--profile", "multi-node-training", "--spot"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.split()[1:2] == ["p6-b300.48xlarge"])
    assert row.rstrip().endswith("unpriced (spot)")
    assert main(["recommend", "--profile", "multi-node-training", "--capacity-block", "--region", "us-east-2",
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["unpriced"] == ["p6-b200.48xlarge"]
    assert [c["instance_type"] for c in data["candidates"] if c["unpriced"]] == ["p6-b200.48xlarge"]
    assert data["candidates"][0]["capacity_block_price_per_hour"] is not None
