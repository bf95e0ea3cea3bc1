"""The embedded, dated catalog of accelerated instance types (data/catalog.json).

Built by `python -m dl_selector catalog refresh`; read here with the standard library only, so
that a recommendation costs milliseconds and no AWS account.
"""
from __future__ import annotations

import json

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time (a cold CLI start, issue 39 item 7)
    from typing import Any, Callable, Iterable, Mapping, Optional

from .errors import UserError, unknown
from .facts import MAX_NETWORK_GBPS, InstanceFacts, Price
from .paths import data_file
from .prices import MAX_USD_PER_HOUR, MIN_USD_PER_HOUR, PriceTable
from .record import field, fields, record, replace
from .validate import clean, date_stamp, finite_number, parse_json, read_text

DEFAULT_PATH = data_file("catalog.json")


@record(frozen=True)
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
                          hint="'python -m dl_selector recommend --profile training --json' lists them") from None

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
        for name, by_region in table.items():
            if name not in self.types:
                raise UserError(str(unknown("instance type in price file", name, self.types)))
            # A price for a region the catalog does not know would be stored and never read.
            for region in by_region:
                if region not in self.regions:
                    raise unknown(f"region for {name} in price file", region, self.regions)
        types = dict(self.types)
        for name, by_region in table.items():
            facts = types[name]
            types[name] = replace(facts, prices={**facts.prices, **by_region})
        return replace(self, types=types)

    def with_capacity_block_prices(self, region: str, rates: dict) -> "Catalog":
        """Quoted Capacity Block rates ({type: CapacityBlockPrice}) replace those on record in `region`."""
        types = dict(self.types)
        for name, rate in rates.items():
            f = types[name]
            types[name] = replace(f, capacity_block_prices={**f.capacity_block_prices, region: rate})
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
    def from_dict(cls, d: dict, prices_for: Optional[Callable[[str], Mapping[str, Price]]] = None) -> "Catalog":
        """prices_for(instance type): the type's prices where `d` does not hold them inline."""
        types = {t["instance_type"]: InstanceFacts.from_dict(t, prices_for(t["instance_type"]) if prices_for else None)
                 for t in d["types"]}
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
    shown = clean(p)
    if path is None:  # the package's own specs: tests/selector/test_catalog.py parses them strictly
        with open(p, "rb") as f:
            data = json.load(f)
    else:
        data = parse_json(read_text(p, "catalog"), p, "catalog")
    try:
        if path is not None:
            # The embedded catalog is the package's own data, checked by the same function in
            # tests/selector/test_catalog.py: a CLI start need not check it again (6 ms of ~60).
            check_catalog(data)
            catalog = Catalog.from_dict(data)
        else:  # the specs here, each region's prices in its own file, read when first asked for
            from .embedded import LazyPrices, RegionPrices
            regions = RegionPrices()
            catalog = Catalog.from_dict(data, lambda t: LazyPrices(regions, t))
        if path is not None:
            # The throughput model looks each accelerator up in the cited table; a user's catalog
            # naming one it lacks would fail mid-ranking. The embedded catalog is built from it.
            from .accelerators import load_accelerators
            table = load_accelerators()
            for f in catalog:
                if f.accelerator not in table:
                    raise unknown(f"accelerator in {f.instance_type!r}", f.accelerator, table)
    except UserError as e:
        raise UserError(f"catalog file {shown}: {e}; write one with 'catalog refresh --out FILE'") from None
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise UserError(f"catalog file {shown} is not a dl-launcher catalog (missing or bad field {clean(str(e))[:120]}); "
                        "write one with 'catalog refresh --out FILE'") from None
    if path is None:
        _default = catalog
    return catalog


# Sanity bounds for a catalog's numbers: a NaN or 1e308 from a hand-edited file would otherwise
# reach the ranking and --json (which must stay strict JSON).
_MAX_COUNT = 1_000_000
_MAX_AMOUNT = 1e9


def check_catalog(d: object) -> None:
    """Raise UserError (without the file name) at the first field of the wrong type or range."""
    if not isinstance(d, dict):
        raise UserError(f"expected a JSON object with as_of, specs_source, regions, types; got a {type(d).__name__}")
    for key, kind in (("as_of", str), ("specs_source", str), ("regions", list), ("types", list)):
        if not isinstance(d.get(key), kind):
            raise UserError(f"{key} must be a {'string' if kind is str else 'list'}")
    date_stamp(d["as_of"], "as_of")
    _strings(d["regions"], "regions")
    _strings(d.get("notes", []), "notes")
    seen: set[str] = set()
    for i, t in enumerate(d["types"]):
        if not isinstance(t, dict):
            raise UserError(f"types[{i}] must be an object")
        name = t.get("instance_type")
        if not isinstance(name, str) or not name:
            raise UserError(f"types[{i}].instance_type must be a non-empty string")
        if name in seen:
            raise UserError(f"{name!r} appears twice in types")
        seen.add(name)
        _check_facts(t, f"types[{i}] ({name!r})")


