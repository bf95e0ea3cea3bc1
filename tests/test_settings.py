"""App context -> settings: every mistake is one clear line; nothing is synthesized."""
from __future__ import annotations

import pytest

from dl_selector.errors import UserError
from dl_selector.prices import load_prices
from dl_selector.profiles import builtin_profiles
from dl_stacks.selection import select
from dl_stacks.settings import DEFAULT_PROFILE, from_context


def test_defaults_are_cheap_and_safe():
    s = from_context({})
    assert s.profile.name == DEFAULT_PROFILE and s.nodes == 1 and not s.spot
    sel = select(s)
    assert sel.pick.instance_type == "g4dn.xlarge"


def test_training_profiles_default_to_spot_and_their_node_count():
    s = from_context({"profile": "multi-node-training"})
    assert s.spot and s.nodes == 2 and s.multi_node


@pytest.mark.parametrize("ctx,expected", [
    ({"profile": "multinode"}, "unknown profile 'multinode'"),
    ({"profil": "x"}, "unknown context key 'profil'; closest: profile"),
    ({"instance-type": "p4d.24xlarge"}, "closest: instance_type"),
    ({"instance_type": "p4d.24xl"}, "closest: p4d.24xlarge"),
    ({"nodes": "two"}, "context nodes='two': expected a whole number"),
    ({"nodes": "0"}, "context nodes=0: allowed 1 to 64"),
    ({"spot": "maybe"}, "expected true or false"),
    ({"region": "us-east-9"}, "unknown region 'us-east-9'"),
    ({"vpc_id": "my-vpc"}, "expected an id like vpc-"),
    ({"job": "My Job"}, "lower-case letters, digits and dashes"),
    ({"max_price": "cheap"}, "expected USD per hour"),
    ({"max_price": "-1"}, "must be above zero"),
])
def test_bad_context(ctx, expected):
    with pytest.raises(UserError) as e:
        from_context(ctx)
    assert expected in str(e.value) and "\n" not in str(e.value)


def test_cdk_feature_flags_are_not_mistaken_for_typos():
    from_context({"@aws-cdk/core:checkSecretUsage": True, "cli-telemetry": False, "aws:cdk:enable-path-metadata": True})


def test_instance_type_must_fit_the_profile():
    with pytest.raises(UserError, match="instance_type g5.xlarge does not fit profile multi-node-training with 2 nodes: .*no EFA"):
        select(from_context({"profile": "multi-node-training", "instance_type": "g5.xlarge"}))


def test_several_nodes_need_efa_even_on_single_node_profiles():
    sel = select(from_context({"profile": "multi-gpu-training", "nodes": "3"}))
    assert sel.facts.efa
    assert all(c.facts.efa for c in sel.alternates)


def test_alternates_are_interchangeable_with_the_pick():
    sel = select(from_context({"profile": "multi-node-training"}))
    for c in sel.alternates:
        assert c.facts.processes_per_node == sel.facts.processes_per_node
        assert c.facts.architecture == sel.facts.architecture


# ---- the new keys: market, capacity_reservation, interchange -------------------------------------
CR = "cr-0123456789abcdef0"


