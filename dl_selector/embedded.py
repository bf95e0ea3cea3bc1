"""How the embedded catalog is stored: the specs in data/catalog.json, each region's prices in
data/prices/<region>.json. A start reads the specs and one region's prices: with every region the
sources price (31), one file was 618 KB and cost 7.5 ms of a 58 ms recommend (bench/selector_speed.py).

A user's catalog (`catalog refresh --out FILE`) stays one file with its prices inline; both
load into the same Catalog. `joined()` is the embedded catalog as one dict, as such a file holds it.
"""
from __future__ import annotations

import json
import os
from collections import abc

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time (a cold CLI start, issue 39 item 7)
    from typing import Any, Iterator, Mapping

from .facts import Price
from .paths import data_file

SPECS = data_file("catalog.json")
PRICES_DIR = data_file("prices")


def split(d: dict[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """A catalog dict -> (the same without prices, {region: {instance type: price dict}})."""
    by_region: dict[str, dict[str, Any]] = {}
    types = []
    for t in d["types"]:
        t = dict(t)
        for region, price in t.pop("prices", {}).items():
            by_region.setdefault(region, {})[t["instance_type"]] = price
        types.append(t)
    return {**d, "types": types}, {r: dict(sorted(p.items())) for r, p in sorted(by_region.items())}


def join(specs: dict[str, Any], by_region: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    types = [{**t, "prices": {r: p[t["instance_type"]] for r, p in sorted(by_region.items()) if t["instance_type"] in p}}
             for t in specs["types"]]
    return {**specs, "types": types}


def _region_files(directory: str = PRICES_DIR) -> list[str]:
    return sorted(n[:-5] for n in os.listdir(directory) if n.endswith(".json")) if os.path.isdir(directory) else []


def joined() -> dict[str, Any]:
    """The embedded catalog as one dict (what check_catalog and a refreshed file look like)."""
    with open(SPECS) as f:
        specs = json.load(f)
    by_region = {}
    for r in _region_files():
        with open(os.path.join(PRICES_DIR, f"{r}.json")) as f:
            by_region[r] = json.load(f)
    return join(specs, by_region)


def write(d: dict[str, Any], specs_path: str = SPECS, prices_dir: str = PRICES_DIR) -> None:
    """Write a catalog dict in the embedded layout (old region files that no longer apply go)."""
    specs, by_region = split(d)
    os.makedirs(prices_dir, exist_ok=True)
    for stale in set(_region_files(prices_dir)) - set(by_region):
        os.remove(os.path.join(prices_dir, f"{stale}.json"))
    for region, prices in by_region.items():
        with open(os.path.join(prices_dir, f"{region}.json"), "w") as f:
            f.write(json.dumps(prices, indent=1, allow_nan=False) + "\n")
    with open(specs_path, "w") as f:
        f.write(json.dumps(specs, indent=1, allow_nan=False) + "\n")


class RegionPrices:
    """Each region's Price records for every type, read from its file the first time it is asked."""

    def __init__(self, directory: str = PRICES_DIR) -> None:
        self.directory = directory
        self._tables: dict[str, dict[str, Price]] = {}
        self._regions: list[str] | None = None

    def table(self, region: str) -> dict[str, Price]:
        table = self._tables.get(region)
        if table is None:
            path = os.path.join(self.directory, f"{region}.json")
            raw = {}
            if region in self.regions():
                with open(path) as f:  # the package's own data: checked by tests, not at every start
                    raw = json.load(f)
            table = self._tables[region] = {t: Price(**p) for t, p in raw.items()}
        return table

    def regions(self) -> list[str]:
        if self._regions is None:
            self._regions = _region_files(self.directory)
        return self._regions


class LazyPrices(abc.Mapping[str, Price]):
    """One type's prices by region, as InstanceFacts.prices: a region is read when it is asked for;
    iterating (to_dict, a user's price file merged in) reads them all."""

    __slots__ = ("_all", "_type")

    def __init__(self, all_regions: RegionPrices, instance_type: str) -> None:
        self._all = all_regions
        self._type = instance_type

    def __getitem__(self, region: str) -> Price:
        return self._all.table(region)[self._type]

    def get(self, region: str, default: Any = None) -> Any:  # the ranking's hot path: no KeyError round trip
        table = self._all._tables.get(region)
        if table is None:
            table = self._all.table(region)
        return table.get(self._type, default)

    def __iter__(self) -> Iterator[str]:
        return iter([r for r in self._all.regions() if self._type in self._all.table(r)])

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return repr(dict(self.items()))
