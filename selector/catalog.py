"""The embedded, dated catalog of accelerated instance types (data/catalog.json).

Built by `python -m selector catalog refresh`; read here with the standard library only, so
that a recommendation costs milliseconds and no AWS account.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Iterable, Optional

from .errors import UserError, unknown
from .facts import InstanceFacts
from .prices import PriceTable

from .paths import data_file

DEFAULT_PATH = data_file("catalog.json")


@dataclass(frozen=True)
class Catalog:
    as_of: str
    specs_source: str
    regions: tuple[str, ...]
    types: dict[str, InstanceFacts]
    notes: tuple[str, ...] = field(default=())

    # ---- lookups -------------------------------------------------------------------------
    def get(self, instance_type: str) -> InstanceFacts:
        try:
            return self.types[instance_type]
        except KeyError:
            raise unknown("instance type", instance_type, self.types,
                          hint="'python -m selector recommend --profile training --json' lists them") from None

    def __contains__(self, instance_type: str) -> bool:
        return instance_type in self.types

    def __iter__(self):
        return iter(self.types.values())

    def __len__(self) -> int:
        return len(self.types)

    @property
    def families(self) -> set[str]:
        return {f.family for f in self.types.values()}

    def check_region(self, region: str) -> str:
        if region not in self.regions:
            raise unknown("region", region, self.regions)
        return region

    # ---- derived catalogs ------------------------------------------------------------------
    def only_families(self, families: Iterable[str]) -> "Catalog":
        wanted = {f.strip() for f in families if f.strip()}
        known = self.families
        for f in sorted(wanted):
            if f not in known:
                raise unknown("family", f, known)
        return replace(self, types={k: v for k, v in self.types.items() if v.family in wanted})

    def with_prices(self, table: PriceTable) -> "Catalog":
        """The user's own prices replace the catalog's for the (type, region) pairs they name."""
        for name in table:
            if name not in self.types:
                raise UserError(str(unknown("instance type in price file", name, self.types)))
        types = dict(self.types)
        for name, by_region in table.items():
            facts = types[name]
            types[name] = replace(facts, prices={**facts.prices, **by_region})
        return replace(self, types=types)

    # ---- (de)serialisation -----------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "as_of": self.as_of,
            "specs_source": self.specs_source,
            "notes": list(self.notes),
            "regions": list(self.regions),
            "types": [f.to_dict() for f in sorted(self.types.values(), key=lambda f: f.instance_type)],
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Catalog":
        types = {t["instance_type"]: InstanceFacts.from_dict(t) for t in d["types"]}
        return cls(
            as_of=d["as_of"],
            specs_source=d["specs_source"],
            regions=tuple(d["regions"]),
            types=types,
            notes=tuple(d.get("notes", ())),
        )


_default: Optional[Catalog] = None


def load_catalog(path: Optional[str] = None) -> Catalog:
    """The embedded catalog (cached), or a user's catalog file written by `catalog refresh`."""
    global _default
    if path is None and _default is not None:
        return _default
    p = str(path) if path else DEFAULT_PATH
    try:
        with open(p) as f:
            data = json.load(f)
    except OSError as e:
        raise UserError(f"cannot read catalog file {p}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise UserError(f"catalog file {p} is not valid JSON (line {e.lineno}): write one with 'catalog refresh --out FILE'") from None
    try:
        catalog = Catalog.from_dict(data)
    except (KeyError, TypeError) as e:
        raise UserError(f"catalog file {p} is not a dl-launcher catalog (missing or bad field {e}); write one with 'catalog refresh --out FILE'") from None
    if path is None:
        _default = catalog
    return catalog