@pytest.mark.parametrize("ctx,expected", [
    ({"market": "spt"}, "context market='spt': allowed spot, on-demand, capacity-block; closest: spot"),
    ({"markt": "spot"}, "unknown context key 'markt'; closest: market"),
    ({"interchange": "any"}, "context interchange='any': allowed same-accelerator, same-count"),
    ({"interchange": "same-acc"}, "closest: same-accelerator"),
    ({"interchang": "same-count"}, "closest: interchange"),
    ({"capacity_reservation": "cr-123", "market": "on-demand"}, "expected a reservation id like cr-0123456789abcdef0"),
    ({"capacity_reservation": "arn:aws:resource-groups:us-west-2:123456789012:group/blocks", "market": "on-demand"},
     "is a resource group in us-west-2, the stack deploys to us-east-1"),
    ({"capacity_reservation": "arn:aws:ec2:us-east-1:123456789012:capacity-reservation/" + CR, "market": "on-demand"},
     "or a resource group arn:aws:resource-groups:us-east-1:ACCOUNT:group/NAME"),
    ({"market": "capacity-block"}, "context market=capacity-block needs capacity_reservation"),
    ({"market": "spot", "capacity_reservation": CR}, "with spot: reservations are on-demand capacity"),
    ({"spot": "true", "capacity_reservation": CR}, "with spot: reservations are on-demand capacity"),
    ({"profile": "multi-node-training", "capacity_reservation": CR},
     "(profile multi-node-training launches on spot by default): reservations are on-demand capacity"),
    ({"spot": "true", "market": "on-demand"}, "context spot=true contradicts market=on-demand"),
    ({"spot": "false", "market": "spot"}, "context spot=false contradicts market=spot"),
])
def test_bad_market_context(ctx, expected):
    with pytest.raises(UserError) as e:
        from_context(ctx)
    assert expected in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("ctx,market", [
    ({}, "on-demand"),
    ({"profile": "multi-node-training"}, "spot"),
    ({"profile": "multi-node-training", "spot": "false"}, "on-demand"),
    ({"profile": "inference", "spot": "true"}, "spot"),
    ({"profile": "multi-node-training", "market": "on-demand"}, "on-demand"),
    ({"profile": "multi-node-training", "market": "on-demand", "spot": "false"}, "on-demand"),
    ({"capacity_reservation": CR}, "on-demand"),  # inference/dev profiles launch on-demand anyway
    ({"market": "capacity-block", "capacity_reservation": CR}, "capacity-block"),
    ({"market": "on-demand", "capacity_reservation": "arn:aws:resource-groups:us-east-1:123456789012:group/my-blocks"},
     "on-demand"),
])
def test_market_and_spot(ctx, market):
    s = from_context(ctx)
    assert s.market == market and s.spot == (market == "spot")


def test_interchange_defaults_to_same_accelerator():
    assert from_context({}).interchange == "same-accelerator"
    assert from_context({"interchange": "same-count"}).interchange == "same-count"


# ---- alternates and the cost ceiling (dl_stacks/selection.py) ---------------------------------------
# Expected prices come from the cited price table (dl_selector/data/prices.csv), not from the selection.
PRICES = load_prices()


def price(instance_type: str, market: str = "spot", region: str = "us-east-1"):
    p = PRICES[instance_type][region]
    return p.spot if market == "spot" else p.on_demand


def taken(sel) -> list[str]:
    return [c.instance_type for c in sel.alternates]


def reason(sel, instance_type: str) -> str:
    return dict(sel.rejected)[instance_type]


def test_issue_multi_node_b200_never_gets_a100_or_b300_behind_it():
    sel = select(from_context({"profile": "multi-node-training", "instance_type": "p6-b200.48xlarge"}))
    assert sel.pick.instance_type == "p6-b200.48xlarge"
    assert not {"p4d.24xlarge", "p4de.24xlarge", "p6-b300.48xlarge"} & set(taken(sel))
    for c in sel.alternates:  # whatever else comes, it is the same accelerator
        assert (c.facts.accelerator, c.facts.accelerator_memory_gib) == ("B200", sel.facts.accelerator_memory_gib)
    assert reason(sel, "p4d.24xlarge").startswith("not interchangeable: 8 x A100 40 GiB")
    assert reason(sel, "p6-b300.48xlarge").startswith("not interchangeable: 8 x B300")
    # and the profile's own pick keeps its accelerator the same way: on spot, its default market,
    # p5en (H200), since p6-b300 has no spot price to rank on (issue 39)
    sel = select(from_context({"profile": "multi-node-training"}))
    assert sel.pick.instance_type == "p5en.48xlarge"
    assert all(c.facts.accelerator == "H200" for c in sel.alternates)
    assert reason(sel, "p6-b200.48xlarge").startswith("not interchangeable: 8 x B200")


