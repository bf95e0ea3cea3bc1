"""How old a dated figure is: prices move (spot by tens of percent in weeks), so every price the
selector shows carries its date and its age in days.

Ages are counted in day numbers (date.toordinal()'s) without importing datetime: every cold
`recommend` shows ages, and datetime cost it ~2 ms (issue 39 item 7). parse_as_of, for the few
callers that need a date object, imports it when called."""
from __future__ import annotations

import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time (a cold CLI start, issue 39 item 7)
    import datetime as dt
    from typing import Optional

_DAYS_BEFORE_MONTH = (0, 0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334)


def _leap(year: int) -> bool:
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def _ordinal(year: int, month: int, day: int) -> int:
    """date(year, month, day).toordinal(): 1 for 0001-01-01."""
    y = year - 1
    return y * 365 + y // 4 - y // 100 + y // 400 + _DAYS_BEFORE_MONTH[month] + (month > 2 and _leap(year)) + day


def _digits(text: str) -> bool:
    return text.isascii() and text.isdigit()


def day_number(as_of: str) -> Optional[int]:
    """The day of an as_of stamp as date.toordinal() counts: "2026-08-26", "2026-11-22T10:31Z" (live),
    "2024-12" (a month: its first day, so the age is never understated). None for "unknown",
    anything else, or a day that does not exist (2026-02-30: no date, not its month)."""
    text = (as_of or "").strip()
    year, month = text[:4], text[5:7]
    if text[4:5] != "-" or not (_digits(year) and _digits(month)) or not 1 <= int(month) <= 12 or int(year) < 1:
        return None
    y, m = int(year), int(month)
    if text[7:8] == "-":
        day = text[8:10]
        if not _digits(day) or len(day) != 2:
            return None
        days_in_month = (_DAYS_BEFORE_MONTH[m + 1] if m < 12 else 365) - _DAYS_BEFORE_MONTH[m] + (m == 2 and _leap(y))
        return _ordinal(y, m, int(day)) if 1 <= int(day) <= days_in_month else None
    return _ordinal(y, m, 1)


def parse_as_of(as_of: str) -> Optional[dt.date]:
    """day_number as a date (None where it is None)."""
    n = day_number(as_of)
    if n is None:
        return None
    import datetime
    return datetime.date.fromordinal(n)


def _today() -> int:
    t = time.localtime()
    return _ordinal(t.tm_year, t.tm_mon, t.tm_mday)


def age_days(as_of: str, today: Optional[dt.date] = None) -> Optional[int]:
    day = day_number(as_of)
    if day is None:
        return None
    return max(0, (today.toordinal() if today is not None else _today()) - day)


def describe(as_of: str, today: Optional[dt.date] = None) -> str:
    """'as of 2026-08-26, 88 days old' / 'date unknown'."""
    days = age_days(as_of, today)
    if days is None:
        return "date unknown"
    return f"as of {as_of}, {'today' if days == 0 else f'{days} day' + ('s' if days != 1 else '') + ' old'}"
