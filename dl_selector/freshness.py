"""How old a dated figure is: prices move (spot by tens of percent in weeks), so every price the
selector shows carries its date and its age in days."""
from __future__ import annotations

import datetime as dt
TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time (a cold CLI start, issue 39 item 7)
    from typing import Optional


def parse_as_of(as_of: str) -> Optional[dt.date]:
    """The date of an as_of stamp: "2026-08-26", "2026-11-22T10:31Z" (live), "2024-12" (a month: its
    first day, so the age is never understated). None for "unknown" or anything else."""
    text = (as_of or "").strip()
    # Not strptime: it imports _strptime, calendar and locale on every CLI start that shows a price.
    try:
        return dt.date.fromisoformat(text[:10])
    except ValueError:
        if text[7:8] == "-":
            return None  # a day that does not exist (2026-02-30) is no date, not its month
    year, dash, month = text[:7].partition("-")
    if dash and len(year) == 4 and len(month) == 2 and year.isdigit() and month.isdigit() and year.isascii() \
            and month.isascii() and 1 <= int(month) <= 12:
        return dt.date(int(year), int(month), 1)
    return None


def age_days(as_of: str, today: Optional[dt.date] = None) -> Optional[int]:
    day = parse_as_of(as_of)
    if day is None:
        return None
    return max(0, ((today or dt.date.today()) - day).days)


def describe(as_of: str, today: Optional[dt.date] = None) -> str:
    """'as of 2026-08-26, 88 days old' / 'date unknown'."""
    days = age_days(as_of, today)
    if days is None:
        return "date unknown"
    return f"as of {as_of}, {'today' if days == 0 else f'{days} day' + ('s' if days != 1 else '') + ' old'}"
