from __future__ import annotations

import pytest

from dl_selector.catalog import load_catalog
from dl_selector.errors import UserError
from dl_selector.profiles import get_profile
from dl_selector.recommend import recommend
from dl_selector.throughput import Measurement


def test_samples_per_dollar_is_throughput_per_hour_over_price():
    rec = recommend("cost-efficient-training", region="us-east-1")
    for c in rec.candidates:
        if c.price_per_hour:
            assert c.samples_per_dollar == pytest.approx(c.samples_per_second * 3600 / c.price_per_hour)
        if c.spot_price_per_hour:
            assert c.spot_samples_per_dollar == pytest.approx(c.samples_per_second * 3600 / c.spot_price_per_hour)


_METRIC = {
    "max_throughput": lambda c, m: c.samples_per_second,
    "max_samples_per_dollar": lambda c, m: c.ranked_per_dollar(m),
    "min_price": lambda c, m: -c.ranked_hourly(m) if c.ranked_hourly(m) is not None else None,
    "max_accelerator_memory": lambda c, m: c.facts.accelerator_memory_total_gib,
}


def _overlap(a, b, va, vb) -> bool:
    return va * (1 - a.uncertainty) <= vb * (1 + b.uncertainty) and vb * (1 - b.uncertainty) <= va * (1 + a.uncertainty)


def _check_order(rec, objective: str, market: str) -> None:
    """Issue 25: ranked by the objective's own expected value, whatever the ties (priced types
    first where the objective is about money); a tie is a symmetric flag between exactly the
    candidates whose uncertainty intervals overlap, and it reorders nothing. Issue 39: under every
    objective, a type with no price in the market ranked on comes after every priced one; the two
    runs are each in the objective's order, and a tie never crosses from one to the other."""
    c = list(rec.candidates)
    assert [x.rank for x in c] == list(range(1, len(c) + 1))
    priced = [x.ranked_hourly(market) is not None for x in c]
    assert priced == sorted(priced, reverse=True), "an unpriced type ranks before a priced one"
    split = priced.count(True)
    for run in (c[:split], c[split:]):
        values = [_METRIC[objective](x, market) for x in run]
        known = [v for v in values if v is not None]
        assert known == sorted(known, reverse=True), [(x.instance_type, v) for x, v in zip(run, values)]
        assert values[:len(known)] == known, "a candidate without the figure ranks before one with it"
        by_name = {x.instance_type: x for x in run}
        for x, vx in zip(run, values):
            for name in x.tied_with:
                assert name in by_name, "a tie crosses from priced to unpriced types"
                assert x.instance_type in by_name[name].tied_with, "a tie is symmetric"
            if objective not in ("max_throughput", "max_samples_per_dollar"):
                assert not x.tied_with, "price and memory are known figures: nothing to tie"
                continue
            expected = {y.instance_type for y, vy in zip(run, values)
                        if y is not x and vx and vy and _overlap(x, y, vx, vy)}
            assert set(x.tied_with) == expected, x.instance_type


def test_ranks_follow_the_objective():
    _check_order(recommend("multi-gpu-training"), "max_throughput", "on-demand")
    _check_order(recommend("dev-prototyping"), "min_price", "on-demand")
    _check_order(recommend("cost-efficient-training", spot=True), "max_samples_per_dollar", "spot")


def test_the_ordering_rule_holds_for_random_candidate_sets_and_every_objective():
    """Property test over random family subsets, measured overrides, markets and every built-in
    profile under every objective."""
    import random
    from dl_selector.record import replace

    from dl_selector.profiles import builtin_profiles
    rng = random.Random(25)
    catalog = load_catalog()
    families = sorted({f.family for f in catalog})
    profiles = list(builtin_profiles().values())
    for _ in range(120):
        objective = rng.choice(list(_METRIC))
        profile = replace(rng.choice(profiles), objective=objective)
        market = rng.choice(["on-demand", "spot", "capacity-block"])
        names = [f.instance_type for f in catalog]
        measured = {n: Measurement(rng.uniform(10, 50_000), source="random") for n in rng.sample(names, rng.randint(0, 6))}
        rec = recommend(profile, region="us-east-1", market=market, catalog=catalog,
                        families=rng.sample(families, rng.randint(1, len(families))), measured=measured)
        _check_order(rec, objective, market)


