"""dl_selector.record against the real `dataclasses` (the reference it replaces on the selector's
start-up path): the same classes declared both ways must construct, print, compare, hash, copy
and refuse assignment alike."""
from __future__ import annotations

import dataclasses
import random
from typing import Optional

import pytest

from dl_selector import record as rec


def _pair(frozen: bool):
    made = []
    for deco, fld in ((dataclasses.dataclass(frozen=frozen), dataclasses.field),
                      (rec.record(frozen=frozen), rec.field)):
        @deco
        class Point:
            x: int
            y: Optional[float]
            tags: tuple[str, ...] = ()
            extra: dict = fld(default_factory=dict)
            hidden: str = fld(default="h", repr=False, compare=False)
        made.append(Point)
    return made


def _values(rng: random.Random) -> dict:
    return {"x": rng.randint(-3, 3), "y": rng.choice([None, 0.5, 2.0]),
            "tags": tuple(rng.choice("ab") for _ in range(rng.randint(0, 2))),
            "extra": {"k": rng.randint(0, 1)} if rng.random() < 0.5 else {}, "hidden": rng.choice("hz")}


@pytest.mark.parametrize("frozen", [False, True])
def test_construction_repr_equality_and_hash_match_dataclasses(frozen):
    ref, mine = _pair(frozen)
    rng = random.Random(7)
    for _ in range(200):
        a, b = _values(rng), _values(rng)
        keep = rng.sample(sorted(a), rng.randint(2, 5))
        if "x" not in keep or "y" not in keep:
            keep += ["x", "y"]
        a = {k: a[k] for k in keep}
        r1, r2, m1, m2 = ref(**a), ref(**b), mine(**a), mine(**b)
        assert repr(m1).replace(mine.__qualname__, "P") == repr(r1).replace(ref.__qualname__, "P")
        assert (m1 == m2) == (r1 == r2) and (m1 == mine(**a)) and m1 != r1
        assert rec.asdict(m1) == dataclasses.asdict(r1)
        assert rec.replace(m1, x=9) == mine(**{**a, "x": 9})
        if frozen:
            try:
                same = hash(r1) == hash(ref(**a))
            except TypeError:  # a dict field: dataclasses cannot hash it either
                with pytest.raises(TypeError):
                    hash(m1)
            else:
                assert same and hash(m1) == hash(mine(**a))
    assert [f.name for f in rec.fields(mine)] == [f.name for f in dataclasses.fields(ref)]
    assert [f.type for f in rec.fields(mine)] == [f.type for f in dataclasses.fields(ref)]


def test_each_instance_gets_its_own_default_factory_value():
    _, mine = _pair(False)
    p, q = mine(1, 2.0), mine(1, 2.0)
    p.extra["k"] = 1
    assert q.extra == {}


def test_frozen_refuses_assignment_and_deletion_like_dataclasses():
    ref, mine = _pair(True)
    for obj, err in ((ref(1, None), dataclasses.FrozenInstanceError), (mine(1, None), rec.FrozenInstanceError)):
        with pytest.raises(AttributeError):
            obj.x = 2
        with pytest.raises(err):
            del obj.y
    assert mine.__hash__ is not None and _pair(False)[1].__hash__ is None  # eq without frozen: unhashable


def test_missing_and_unknown_arguments_fail_as_in_dataclasses():
    _, mine = _pair(True)
    with pytest.raises(TypeError):
        mine(x=1)
    with pytest.raises(TypeError, match="no field 'z'"):
        rec.replace(mine(1, 2.0), z=3)
    with pytest.raises(TypeError, match="non-default field"):
        @rec.record
        class Bad:
            a: int = 1
            b: int


def test_post_init_runs_on_construction_and_on_replace():
    @rec.record(frozen=True)
    class Order:
        spot: bool
        market: str = ""

        def __post_init__(self) -> None:
            if not self.market:
                object.__setattr__(self, "market", "spot" if self.spot else "on-demand")

    assert Order(True).market == "spot" and rec.replace(Order(True), spot=False, market="").market == "on-demand"


def test_replace_and_asdict_pass_dataclasses_through():
    ref, _ = _pair(True)
    assert rec.replace(ref(1, 2.0), x=5) == ref(5, 2.0) and rec.asdict(ref(1, 2.0))["x"] == 1


def test_frozen_records_of_hashable_fields_work_as_set_members_and_keys():
    @rec.record(frozen=True)
    class Key:
        a: int
        b: tuple = ()

    assert hash(Key(1, (2,))) == hash(Key(1, (2,))) and len({Key(1), Key(1), Key(2)}) == 2


def test_every_selector_record_takes_its_init_from_the_ahead_of_time_file_which_is_current():
    """record_inits.py is scripts/build_record_inits.py's output today, and a selector record's
    __init__ comes from it (no compile at start); a record it does not know still works (above)."""
    import importlib
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "scripts"))
    try:
        import build_record_inits
    finally:
        sys.path.pop(0)
    assert build_record_inits.OUT.read_text() == build_record_inits.render(), \
        "a record changed: run `python scripts/build_record_inits.py` and commit dl_selector/record_inits.py"
    for key in rec.GENERATED:
        if key.startswith("dl_selector."):
            module, name = key.rsplit(".", 1)
            cls = getattr(importlib.import_module(module), name)
            assert cls.__init__.__code__.co_filename.endswith("record_inits.py"), key


def test_an_ahead_of_time_init_is_used_only_where_its_source_is_the_one_record_makes(monkeypatch):
    """A stale entry (the class changed since the file was built) is compiled afresh, never used."""
    marker = lambda scope: (lambda self, x, y=0: setattr(self, "x", "ahead"))  # noqa: E731

    def point():
        @rec.record
        class Point:
            x: int
            y: int = 0
        return Point

    plain = point()
    key = f"{plain.__module__}.{plain.__qualname__}"
    current = rec.GENERATED[key]
    assert current == "def __init__(self, x, y=_d_y):\n    self.x = x\n    self.y = y\n"
    for source, expected in ((current, "ahead"), (current.replace("y=_d_y", "y=1"), 1)):
        monkeypatch.setattr(rec, "_AHEAD", [type("Ahead", (), {"SOURCES": {key: source}, "FACTORIES": {key: marker}})])
        assert point()(1).x == expected