def _strings(v: object, where: str) -> None:
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise UserError(f"{where} must be a list of strings")


def _check_facts(t: dict, where: str) -> None:
    for f in fields(InstanceFacts):
        if f.name not in t:
            continue  # a missing required field is reported by from_dict's TypeError
        v, kind, what = t[f.name], f.type, f"{where}.{f.name}"
        if kind == "int":
            if isinstance(v, bool) or not isinstance(v, int):
                raise UserError(f"{what} must be a whole number, got {clean(repr(v))[:40]}")
            finite_number(v, what, 0, _MAX_COUNT, integer=True)
        elif kind == "float":
            if f.name == "accelerator_fraction":
                finite_number(v, what, 0, 1, above=True)
            else:
                finite_number(v, what, 0, _MAX_AMOUNT)
        elif kind == "Optional[float]":
            # null means "not published"; a bandwidth of 0 Gbps is no figure at all.
            if v is not None:
                if isinstance(v, str):  # finite_number would read "400" from a CSV; JSON has numbers
                    raise UserError(f"{what} must be null or a number, got {clean(repr(v))[:40]}")
                if f.name.endswith("_gbps"):
                    finite_number(v, what, 0, MAX_NETWORK_GBPS, above=True)
                else:
                    finite_number(v, what, 0, _MAX_AMOUNT)
        elif kind == "bool" and not isinstance(v, bool):
            raise UserError(f"{what} must be true or false")
        elif kind == "str" and not isinstance(v, str):
            raise UserError(f"{what} must be a string")
        elif kind.startswith("tuple"):
            _strings(v, what)
    nvme = t.get("nvme")
    if nvme is not None:
        if not isinstance(nvme, dict) or set(nvme) != {"count", "size_gb"}:
            raise UserError(f"{where}.nvme must be null or {{count, size_gb}}")
        for k in ("count", "size_gb"):
            finite_number(nvme[k], f"{where}.nvme.{k}", 0, _MAX_COUNT, integer=True)
    blocks = t.get("capacity_block_prices", {})
    if not isinstance(blocks, dict):
        raise UserError(f"{where}.capacity_block_prices must be an object of region -> rate")
    for region, b in blocks.items():
        if not isinstance(b, dict) or not isinstance(b.get("as_of"), str) or not isinstance(b.get("source"), str):
            raise UserError(f"{where}.capacity_block_prices[{region!r}] must be {{usd_per_hour, as_of, source}}")
        date_stamp(b["as_of"], f"{where}.capacity_block_prices[{region!r}].as_of")
        finite_number(b.get("usd_per_hour"), f"{where}.capacity_block_prices[{region!r}].usd_per_hour",
                      MIN_USD_PER_HOUR, MAX_USD_PER_HOUR)
    prices = t.get("prices", {})
    if not isinstance(prices, dict):
        raise UserError(f"{where}.prices must be an object of region -> price")
    for region, p in prices.items():
        if not isinstance(p, dict):
            raise UserError(f"{where}.prices[{region!r}] must be an object")
        for k in ("on_demand", "spot"):
            if p.get(k) is not None:
                finite_number(p[k], f"{where}.prices[{region!r}].{k}", MIN_USD_PER_HOUR, MAX_USD_PER_HOUR)
        for k in ("as_of", "source", "note", "spot_source", "spot_flag"):
            if k in p and not isinstance(p[k], str):
                raise UserError(f"{where}.prices[{region!r}].{k} must be a string")
        for k in ("as_of", "spot_as_of"):
            if k in p:
                date_stamp(p[k], f"{where}.prices[{region!r}].{k}")
        _check_spot_quotes(p.get("spot_quotes", []), f"{where}.prices[{region!r}].spot_quotes")


def _check_spot_quotes(quotes: Any, where: str) -> None:
    """[[AZ, USD/h, timestamp], ...]: what `catalog refresh --prices` records per AZ."""
    if not isinstance(quotes, list):
        raise UserError(f"{where} must be a list of [AZ, USD per hour, timestamp]")
    for i, q in enumerate(quotes):
        if not (isinstance(q, list) and len(q) == 3 and isinstance(q[0], str) and q[0] and isinstance(q[2], str)):
            raise UserError(f"{where}[{i}] must be [AZ, USD per hour, timestamp], got {clean(repr(q))[:60]}")
        finite_number(q[1], f"{where}[{i}] USD per hour", MIN_USD_PER_HOUR, MAX_USD_PER_HOUR)
        date_stamp(q[2], f"{where}[{i}] timestamp")