def test_a_faster_type_is_never_ranked_below_a_cheaper_tied_one():
    """The audit's cases: under max_throughput p5en (H200) ranks above p5 (H100) although p5 is
    cheaper and the two tie; under samples per dollar the better figure leads its tie."""
    rec = recommend("multi-gpu-training", families=["p5", "p5en"])
    first, second = rec.candidates[:2]
    assert first.samples_per_second > second.samples_per_second
    assert second.instance_type in first.tied_with and "measure these to decide" in " ".join(first.reasons)
    assert "ties with" in rec.why and "measure these to decide" in rec.why


def test_equal_samples_per_dollar_goes_to_the_faster_type():
    """The tie-break under max_samples_per_dollar (dl_selector/ranking.py, sort_key): on the real catalog in
    eu-south-1, g4dn.metal (8 x T4) costs exactly twice g4dn.12xlarge (4 x T4) for twice the
    throughput, so parallel-experiments' samples per dollar tie exactly, at rank 1. The faster
    type wins the tie: the same work for the same money, finished sooner."""
    rec = recommend("parallel-experiments", region="eu-south-1", market="on-demand")
    assert get_profile("parallel-experiments").objective == "max_samples_per_dollar"
    first, second = rec.candidates[:2]
    assert (first.instance_type, second.instance_type) == ("g4dn.metal", "g4dn.12xlarge")
    assert first.ranked_per_dollar("on-demand") == second.ranked_per_dollar("on-demand"), "the tie is exact"
    assert first.samples_per_second > second.samples_per_second


def test_ties_are_overlapping_intervals_and_measured_figures_are_points():
    rec = recommend("multi-gpu-training")
    assert any(c.tied_with for c in rec.candidates), "the full catalog has types the model cannot tell apart"
    # A measured figure carries no model uncertainty: two measured types 1% apart do not tie.
    m = {"p5.48xlarge": Measurement(1000.0, source="m"), "p5en.48xlarge": Measurement(1010.0, source="m")}
    rec = recommend("multi-gpu-training", measured=m, families=["p5", "p5en"])
    assert [c.instance_type for c in rec.candidates[:2]] == ["p5en.48xlarge", "p5.48xlarge"]
    assert not rec.pick.tied_with


def test_measured_beats_modelled_and_can_flip_the_ranking():
    base = recommend("cost-efficient-training")
    priced = [c for c in base.candidates if c.price_per_hour]
    loser = priced[-1]
    # the user's own units: 7x the model's. Two types measured as the model expects set the scale;
    # the loser measured far above its calibrated expectation wins, and is flagged as off the model.
    units = 7.0
    measured = {c.instance_type: Measurement(c.samples_per_second * units, source="bench.csv") for c in priced[:2]}
    measured[loser.instance_type] = Measurement(loser.samples_per_second * units * 100, source="bench.csv")
    rec = recommend("cost-efficient-training", measured=measured)
    assert rec.calibration.scale == pytest.approx(units)
    assert rec.pick.instance_type == loser.instance_type and rec.pick.throughput_source == "measured"
    assert [o[0] for o in rec.calibration.outliers] == [loser.instance_type]
    assert any(loser.instance_type in n and "outside its" in n for n in rec.notes)
    others = [c for c in rec.candidates if c.instance_type not in measured]
    assert others and all(c.throughput_source == "calibrated" for c in others)
    by_name = {c.instance_type: c for c in base.candidates}
    assert all(c.samples_per_second == pytest.approx(by_name[c.instance_type].samples_per_second * units)
               for c in others)