@pytest.mark.parametrize("interchange", ["same-accelerator", "same-count"])
def test_issue_pinned_p4d_gets_no_alternate_dearer_than_p4d(interchange):
    sel = select(from_context({"profile": "multi-node-training", "instance_type": "p4d.24xlarge",
                               "interchange": interchange}))
    # EC2's max price is p4d's on-demand price (issue 24), yet no alternate is expected to cost
    # more than p4d itself, as quoted
    assert sel.market == "spot" and sel.ceiling == price("p4d.24xlarge", "on-demand")
    for c in sel.alternates:
        assert price(c.instance_type) <= price("p4d.24xlarge"), c.instance_type
    assert "p6-b200.48xlarge" not in taken(sel) and "p6-b300.48xlarge" not in taken(sel)
    if interchange == "same-count":
        assert "above the pick's own spot price $8.00/h" in reason(sel, "p6-b200.48xlarge")
        assert reason(sel, "p6-b300.48xlarge") == "no price on record in us-east-1 for spot"


@pytest.mark.parametrize("market", ["spot", "on-demand"])
def test_issue_single_g6e_never_falls_back_to_p5(market):
    sel = select(from_context({"profile": "single-gpu-training", "instance_type": "g6e.xlarge", "market": market}))
    assert "p5.4xlarge" not in taken(sel)
    assert all(price(c.instance_type, market) <= price("g6e.xlarge", market) for c in sel.alternates)
    assert "p5.4xlarge" in dict(sel.rejected)


def test_p5_and_p5en_are_not_interchangeable_unless_widened():
    ctx = {"profile": "multi-node-training", "instance_type": "p5.48xlarge", "max_price": "100"}
    sel = select(from_context(ctx))
    assert "p5en.48xlarge" not in taken(sel) and "p4de.24xlarge" not in taken(sel)
    assert "H200 141 GiB" in reason(sel, "p5en.48xlarge")
    wide = select(from_context({**ctx, "interchange": "same-count"}))
    assert "p5en.48xlarge" in taken(wide)
    assert {c.facts.accelerator_count for c in wide.alternates} == {8}
    assert len({c.facts.accelerator for c in wide.alternates}) > 1, "same-count lets the model change"


def test_unpriced_alternates_are_rejected_with_their_reason_whatever_the_ceiling():
    assert price("p6-b300.48xlarge") is None  # the cited table has no us-east-1 spot quote for it
    sel = select(from_context({"profile": "multi-gpu-training", "instance_type": "p6-b200.48xlarge",
                               "max_price": "1000"}))
    assert "p6-b300.48xlarge" not in taken(sel)
    assert reason(sel, "p6-b300.48xlarge") == "no price on record in us-east-1 for spot"
    offered = {c.instance_type for c in sel.recommendation.candidates}
    assert offered == {sel.pick.instance_type, *taken(sel), *dict(sel.rejected)}, "every candidate is accounted for"


def test_max_price_raises_the_ceiling():
    base = {"profile": "multi-node-training", "instance_type": "p4d.24xlarge", "interchange": "same-count"}
    low, high = select(from_context(base)), select(from_context({**base, "max_price": "30"}))
    assert high.ceiling == 30 and high.ceiling_source.startswith("max_price")
    assert len(high.alternates) > len(low.alternates)
    assert any(price(t) > price("p4d.24xlarge") for t in taken(high))
    assert all(price(t) <= 30 for t in taken(high))
    assert high.worst_case(2).market <= 2 * 30


def test_max_price_lowers_the_ceiling_and_spot_keeps_the_pick_at_it():
    base = {"profile": "cost-efficient-training"}
    plain = select(from_context(base))
    cap = round(plain.pick.spot_price_per_hour * 0.8, 4)  # below the pick's own spot price on record
    sel = select(from_context({**base, "max_price": str(cap)}))
    assert sel.pick.instance_type == plain.pick.instance_type
    assert all(price(t) <= cap for t in taken(sel))
    dearer = [c.instance_type for c in plain.recommendation.candidates
              if c.spot_price_per_hour and c.spot_price_per_hour > cap and c.instance_type != sel.pick.instance_type]
    assert dearer and f"above the ceiling ${cap:.2f}/h" in reason(sel, dearer[0])
    # EC2 enforces max_price on spot, so the pick (dearer on record) costs at most that too
    assert sel.worst_case(1).market == pytest.approx(cap)
    assert "above max_price" in sel.describe_price(sel.pick.instance_type)


