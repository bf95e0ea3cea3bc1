"""The guides' picks, reproduced from data: on the families the guides knew and the prices they
saw, each profile's top pick is the one the AWS GPU buying guides recommend (the guide_pick
column of dl_selector/data/profiles.toml), except where the product deliberately answers otherwise
(DIFFERS, each with its reason). With the full, current catalog a newer type may win, but every
candidate must still meet every hard requirement.

Which rows prove anything about the throughput model: DECIDED_BY says, per profile, what
decides the guides' pick on the guides' data, and a test checks it:
- "filters": the hard requirements leave one type;
- "price": the objective is the price per hour (the model only breaks exact price ties);
- "memory": the objective is accelerator memory per node;
- "model": the objective rests on modelled throughput, so the row exercises the model.
The sensitivity test fails if a pick hinges on a threshold placed exactly at the winner's value.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from dl_selector.catalog import load_catalog
from dl_selector.prices import load_prices
from dl_selector.profiles import builtin_profiles
from dl_selector.recommend import recommend
from dl_selector.requirements import Context, failures
from dl_selector.accelerators import load_accelerators

GUIDE_FAMILIES = ["p2", "p3", "p3dn", "p4d", "g3", "g3s", "g4dn", "g5", "g5g"]
GUIDE_ERA_PRICES = Path(__file__).parent.parent / "data" / "guide_era_prices.csv"
WITH_GUIDE_PICK = [p for p in builtin_profiles().values() if p.guide_pick]

# Golden rows the product does not reproduce, on purpose, with the product's reason.
DIFFERS = {
    "parallel-experiments": (
        "the guides picked the cheapest node per hour with 4 V100-class GPUs; the product ranks independent runs by "
        "samples per dollar (experiments finished per dollar) with no speed floor, and on the guides' prices "
        "p3.8xlarge's 4 V100s give fewer samples per dollar than p4d.24xlarge or g5.12xlarge"),
}

DECIDED_BY = {
    "multi-node-training": "model",
    "cost-efficient-multi-node": "price",
    "multi-gpu-training": "model",
    "cost-efficient-multi-gpu": "price",
    "parallel-experiments": "model",
    "single-gpu-training": "model",
    "cost-efficient-training": "model",
    "dev-prototyping": "price",
    "inference": "price",
    "int8-inference": "price",
    "large-model": "memory",
    "fp64-hpc": "model",
    "arm": "model",
}

# Thresholds measured on a continuous scale. Counts (min/max_accelerators) are left out: EC2 sells
# 1, 2, 4, 8 or 16 accelerators, so a count threshold always sits on some type's value; it states
# the workload's shape ("8 NVLink GPUs per node"), not a cut placed between two candidates.
CONTINUOUS_THRESHOLDS = {
    "min_accelerator_memory_gib": lambda f, acc: f.accelerator_memory_gib,
    "min_relative_throughput": lambda f, acc: acc[f.accelerator].relative_training_throughput * f.accelerator_fraction,
}


def _guide_catalog():
    return load_catalog().with_prices(load_prices(GUIDE_ERA_PRICES))


def test_every_guide_row_has_a_profile():
    picks = {p.guide_pick for p in WITH_GUIDE_PICK}
    assert {"p4d.24xlarge", "p3dn.24xlarge", "p3.2xlarge", "g5.xlarge", "p3.8xlarge",
            "g4dn.xlarge", "g5g.xlarge"} <= picks


@pytest.mark.parametrize("profile", [
    pytest.param(p, marks=pytest.mark.xfail(strict=True, reason=DIFFERS[p.name])) if p.name in DIFFERS else p
    for p in WITH_GUIDE_PICK], ids=lambda p: p.name)
def test_guides_pick_wins_on_guides_data(profile):
    rec = recommend(profile, region="us-east-1", families=GUIDE_FAMILIES, catalog=_guide_catalog())
    assert rec.pick is not None, rec.why
    assert rec.pick.instance_type == profile.guide_pick, rec.why


def test_every_golden_row_says_what_decides_it():
    assert set(DECIDED_BY) == {p.name for p in WITH_GUIDE_PICK}
    catalog = _guide_catalog()
    for p in WITH_GUIDE_PICK:
        rec = recommend(p, region="us-east-1", families=GUIDE_FAMILIES, catalog=catalog)
        if len(rec.candidates) == 1:
            actual = "filters"
        else:
            actual = {"min_price": "price", "max_accelerator_memory": "memory"}.get(p.objective, "model")
        assert DECIDED_BY[p.name] == actual, f"{p.name}: {len(rec.candidates)} candidates, objective {p.objective}"


@pytest.mark.parametrize("profile", WITH_GUIDE_PICK, ids=lambda p: p.name)
def test_no_golden_pick_hinges_on_a_threshold_at_the_winners_value(profile):
    """A threshold equal to the winner's own value that, removed, changes the pick was placed to make
    that pick win (the parallel-experiments speed floor of 1.0 = V100 was one)."""
    from dl_selector.record import replace
    catalog, acc = _guide_catalog(), load_accelerators()
    rec = recommend(profile, region="us-east-1", families=GUIDE_FAMILIES, catalog=catalog)
    winner = rec.pick.facts
    for name, value_of in CONTINUOUS_THRESHOLDS.items():
        threshold = getattr(profile, name)
        if not threshold or abs(value_of(winner, acc) - threshold) > 1e-9:
            continue
        relaxed = recommend(replace(profile, **{name: 0.0}), region="us-east-1", families=GUIDE_FAMILIES,
                            catalog=catalog)
        assert relaxed.pick.instance_type == winner.instance_type, (
            f"{profile.name}: {name} = {threshold:g} is exactly {winner.instance_type}'s value, and without it "
            f"{relaxed.pick.instance_type} wins: the threshold decides the golden answer")


def test_the_sensitivity_check_catches_a_floor_at_the_winners_value():
    """The check itself must be able to fail: the old parallel-experiments profile (min_price, speed
    floor 1.0 = V100's value) picked p3.8xlarge only because of that floor."""
    from dl_selector.record import replace
    old = replace(builtin_profiles()["parallel-experiments"], objective="min_price", min_relative_throughput=1.0)
    with pytest.raises(AssertionError, match="min_relative_throughput = 1 is exactly p3.8xlarge's value"):
        test_no_golden_pick_hinges_on_a_threshold_at_the_winners_value(old)


@pytest.mark.parametrize("profile", list(builtin_profiles().values()), ids=lambda p: p.name)
@pytest.mark.parametrize("spot", [False, True])
def test_full_catalog_candidates_meet_every_requirement(profile, spot):
    accelerators = load_accelerators()
    rec = recommend(profile, region="us-east-1", spot=spot)
    ctx = Context("us-east-1", spot, frozenset(), accelerators)
    catalog = load_catalog()
    assert rec.candidates, f"{profile.name}: nothing qualifies ({rec.why})"
    for c in rec.candidates:
        assert failures(catalog.get(c.instance_type), profile, ctx) == []
        assert not c.facts.retired
    names = {c.instance_type for c in rec.candidates} | {e.instance_type for e in rec.excluded}
    assert names == set(catalog.types), "every type is either a candidate or excluded with reasons"
    assert all(e.reasons for e in rec.excluded)
