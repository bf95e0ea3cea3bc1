"""Price tables: the embedded, cited one and the user's own (private pricing, discounts)."""
from __future__ import annotations

import csv
from typing import Optional

from .errors import UserError
from .facts import Price

from .paths import data_file
COLUMNS = ("instance_type", "region", "on_demand_usd_per_hour", "spot_usd_per_hour", "as_of", "source")

PriceTable = dict[str, dict[str, Price]]


def _money(value: str, where: str) -> Optional[float]:
    value = (value or "").strip()
    if not value:
        return None
    try:
        v = float(value)
    except ValueError:
        raise UserError(f"{where}: {value!r} is not a price in USD per hour (a number such as 3.06)") from None
    if v <= 0:
        raise UserError(f"{where}: price must be above zero, got {value}")
    return v


def load_prices(path: str = data_file("prices.csv")) -> PriceTable:
    """Read a price CSV; columns: instance_type, region, on_demand_usd_per_hour, spot_usd_per_hour,
    and optionally as_of, source, note. Returns {instance_type: {region: Price}}."""
    path = str(path)
    try:
        f = open(path, newline="")
    except OSError as e:
        raise UserError(f"cannot read price file {path}: {e.strerror}") from None
    table: PriceTable = {}
    with f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS[:3] if c not in (reader.fieldnames or [])]
        if missing:
            raise UserError(
                f"price file {path}: missing column(s) {', '.join(missing)}; expected {', '.join(COLUMNS)}"
            )
        for n, row in enumerate(reader, start=2):
            where = f"price file {path} line {n}"
            od = _money(row["on_demand_usd_per_hour"], where)
            spot = _money(row.get("spot_usd_per_hour", ""), where)
            table.setdefault(row["instance_type"].strip(), {})[row["region"].strip()] = Price(
                on_demand=od,
                spot=spot,
                as_of=(row.get("as_of") or "").strip() or "unknown",
                source=(row.get("source") or "").strip() or str(path),
                note=(row.get("note") or "").strip(),
            )
    return table