def test_on_demand_max_price_below_the_pick_is_refused():
    with pytest.raises(UserError, match=r"max_price \$0.30/h is below g4dn.xlarge's on-demand price \$0.53/h"):
        select(from_context({"max_price": "0.3"}))
    sel = select(from_context({"max_price": "1"}))  # on-demand: max_price is simply the ceiling
    assert sel.ceiling == 1 and all(price(t, "on-demand") <= 1 for t in taken(sel)) and taken(sel)


def test_a_pick_without_a_price_in_its_market_needs_max_price():
    # The sources price no p6 in ap-south-2 (dl_selector/data/prices.md), where the catalog offers them
    ctx = {"profile": "multi-node-training", "region": "ap-south-2", "market": "on-demand"}
    with pytest.raises(UserError) as e:
        select(from_context(ctx))
    assert "p6-b300.48xlarge has no on-demand price on record in ap-south-2: pass -c max_price=USD/h" in str(e.value)
    assert "\n" not in str(e.value)
    sel = select(from_context({**ctx, "max_price": "200"}))
    assert sel.ceiling == 200 and sel.alternates == ()  # nothing same-accelerator is priced there
    assert all(r == "no price on record in ap-south-2 for on-demand" or r.startswith("not interchangeable")
               for _, r in sel.rejected)


def test_capacity_block_only_types():
    p5e = {"profile": "multi-node-training", "region": "us-east-2", "instance_type": "p5e.48xlarge"}
    with pytest.raises(UserError, match="p5e.48xlarge does not fit .*not sold as on-demand: sold only as Capacity "
                                        "Blocks for ML .*market=capacity-block"):
        select(from_context({**p5e, "market": "on-demand"}))
    with pytest.raises(UserError, match="not sold as spot: sold only as Capacity Blocks for ML"):
        select(from_context(p5e))
    block = {**p5e, "market": "capacity-block", "capacity_reservation": CR}
    # Without max_price the published rate on record (capacity_blocks.toml: $43.26 in us-east-2) is the ceiling.
    sel = select(from_context(block))
    assert sel.ceiling == 43.26 and "published Capacity Block rate" in sel.ceiling_source
    sel = select(from_context({**block, "max_price": "40"}))
    assert sel.pick.instance_type == "p5e.48xlarge" and sel.market == "capacity-block" and sel.ceiling == 40
    assert sel.alternates == () and sel.worst_case(2).market == 80
    assert reason(sel, "p5en.48xlarge").startswith("a Capacity Block reserves one instance type")  # same H200s
    # No rate on record for p6-b200.48xlarge (capacity_blocks.toml): the user must say what the block costs.
    b200 = {"profile": "multi-node-training", "region": "us-east-2", "instance_type": "p6-b200.48xlarge",
            "market": "capacity-block", "capacity_reservation": CR}
    with pytest.raises(UserError, match="no Capacity Block rate for p6-b200.48xlarge in us-east-2; pass -c max_price"):
        select(from_context(b200))
    # trn2.48xlarge, sold only as blocks, is priced from the rate on record ([4]: $35.7608 on 2026-10-08).
    trn2 = select(from_context({**b200, "profile": "neuron-training", "instance_type": "trn2.48xlarge"}))
    assert trn2.ceiling == 35.7608


@pytest.mark.parametrize("profile", sorted(builtin_profiles()))
def test_every_alternate_is_interchangeable_priced_and_under_the_ceiling(profile):
    from dl_selector.interchange import interchangeable
    s = from_context({"profile": profile})
    sel = select(s)
    assert len(sel.alternates) <= 4
    for c in sel.alternates:
        assert interchangeable(sel.facts, c.facts, multi_node=s.multi_node, rule=s.interchange) is None
        assert price(c.instance_type, sel.market) is not None
        assert price(c.instance_type, sel.market) <= sel.ceiling
    assert all(r for _, r in sel.rejected)


