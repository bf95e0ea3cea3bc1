"""Checks shared by every place the selector reads a number or a file the user gave it.

Each failure is a UserError: one line that says what was wrong, what is allowed and, where one
exists, the closest valid value. Standard library only (the CLI must stay fast to start).
"""
from __future__ import annotations

import io
import json
import math
import os
import re
TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time (a cold CLI start, issue 39 item 7)
    import datetime as _dt
    from typing import Any, Optional

from .errors import UserError
from .freshness import parse_as_of


def clean(text: str) -> str:
    """`text` with every control or otherwise unprintable character escaped repr-style.

    Names and descriptions come from user files; an ESC, CR or BEL echoed raw would recolour,
    overwrite or beep the user's terminal, and a newline would split a one-line error."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


# A plain decimal as a person writes it. Python's float() alone also takes '1_000', ' 12 ',
# full-width digits and 'nan'.
PLAIN_NUMBER = r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"  # re compiles it on first use


def plain_number(value: Any) -> Optional[float]:
    """A JSON number or a plain decimal string as a float (inf and nan included, for the caller to
    refuse with its own range), or None for anything else."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    v = str(value).strip()
    if re.fullmatch(PLAIN_NUMBER, v):
        return float(v)
    if v.lower().lstrip("+-") in ("nan", "inf", "infinity"):
        return float(v)
    return None


def finite_number(value: Any, what: str, lo: Optional[float] = None, hi: Optional[float] = None, *,
                  above: bool = False, integer: bool = False) -> float:
    """`value` (a number, or a string as read from CSV or the command line) as a float, or a UserError.

    Refuses booleans (JSON true is not 1), NaN and infinities (1e999 parses to inf), values below
    `lo` (or at `lo` when `above`) or above `hi`, and, with `integer`, fractions. The message names
    the range and, where there is one, the closest valid value."""
    allowed = range_text(lo, hi, above, integer)
    try:
        shown = clean(str(value).strip())[:80]
    except ValueError:  # an int past Python's 4300-digit str() limit
        shown = "a number of over 4300 digits"
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise UserError(f"{what} must be {allowed}, got {clean(repr(value))[:80]}")
    if isinstance(value, str) and not value.isascii():
        # float() takes Arabic-Indic, full-width and other Unicode digits; a file or flag that holds
        # them was not written as a plain number (and AWS would not take it either).
        near = "".join(str(int(c)) if c.isdigit() else c for c in value.strip() if c.isascii() or c.isdigit())
        raise UserError(f"{what} = {clean(repr(value))[:80]} has characters that are not plain ASCII; allowed: "
                        f"{allowed}, in ASCII digits" + (f"; closest: {near}" if near else ""))
    if isinstance(value, str) and plain_number(value) is None:
        near = value.strip().replace("_", "").replace(",", "")
        raise UserError(f"{what} = {clean(repr(value))[:80]} is not a number; allowed: {allowed}, in plain digits"
                        + (f"; closest: {near}" if plain_number(near) is not None else ""))
    try:
        v = float(value)
    except OverflowError:  # an integer too large for a float (JSON and YAML allow them)
        near = f"; closest: {_fmt(hi, integer)}" if hi is not None and value > 0 else ""
        raise UserError(f"{what} = {shown} is out of range; allowed: {allowed}{near}") from None
    except ValueError:
        raise UserError(f"{what} = {clean(repr(value))[:80]} is not a number; allowed: {allowed}") from None
    if not math.isfinite(v):
        # Only +inf (or 1e999) has a closest valid value: the top of the range.
        near = f"; closest: {_fmt(hi, integer)}" if hi is not None and v > 0 else ""
        raise UserError(f"{what} = {shown} is not a finite number; allowed: {allowed}{near}")
    if integer and not v.is_integer():
        near_int = max(round(v), math.ceil(lo)) if lo is not None else round(v)
        raise UserError(f"{what} = {shown} is not a whole number; allowed: {allowed}; closest: {near_int}")
    if lo is not None and (v < lo or (above and v <= lo)):
        # "above zero" has no closest value; "at least 1" does.
        near = "" if above else f"; closest: {_fmt(lo, integer)}"
        raise UserError(f"{what} must be {allowed}, got {shown}{near}")
    if hi is not None and v > hi:
        raise UserError(f"{what} must be {allowed}, got {shown}; closest: {_fmt(hi, integer)}")
    return v


