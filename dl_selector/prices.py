"""Price tables: the embedded, cited one and the user's own (private pricing, discounts)."""
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time (a cold CLI start, issue 39 item 7)
    from typing import Iterable, Optional

from .errors import UserError
from .facts import Price
from .paths import data_file
from .validate import clean, csv_rows, date_stamp, finite_number, read_text

COLUMNS = ("instance_type", "region", "on_demand_usd_per_hour", "spot_usd_per_hour", "as_of", "source")
# Optional, written by scripts/build_prices.py: the spread and AZ count behind the spot median,
# and the spot figure's own date and source. A user's file may leave any of them out.
SPOT_COLUMNS = ("spot_min", "spot_max", "spot_azs", "spot_as_of", "spot_source")
MAX_SPOT_AZS = 1000

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


def spot_spread(quotes: "Iterable[float]") -> tuple[float, float, float, int]:
    """(median, min, max, count) of the AZ quotes behind one spot figure: the one rule that the
    embedded table (price_sources) and live prices (live_prices) both apply."""
    import statistics
    values = sorted(quotes)
    return round(statistics.median(values), 6), values[0], values[-1], len(values)


def _money(value: Optional[str], where: str) -> Optional[float]:
    value = (value or "").strip()
    if not value:
        return None
    return finite_number(value, f"{where}: price in USD per hour", MIN_USD_PER_HOUR, MAX_USD_PER_HOUR)


def load_prices(path: str = data_file("prices.csv")) -> PriceTable:
    """Read a price CSV; columns: instance_type, region, on_demand_usd_per_hour, spot_usd_per_hour,
    and optionally as_of, source, note, spot_min, spot_max, spot_azs, spot_as_of, spot_source.
    Returns {instance_type: {region: Price}}.

    Refuses (one line each) what read_text and csv_rows refuse, blank names, prices that are not
    finite and within the bounds above, a (type, region) priced twice (the later row would
    silently win), a spread that does not hold the median (spot_min <= spot <= spot_max), a
    spot_azs that is not a whole number from 0 up, and a spread or AZ count with no median.
    Regions and types are checked against the catalog by Catalog.with_prices."""
    path = str(path)
    shown = clean(path)
    text = read_text(path, "price")
    table: PriceTable = {}
    seen: dict[tuple[str, str], int] = {}
    for n, row in csv_rows(text, path, "price", COLUMNS[:3], COLUMNS[3:] + ("note",) + SPOT_COLUMNS):
        where = f"price file {shown} line {n}"
        name, region = row["instance_type"].strip(), row["region"].strip()
        if not name or not region:
            raise UserError(f"{where}: missing {'instance_type' if not name else 'region'}")
        if (name, region) in seen:
            raise UserError(f"{where}: {name} in {region} is priced twice (lines {seen[name, region]} and {n}); keep one row")
        seen[name, region] = n
        spot = _money(row.get("spot_usd_per_hour", ""), where)
        low, high, azs = _spread(row, spot, where)
        table.setdefault(name, {})[region] = Price(
            on_demand=_money(row["on_demand_usd_per_hour"], where),
            spot=spot,
            as_of=date_stamp(row.get("as_of") or "", f"{where}: as_of") or "unknown",
            source=(row.get("source") or "").strip() or path,
            note=(row.get("note") or "").strip(),
            spot_min=low,
            spot_max=high,
            spot_azs=azs,
            spot_as_of=date_stamp(row.get("spot_as_of") or "", f"{where}: spot_as_of"),
            spot_source=(row.get("spot_source") or "").strip(),
        )
    return table


def _spread(row: dict[str, str], spot: Optional[float], where: str) -> tuple[Optional[float], Optional[float], int]:
    """(spot_min, spot_max, spot_azs) of a row, each checked against the median `spot`."""
    low = _money(row.get("spot_min"), where)
    high = _money(row.get("spot_max"), where)
    raw_azs = (row.get("spot_azs") or "").strip()
    azs = int(finite_number(raw_azs, f"{where}: spot_azs", 0, MAX_SPOT_AZS, integer=True)) if raw_azs else 0
    if spot is None:
        given = [c for c, v in (("spot_min", low), ("spot_max", high), ("spot_azs", azs or None)) if v is not None]
        if given:
            raise UserError(f"{where}: {', '.join(given)} given without spot_usd_per_hour (the median); "
                            "give the median too or leave them empty")
        return None, None, 0
    if low is not None and low > spot:
        raise UserError(f"{where}: spot_min {low:g} is above spot_usd_per_hour {spot:g}; "
                        "allowed: spot_min <= spot_usd_per_hour <= spot_max")
    if high is not None and high < spot:
        raise UserError(f"{where}: spot_max {high:g} is below spot_usd_per_hour {spot:g}; "
                        "allowed: spot_min <= spot_usd_per_hour <= spot_max")
    return low, high, azs