# ---- values as cdk.json carries them, and the job command ----------------------------------------
def test_cdk_json_types_are_taken_as_the_keys_own():
    s = from_context({"profile": "multi-node-training", "nodes": 4, "max_price": 30, "spot": True, "local": False})
    assert (s.nodes, s.max_price, s.spot, s.local) == (4, 30.0, True, False)
    assert from_context({"nodes": 2.0, "max_price": 12.5}).nodes == 2
    assert from_context({"nodes": " 3 ", "max_price": " 1.5 "}).max_price == 1.5


def test_command_is_kept_as_written_and_command_file_is_read_verbatim(tmp_path, monkeypatch):
    command = 'python train.py --lr $LR "quoted" `x` \\ back \'single\''
    assert from_context({"command": command}).command == command
    script = "#!/bin/bash\nset -e\nfor i in 1 2; do\n  echo \"$i\" \\\n    done\ndone\n"
    (tmp_path / "train.sh").write_text(script)
    monkeypatch.chdir(tmp_path)
    assert from_context({"command_file": "train.sh"}).command == script  # relative to where cdk runs
    assert from_context({}).command == ""


def test_settings_docstring_says_multi_line_commands_go_through_command_file():
    import dl_stacks.settings
    assert "multi-line commands go here" in dl_stacks.settings.__doc__ and "command_file" in dl_stacks.settings.__doc__


@pytest.mark.parametrize("profile", sorted(builtin_profiles()))
def test_the_default_spot_ceiling_is_at_least_the_picks_on_demand_price(profile):
    """Issue 24: a ceiling at a spot quote (dated, sometimes one AZ) was EC2's max price too, and a
    cluster could wait for ever below the market; EC2's own default is the on-demand price."""
    sel = select(from_context({"profile": profile, "market": "spot"}))
    quote = sel.pick.facts.price(sel.region)
    if quote and quote.on_demand is not None:
        assert sel.ceiling >= quote.on_demand, (sel.pick.instance_type, sel.ceiling, quote.on_demand)
        assert "EC2's default spot max price" in sel.ceiling_source
    capped = select(from_context({"profile": profile, "market": "spot", "max_price": "99"}))
    assert capped.ceiling == 99 and capped.ceiling_source.startswith("max_price")
    assert capped.worst_case(2).market <= 2 * 99


@pytest.mark.parametrize("ctx,env,expected", [
    ({"region": "eu-west-1"}, {"CDK_DEFAULT_REGION": "us-west-2", "AWS_REGION": "ap-northeast-2"}, ("eu-west-1", "context region")),
    ({}, {"CDK_DEFAULT_REGION": "us-west-2", "AWS_REGION": "ap-northeast-2"}, ("us-west-2", "CDK_DEFAULT_REGION")),
    ({}, {"AWS_REGION": "ap-northeast-2", "AWS_DEFAULT_REGION": "eu-west-1"}, ("ap-northeast-2", "AWS_REGION")),
    ({}, {"AWS_DEFAULT_REGION": "eu-west-1"}, ("eu-west-1", "AWS_DEFAULT_REGION")),
    ({}, {}, ("us-east-1", "the default: no -c region, CDK_DEFAULT_REGION, AWS_REGION or AWS_DEFAULT_REGION")),
])
def test_the_region_follows_the_cdk_environment_then_the_aws_one(ctx, env, expected):
    """Issue 24: with AWS_REGION=eu-west-1 the app deployed to us-east-1 anyway."""
    from dl_stacks.settings import resolve_region
    assert resolve_region(ctx, env) == expected


def test_a_bad_region_from_the_environment_says_where_it_came_from(monkeypatch):
    monkeypatch.setenv("CDK_DEFAULT_REGION", "eu-centrall-1")
    with pytest.raises(UserError, match=r"closest: eu-central-1.*\(from CDK_DEFAULT_REGION; -c region=NAME sets it\)"):
        from_context({"profile": "training"})
    monkeypatch.setenv("CDK_DEFAULT_REGION", "us-west-2")
    s = from_context({"profile": "training"})
    assert (s.region, s.region_source) == ("us-west-2", "CDK_DEFAULT_REGION")
