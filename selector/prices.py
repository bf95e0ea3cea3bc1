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


# A spot price below this share of on-demand is not a market price: it is a placeholder (moto
# answers with fixed figures), a unit slip or a stale quote. The deepest discounts AWS shows on
# its Spot Instance Advisor are "up to 90%", so 5% leaves a wide margin.
MIN_SPOT_SHARE_OF_ON_DEMAND = 0.05


def implausible(price: Optional[float], on_demand: Optional[float] = None, kind: str = "spot") -> Optional[str]:
    """Why a price must not be used, or None. Shared by the price builder and live refresh."""
    if price is None:
        return "no figure"
    if not price == price or price in (float("inf"), float("-inf")):
        return f"{kind} price {price} is not a number"
    if price <= 0:
        return f"{kind} price {price:g} is zero or negative"
    if price < MIN_USD_PER_HOUR or price > MAX_USD_PER_HOUR:
        return f"{kind} price {price:g} is outside {MIN_USD_PER_HOUR:g}-{MAX_USD_PER_HOUR:g} USD/h"
    if kind == "spot" and on_demand:
        if price < MIN_SPOT_SHARE_OF_ON_DEMAND * on_demand:
            return (f"spot price {price:g} is below {MIN_SPOT_SHARE_OF_ON_DEMAND:.0%} of on-demand {on_demand:g}: "
                    "a placeholder or unit slip, not a market price")
    return None


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