def family_list(value: Optional[str]) -> Optional[list[str]]:
    """--families a,b as a list; an empty name ('', ',', 'p5,,g6') is refused, not read as 'all'."""
    if value is None:
        return None
    names = [f.strip() for f in value.split(",")]
    if not any(names):
        raise UserError("--families needs at least one family name, e.g. --families p5,g6 (leave it out for all)")
    if not all(names):
        raise UserError(f"--families {clean(value)!r} has an empty name; closest: {','.join(n for n in names if n)}")
    return names


def _fmt(v: float, integer: bool = False) -> str:
    return str(int(v)) if integer else f"{v:g}"


def range_text(lo: Optional[float], hi: Optional[float], above: bool, integer: bool) -> str:
    parts = []
    if lo is not None:
        parts.append("above zero" if above and lo == 0 else f"above {_fmt(lo)}" if above else f"at least {_fmt(lo, integer)}")
    if hi is not None:
        parts.append(f"at most {_fmt(hi, integer)}")
    text = " and ".join(parts) or "finite"
    return text + (" (a whole number)" if integer else "")


# The embedded catalog is ~0.2 MiB; no selector input comes near this.
MAX_FILE_BYTES = 64 << 20


# What the catalog, refresh and live prices write: a day, a month (published rates), a live quote's
# minute; "unknown" and a blank say there is no date.
_STAMP = r"(?a)\d{4}-\d{2}(-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?)?)?"
STAMP_FORMS = "YYYY-MM-DD, YYYY-MM, YYYY-MM-DDTHH:MMZ, 'unknown' or blank"


def date_stamp(value: Any, what: str, today: Optional[_dt.date] = None) -> str:
    """An as_of value, checked: a stamp that is no date would show as "date unknown" and age
    nothing, and one in the future would make a stale price look fresh."""
    if not isinstance(value, str):
        raise UserError(f"{what} must be a string ({STAMP_FORMS}), got {clean(repr(value))[:40]}")
    text = value.strip()
    if text in ("", "unknown"):
        return text
    day = parse_as_of(text) if re.fullmatch(_STAMP, text) else None
    if day is None:
        raise UserError(f"{what} = {clean(repr(value))[:60]} is not a date; allowed: {STAMP_FORMS}")
    import datetime as _dt  # here, not at every start (issue 39 item 7)
    latest = (today or _dt.date.today()) + _dt.timedelta(days=1)  # a day's slack for time zones
    if day > latest:
        raise UserError(f"{what} = {clean(repr(value))[:60]} is in the future; allowed: a date up to "
                        f"{latest.isoformat()}, or 'unknown'")
    return text


