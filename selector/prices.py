"""Price tables: the embedded, cited one and the user's own (private pricing, discounts)."""
from __future__ import annotations

from typing import Optional

from .errors import UserError
from .facts import Price
from .validate import clean, csv_rows, finite_number, read_text

from .paths import data_file
COLUMNS = ("instance_type", "region", "on_demand_usd_per_hour", "spot_usd_per_hour", "as_of", "source")

PriceTable = dict[str, dict[str, Price]]


# Sanity bounds shared with --throughput: they keep samples per dollar finite and catch unit slips.
MIN_USD_PER_HOUR = 1e-4
MAX_USD_PER_HOUR = 1e5


def _money(value: Optional[str], where: str) -> Optional[float]:
    value = (value or "").strip()
    if not value:
        return None
    return finite_number(value, f"{where}: price in USD per hour", MIN_USD_PER_HOUR, MAX_USD_PER_HOUR)


def load_prices(path: str = data_file("prices.csv")) -> PriceTable:
    """Read a price CSV; columns: instance_type, region, on_demand_usd_per_hour, spot_usd_per_hour,
    and optionally as_of, source, note. Returns {instance_type: {region: Price}}.

    Refuses (one line each) what read_text and csv_rows refuse, blank names, prices that are not
    finite and within the bounds above, and a (type, region) priced twice: the later row would
    silently win. Regions and types are checked against the catalog by Catalog.with_prices."""
    path = str(path)
    shown = clean(path)
    text = read_text(path, "price")
    table: PriceTable = {}
    seen: dict[tuple[str, str], int] = {}
    for n, row in csv_rows(text, path, "price", COLUMNS[:3], COLUMNS[3:] + ("note",)):
        where = f"price file {shown} line {n}"
        name, region = row["instance_type"].strip(), row["region"].strip()
        if not name or not region:
            raise UserError(f"{where}: missing {'instance_type' if not name else 'region'}")
        if (name, region) in seen:
            raise UserError(f"{where}: {name} in {region} is priced twice (lines {seen[name, region]} and {n}); keep one row")
        seen[name, region] = n
        table.setdefault(name, {})[region] = Price(
            on_demand=_money(row["on_demand_usd_per_hour"], where),
            spot=_money(row.get("spot_usd_per_hour", ""), where),
            as_of=(row.get("as_of") or "").strip() or "unknown",
            source=(row.get("source") or "").strip() or path,
            note=(row.get("note") or "").strip(),
        )
    return table
