"""The file `bench collect` writes (bench-results.json), read back for `bench report` and checked
key by key: a hand-edited or truncated file is one UserError line naming the file and the key.
"""
from __future__ import annotations

from typing import Any

from ..errors import UserError
from ..validate import clean, finite_number, parse_json, read_text
from .contract import COLLECTED_VERSION, Plan, PlannedCandidate

# median rounded to 3 decimals by collect can sit a hair outside [min, max] when every window is equal.
_ROUNDING = 1e-3


def load_results(path: str) -> dict[str, Any]:
    """The file `bench collect` wrote, checked; a one-line UserError naming the file and key otherwise."""
    shown = clean(str(path))
    data = parse_json(read_text(path, "bench results"), path, "bench results")
    _Checker(f"bench results file {shown}").check(data)
    return data


class _Checker:
    """Each refusal names the file and the key (measurements[2].min), so a hand-edited or truncated
    file is fixed in one look."""

    def __init__(self, where: str) -> None:
        self.where = where

    def bad(self, what: str) -> UserError:
        return UserError(f"{self.where}: {what} (write it with 'python -m dl_selector bench collect')")

    def number(self, value: Any, key: str, lo: float = 0, *, above: bool = False, hi: float | None = None,
               integer: bool = False) -> float:
        # finite_number takes "812.3" as CSV would; in JSON a quoted number is a mistake upstream.
        if isinstance(value, str):
            raise self.bad(f"{key} must be a number, got the string {clean(repr(value))[:40]}")
        return finite_number(value, f"{self.where}: {key}", lo, hi, above=above, integer=integer)

    def text(self, value: Any, key: str) -> None:
        if not isinstance(value, str):
            raise self.bad(f"{key} must be a string, got {clean(repr(value))[:40]}")

    def check(self, data: Any) -> None:
        if not isinstance(data, dict):
            raise self.bad("expected a JSON object")
        if data.get("version") != COLLECTED_VERSION:
            raise self.bad(f"version must be {COLLECTED_VERSION}, got {clean(repr(data.get('version')))[:20]}")
        for key in ("collected", "source"):
            if key in data:
                self.text(data[key], key)
        try:
            plan = Plan.from_dict(data.get("plan"))
        except ValueError as e:
            raise self.bad(f"plan: {clean(str(e))}") from None
        for i, c in enumerate(plan.candidates, 1):
            self.candidate(c, f"plan.candidates[{i}]")
        names = {c.instance_type for c in plan.candidates}
        seen: set[str] = set()
        for key in ("measurements", "failed"):
            rows = data.get(key)
            if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
                raise self.bad(f"{key} must be a list of objects")
            for i, r in enumerate(rows, 1):
                name = r.get("instance_type")
                if not isinstance(name, str) or name not in names:
                    raise self.bad(f"{key}[{i}].instance_type {clean(repr(name))[:60]} is not in the plan")
                if name in seen:
                    raise self.bad(f"{key}[{i}].instance_type {name} is listed twice")
                seen.add(name)
                (self.measurement if key == "measurements" else self.failure)(r, f"{key}[{i}]")
        missing = [c.instance_type for c in plan.candidates if c.instance_type not in seen]
        if missing:
            raise self.bad(f"{missing[0]} is in the plan but neither in measurements nor in failed")

    def candidate(self, c: PlannedCandidate, key: str) -> None:
        self.text(c.accelerators, f"{key}.accelerators")
        self.number(c.modelled_samples_per_second, f"{key}.modelled_samples_per_second")
        self.number(c.uncertainty, f"{key}.uncertainty", hi=10)
        for name in ("on_demand_per_hour", "spot_per_hour"):
            if getattr(c, name) is not None:  # no price in that market: allowed, shown as "-"
                self.number(getattr(c, name), f"{key}.{name}", above=True)

    def measurement(self, r: dict[str, Any], key: str) -> None:
        sps, lo, hi = (self.number(r.get(k), f"{key}.{k}", above=True) for k in ("samples_per_second", "min", "max"))
        if not lo - _ROUNDING <= sps <= hi + _ROUNDING:
            raise self.bad(f"{key}.samples_per_second {sps:g} is outside min {lo:g} .. max {hi:g}")
        if "windows" in r:
            self.number(r["windows"], f"{key}.windows", 1, integer=True)
        if "spread" in r:
            self.number(r["spread"], f"{key}.spread")

    def failure(self, r: dict[str, Any], key: str) -> None:
        self.text(r.get("reason"), f"{key}.reason")
