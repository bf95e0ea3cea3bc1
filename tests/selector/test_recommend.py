from __future__ import annotations

import pytest

from selector.catalog import load_catalog
from selector.errors import UserError
from selector.profiles import get_profile
from selector.recommend import recommend
from selector.throughput import Measurement


def test_samples_per_dollar_is_throughput_per_hour_over_price():
    rec = recommend("cost-efficient-training", region="us-east-1")
    for c in rec.candidates:
        if c.price_per_hour:
            assert c.samples_per_dollar == pytest.approx(c.samples_per_second * 3600 / c.price_per_hour)
        if c.spot_price_per_hour:
            assert c.spot_samples_per_dollar == pytest.approx(c.samples_per_second * 3600 / c.spot_price_per_hour)


def _follows(rec, metric, market="on-demand"):
    """Ties (within the model's uncertainty) form runs ranked cheaper first; between runs, the best
    figure of each run is at least the best of the next."""
    runs, c = [], list(rec.candidates)
    for x in c:
        if runs and x.instance_type in runs[-1][-1].tied_with:
            runs[-1].append(x)
        else:
            runs.append([x])
    for run in runs:
        prices = [x.hourly(market) or float("inf") for x in run]
        assert prices == sorted(prices), [x.instance_type for x in run]
    best = [max((metric(x) for x in run if metric(x) is not None), default=None) for run in runs]
    best = [b for b in best if b is not None]
    assert best == sorted(best, reverse=True)
    assert [x.rank for x in c] == list(range(1, len(c) + 1))


def test_ranks_follow_the_objective():
    _follows(recommend("multi-gpu-training"), lambda c: c.samples_per_second)
    rec = recommend("dev-prototyping")
    prices = [c.price_per_hour for c in rec.candidates if c.price_per_hour is not None]
    assert prices == sorted(prices)
    _follows(recommend("cost-efficient-training", spot=True), lambda c: c.spot_samples_per_dollar, "spot")


def test_ties_are_within_the_stated_uncertainty_and_cheaper_first():
    rec = recommend("multi-gpu-training")
    by_name = {c.instance_type: c for c in rec.candidates}
    tied = [c for c in rec.candidates if c.tied_with]
    assert tied, "the full catalog has types the model cannot tell apart (p5 and p5en: H100 vs H200)"
    for c in tied:
        for other in map(by_name.get, c.tied_with):
            hi, lo = max(c.samples_per_second, other.samples_per_second), min(c.samples_per_second, other.samples_per_second)
            assert lo >= hi * (1 - max(c.uncertainty, other.uncertainty)) - 1e-9
    # A measured figure carries no model uncertainty: two measured types 1% apart do not tie.
    from selector.throughput import Measurement
    m = {"p5.48xlarge": Measurement(1000.0, source="m"), "p5en.48xlarge": Measurement(1010.0, source="m")}
    rec = recommend("multi-gpu-training", measured=m, families=["p5", "p5en"])
    assert [c.instance_type for c in rec.candidates[:2]] == ["p5en.48xlarge", "p5.48xlarge"]
    assert not rec.pick.tied_with


def test_measured_beats_modelled_and_can_flip_the_ranking():
    base = recommend("cost-efficient-training")
    loser = [c for c in base.candidates if c.price_per_hour][-1].instance_type
    measured = {loser: Measurement(samples_per_second=1e7, source="measured (bench.csv)")}
    rec = recommend("cost-efficient-training", measured=measured)
    assert rec.pick.instance_type == loser
    assert rec.pick.throughput_source == "measured"
    assert all(c.throughput_source == "model" for c in rec.alternates)


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
    from dataclasses import replace
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