def test_a_hand_written_file_in_its_own_units_ranks_on_the_calibrated_scale():
    """Issue 25: the example throughput file in docs/selector.md counts the user's own samples (far fewer a
    second than the model's reference units). Without calibration its types sank to the bottom of
    the ranking; calibrated, every type is in those units and the measured ones rank among the
    modelled by their figures."""
    import csv
    import io
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "selector.md").read_text()
    block = page[page.index("instance_type,samples_per_second"):]
    block = block[:block.index("```")]
    from dl_selector.throughput import load_measurements
    tmp = Path(__import__("tempfile").mkdtemp()) / "bench.csv"
    tmp.write_text(block)
    catalog = load_catalog()
    measured = load_measurements(str(tmp), catalog.types)
    rows = list(csv.DictReader(io.StringIO(block)))
    assert len(measured) == len(rows) >= 2
    profile = "training"  # single- and multi-GPU types alike: both rows are candidates
    raw = recommend(profile, measured=measured, calibrate_model=False)
    cal = recommend(profile, measured=measured)
    rank = lambda rec, n: next(c.rank for c in rec.candidates if c.instance_type == n)  # noqa: E731
    for name in measured:
        assert rank(cal, name) < rank(raw, name), (name, rank(raw, name), rank(cal, name))
    assert cal.calibration.count == len(measured)
    assert {c.throughput_source for c in cal.candidates} == {"measured", "calibrated"}
    assert any(n.startswith("calibrated:") for n in cal.notes)


def test_measured_price_overrides_catalog_price():
    measured = {"g5.xlarge": Measurement(samples_per_second=500, price_per_hour=0.5, spot_price_per_hour=0.2)}
    rec = recommend("cost-efficient-training", measured=measured)
    g5 = next(c for c in rec.candidates if c.instance_type == "g5.xlarge")
    assert (g5.price_per_hour, g5.spot_price_per_hour) == (0.5, 0.2)
    assert g5.samples_per_dollar == pytest.approx(500 * 3600 / 0.5)


def test_unpriced_types_rank_after_priced_ones_on_cost_objectives():
    catalog = load_catalog()
    rec = recommend("cost-efficient-training", catalog=catalog.with_prices({}))
    priced = [c.price_per_hour is not None for c in rec.candidates]
    assert priced == sorted(priced, reverse=True)


def test_region_not_offered_is_excluded_with_reason():
    catalog = load_catalog()
    elsewhere = [f.instance_type for f in catalog if "us-east-1" not in f.regions]
    assert elsewhere, "some types are not offered in us-east-1 (dl2q, trn2 at the time of writing)"
    rec = recommend("training", region="us-east-1")
    excluded = {e.instance_type: e.reasons for e in rec.excluded}
    for name in elsewhere:
        assert "not offered in us-east-1" in excluded[name]


def test_retired_types_only_when_their_family_is_named():
    rec = recommend("single-gpu-training")
    reasons = {e.instance_type: e.reasons for e in rec.excluded}
    assert any("retired" in r for r in reasons["p3.2xlarge"])
    rec = recommend("single-gpu-training", families=["p3", "g5"])
    assert rec.pick.instance_type == "p3.2xlarge"


def test_fractional_gpus_are_not_whole_gpus():
    rec = recommend("single-gpu-training")
    reasons = {e.instance_type: e.reasons for e in rec.excluded}
    assert any("fractional" in r for r in reasons["g6f.large"])


def test_pcie_multi_gpu_is_penalised_but_independent_runs_are_not():
    from dl_selector.record import replace
    training = get_profile("training")
    by_type = lambda p: {c.instance_type: c.samples_per_second for c in recommend(p, families=["g5"]).candidates}
    dp = by_type(training)
    par = by_type(replace(training, independent_runs=True))
    g5x, g5_12_dp, g5_12_par = dp["g5.xlarge"], dp["g5.12xlarge"], par["g5.12xlarge"]
    assert g5_12_par == pytest.approx(4 * g5x)
    assert g5_12_dp == pytest.approx(4 * g5x * 0.80)


@pytest.mark.parametrize("kwargs,message", [
    ({"region": "us-east-7"}, "unknown region 'us-east-7'; closest: us-east-2, us-east-1"),
    ({"families": ["p55"]}, "unknown family 'p55'; closest: p5"),
])
def test_bad_input_names_the_closest_value(kwargs, message):
    with pytest.raises(UserError) as e:
        recommend("training", **kwargs)
    assert str(e.value).startswith(message)


def test_unknown_profile():
    with pytest.raises(UserError, match="unknown profile 'multi-node'; closest: multi-node-training"):
        get_profile("multi-node")