def read_text(path: str, what: str) -> str:
    """The UTF-8 text of the user's `what` file, or a UserError saying why it cannot be read.

    One place for missing paths, directories, unreadable files, empty files, binary data and
    other encodings, so that every loader refuses them in the same words."""
    shown = clean(str(path))
    if os.path.isdir(path):
        raise UserError(f"cannot read {what} file {shown}: it is a directory; pass a file")
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)  # bounded: /dev/zero or a disk image must not hang us
    except OSError as e:
        raise UserError(f"cannot read {what} file {shown}: {e.strerror or e}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise UserError(f"{what} file {shown} is larger than {MAX_FILE_BYTES >> 20} MiB; is it the right file?")
    if not raw.strip():
        raise UserError(f"{what} file {shown} is empty")
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise UserError(f"{what} file {shown} is UTF-16; save it as UTF-8")
    nul = raw.find(b"\x00")
    if nul >= 0:
        raise UserError(f"{what} file {shown} holds binary data (a NUL byte at offset {nul}); "
                        "expected UTF-8 text")
    try:
        return raw.decode("utf-8-sig")  # -sig: a BOM from Excel's "CSV UTF-8" is harmless
    except UnicodeDecodeError as e:
        raise UserError(f"{what} file {shown} is not UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start}); "
                        "save it as UTF-8") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed (numbers must be finite)")


class DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise DuplicateKey(clean(repr(k))[:80])
        out[k] = v
    return out


def parse_json(text: str, path: str, what: str) -> Any:
    """json.loads, with NaN/Infinity refused and every parse failure (deep nesting included) one line."""
    shown = clean(str(path))
    try:
        return json.loads(text, parse_constant=_no_constant, object_pairs_hook=_unique_keys)
    except DuplicateKey as e:
        raise UserError(f"{what} file {shown}: key {e} appears twice in one object (JSON keeps only the last "
                        "silently); keep one") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{what} file {shown}: not valid JSON (line {e.lineno}: {e.msg})") from None
    except RecursionError:
        raise UserError(f"{what} file {shown}: JSON nested too deeply to be a {what} file") from None
    except ValueError as e:  # NaN/Infinity, or an integer longer than Python will convert
        raise UserError(f"{what} file {shown}: not valid JSON ({clean(str(e))[:120]})") from None


def csv_rows(text: str, path: str, what: str, required: tuple[str, ...],
             optional: tuple[str, ...] = ()) -> list[tuple[int, dict[str, str]]]:
    """(line number, row) for each data row of a CSV that has every `required` column.

    Refuses rows with more cells than the header or that end before a required column (a
    truncated or shifted row would otherwise read as blanks or lose cells silently), and anything
    the csv module chokes on. Trailing optional cells may be left off: they read as ''."""
    import csv  # only where a CSV is read: the CLI's start is measured (BENCHMARKS.md)

    shown = clean(str(path))
    expected = ",".join(required) + (f" [,{','.join(optional)}]" if optional else "")
    # StringIO(newline=""), not splitlines(): a quoted cell may hold a newline, and splitlines
    # would also break rows at form feeds and other separators the csv module keeps in a cell.
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = [h.strip() for h in next(reader, [])]
        missing = [c for c in required if c not in header]
        if missing:
            raise UserError(f"{what} file {shown}: needs CSV columns {expected}; missing {', '.join(missing)}")
        dupes = sorted({h for h in header if header.count(h) > 1 and h})
        if dupes:
            raise UserError(f"{what} file {shown}: column {dupes[0]} appears twice")
        known = (*required, *optional)
        import difflib  # here: only a file's header needs it, and the CLI's start is measured
        for h in header:
            near = difflib.get_close_matches(h.lower(), known, n=1, cutoff=0.75) if h and h not in known else []
            if near:  # a misspelt optional column would otherwise be dropped without a word
                raise UserError(f"{what} file {shown}: column {clean(h)!r} is not one this file takes; closest: "
                                f"{near[0]}; columns: {expected}")
        rows: list[tuple[int, dict[str, str]]] = []
        for cells in reader:
            line = reader.line_num
            if not cells or not any(c.strip() for c in cells):
                continue  # blank lines are layout, not data
            if len(cells) > len(header):
                raise UserError(f"{what} file {shown} line {line}: {len(cells)} cells for {len(header)} columns "
                                f"({', '.join(header)}); remove the extra cells or quote a value with a comma")
            cut = [h for h in header[len(cells):] if h in required]
            if cut:  # trailing optional cells may be left off; a required one may not
                raise UserError(f"{what} file {shown} line {line}: row ends after {len(cells)} cell(s), "
                                f"missing {', '.join(cut)} (truncated?); expected {expected}")
            rows.append((line, dict(zip(header, cells + [""] * (len(header) - len(cells))))))
    except csv.Error as e:
        raise UserError(f"{what} file {shown}: not valid CSV ({clean(str(e))})") from None
    return rows
