"""The guides' picks, reproduced from data: on the families the guides knew and the prices they
saw, each profile's top pick is the one the AWS GPU buying guides recommend (the guide_pick column of selector/data/profiles.toml). With the full, current
catalog a newer type may win, but every candidate must still meet every hard requirement."""
from __future__ import annotations

from pathlib import Path

import pytest

from selector.catalog import load_catalog
from selector.prices import load_prices
from selector.profiles import builtin_profiles
from selector.recommend import recommend
from selector.requirements import Context, failures
from selector.accelerators import load_accelerators

GUIDE_FAMILIES = ["p2", "p3", "p3dn", "p4d", "g3", "g3s", "g4dn", "g5", "g5g"]
GUIDE_ERA_PRICES = Path(__file__).parent.parent / "data" / "guide_era_prices.csv"
WITH_GUIDE_PICK = [p for p in builtin_profiles().values() if p.guide_pick]


def test_every_guide_row_has_a_profile():
    picks = {p.guide_pick for p in WITH_GUIDE_PICK}
    assert {"p4d.24xlarge", "p3dn.24xlarge", "p3.2xlarge", "g5.xlarge", "p3.8xlarge",
            "g4dn.xlarge", "g5g.xlarge"} <= picks


@pytest.mark.parametrize("profile", WITH_GUIDE_PICK, ids=lambda p: p.name)
def test_guides_pick_wins_on_guides_data(profile):
    catalog = load_catalog().with_prices(load_prices(GUIDE_ERA_PRICES))
    rec = recommend(profile, region="us-east-1", families=GUIDE_FAMILIES, catalog=catalog)
    assert rec.pick is not None, rec.why
    assert rec.pick.instance_type == profile.guide_pick, rec.why


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