def test_top_limits_candidates_but_not_exclusions():
    full = recommend("training")
    rec = recommend("training", top=3)
    assert len(rec.candidates) == 3
    assert rec.excluded == full.excluded
    assert rec.pick == full.pick


def test_the_rules_a_ranking_skips_could_not_have_failed():
    """rules_for() skips a rule whose profile setting is off; every skipped rule, run anyway on
    every catalog type under every built-in profile and market, passes (so skipping is only speed)."""
    from dl_selector.accelerators import load_accelerators
    from dl_selector.profiles import builtin_profiles
    from dl_selector.requirements import RULES, Context, Filters, rules_for
    catalog, acc = load_catalog(), load_accelerators()
    for profile in builtin_profiles().values():
        for market in ("on-demand", "spot", "capacity-block"):
            for filters in (None, Filters(accelerator="H100")):
                ctx = Context(region="us-east-1", spot=market == "spot", named_families=frozenset(),
                              accelerators=acc, market=market, filters=filters)
                skipped = [r for r in RULES if r not in rules_for(profile, ctx)]
                for f in catalog:
                    assert [r.__name__ for r in skipped if r(f, profile, ctx)] == [], (profile.name, f.instance_type)


def _spot_prices(tmp_path, as_of: str):
    from dl_selector.prices import load_prices
    f = tmp_path / "p.csv"
    f.write_text("instance_type,region,on_demand_usd_per_hour,spot_usd_per_hour,spot_azs,spot_as_of\n"
                 f"p6-b200.48xlarge,us-east-1,113.93,21.01,1,{as_of}\n")
    return load_prices(str(f))


def test_a_cheap_single_az_undated_spot_quote_does_not_decide_a_pick(tmp_path):
    """Issue 25: p6-b200.48xlarge's spot figure in us-east-1 is one AZ's undated quote at 18% of
    on-demand; under a spot samples-per-dollar objective it would win on that quote alone."""
    rec = recommend("parallel-experiments", market="spot")
    b200 = next(c for c in rec.candidates if c.instance_type == "p6-b200.48xlarge")
    assert b200.spot_untrusted and b200.spot_single_az and b200.spot_price_per_hour < 0.25 * b200.price_per_hour
    assert rec.pick.instance_type != "p6-b200.48xlarge"
    assert any("confirm it with --live" in r for r in b200.reasons)
    assert any("--trust-single-az-spot" in n for n in rec.notes)
    # trusted on request, or when the quote is a current one (as --live gives)
    assert recommend("parallel-experiments", market="spot", trust_single_az_spot=True).pick.instance_type == \
        "p6-b200.48xlarge"
    import datetime as dt
    today = dt.date.today().isoformat()
    fresh = load_catalog().with_prices(_spot_prices(tmp_path, today))
    assert recommend("parallel-experiments", market="spot", catalog=fresh).pick.instance_type == "p6-b200.48xlarge"
    stale = load_catalog().with_prices(_spot_prices(tmp_path, "2026-01-01"))
    assert recommend("parallel-experiments", market="spot", catalog=stale).pick.instance_type != "p6-b200.48xlarge"
    # on-demand rankings are untouched
    assert not any(c.spot_untrusted for c in recommend("parallel-experiments").candidates)


def test_a_pick_that_rests_on_a_vendor_upper_bound_says_so():
    """Issue 25: Trainium's figures come from AWS's best-case claims; such a row may win, never silently.
    (Issue 39: it ranks on the centre below its bound, 1.11x V100, which no longer beats g6e's L40S on
    samples per dollar; against g6's L4 it still wins.)"""
    rec = recommend("training", families=["trn1", "g6"])
    assert rec.pick.facts.accelerator == "Trainium" and rec.pick.throughput_basis == "vendor-upper-bound"
    assert "upper bound" in rec.why and any("upper bound" in n for n in rec.notes)
    m = {rec.pick.instance_type: Measurement(rec.pick.samples_per_second, source="bench")}
    other = recommend("training", families=["trn1", "g6"], measured=m)
    assert other.pick.instance_type == rec.pick.instance_type and "upper bound" not in other.why
