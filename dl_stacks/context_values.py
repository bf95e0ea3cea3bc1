"""Reading one context value: shown escaped in an error, a look-alike folded to what it meant, a
boolean, a number, a whole number in a range, one of a few names. Every settings module of the
app (settings, observability, approval, bench, portfolio) parses with these, so each mistake
reads the same way: one line, what is allowed, the closest valid value.
"""
from __future__ import annotations

import json
import math
import re
import unicodedata
from typing import Any, Optional

from dl_selector.errors import UserError, closest
from dl_selector.validate import plain_number

TRUE, FALSE = frozenset({"true", "1", "yes", "on"}), frozenset({"false", "0", "no", "off"})
# Look-alikes a copy from a document or chat brings in; NFKC handles full-width forms and the like.
LOOKALIKES = str.maketrans({
    "\u2010": "-", "\u2011": "-", "\u2012": "-", "\u2013": "-", "\u2014": "-", "\u2015": "-", "\u2212": "-",
    "\u00a0": " ", "\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u00ad": "",
    "\u200b": "", "\u200c": "", "\u200d": "", "\ufeff": "",
    "\u0430": "a", "\u0435": "e", "\u043e": "o", "\u0440": "p", "\u0441": "c", "\u0443": "y", "\u0445": "x",
    "\u0456": "i", "\u0455": "s", "\u0458": "j", "\u0501": "d", "\u043a": "k", "\u0442": "t", "\u043d": "h",
    "\u03bf": "o", "\u03b1": "a", "\u03bd": "v", "\u03c1": "p", "\u03b9": "i", "\u03ba": "k", "\u0391": "A",
    "\u0410": "A", "\u0415": "E", "\u041e": "O", "\u0420": "P", "\u0421": "C", "\u0422": "T", "\u0425": "X",
})


def show(value: Any, limit: int = 60) -> str:
    """A value as an error message may quote it: ASCII escapes for control and non-ASCII
    characters (never raw), JSON for what cdk.json carries, cut short with its length."""
    if isinstance(value, str):
        if len(value) > limit:
            return f"{ascii(value[:limit - 20])}... ({len(value)} characters)"
        return ascii(value)
    try:
        text = json.dumps(value, ensure_ascii=True, allow_nan=True)
    except (TypeError, ValueError):
        text = ascii(value)
    return text if len(text) <= limit else text[:limit - 20] + f"... ({len(text)} characters)"


def json_kind(value: Any) -> str:
    """What cdk.json gave, in the words of an error: 'a JSON list', 'JSON null'."""
    if value is None:
        return "JSON null"
    if isinstance(value, bool):
        return f"JSON {str(value).lower()}"
    if isinstance(value, (int, float)):
        return "a JSON number"
    if isinstance(value, (list, tuple)):
        return "a JSON list"
    if isinstance(value, dict):
        return "a JSON object"
    return type(value).__name__


def fold(value: str) -> str:
    """The plain-ASCII text a look-alike most likely meant."""
    folded = unicodedata.normalize("NFKC", value).translate(LOOKALIKES)
    return "".join(c for c in folded if c.isascii())


def named(key: str, value: str, allowed) -> None:
    """Names are case-sensitive and lower-case: say so, with the name meant, instead of a guess."""
    if value in allowed:
        return
    lowered = {a.lower(): a for a in allowed}
    if value.lower() in lowered:
        raise UserError(f"context {key}={show(value)}: names are case-sensitive"
                        f"{' and lower-case' if lowered[value.lower()].islower() else ''}; "
                        f"closest: {lowered[value.lower()]}")


def boolean(key: str, value: Any) -> bool:
    """true/false, also 1/0, yes/no, on/off (any case); anything else is an error with the closest."""
    if isinstance(value, bool):
        return value
    v = str(value).strip().lower()
    if v in TRUE | FALSE:
        return v in TRUE
    near = closest(v, sorted(TRUE | FALSE), n=1) if v else []
    raise UserError(f"context {key}={show(value)}: expected true or false"
                    + (f"; closest: {'true' if near[0] in TRUE else 'false'}" if near else ""))


def number(value: Any) -> Optional[float]:
    """A JSON number or a plain decimal string as a float (inf and nan too, for the caller to refuse
    with its own range), or None: dl_selector.validate.plain_number."""
    return plain_number(value)


def whole(key: str, value: Any, lo: int, hi: int) -> int:
    """A whole number from lo to hi; a fraction or one out of range names the closest allowed."""
    x = number(value)
    shown = value if isinstance(value, (int, float)) and not isinstance(value, bool) else show(value)
    if x is None:
        near = fold(str(value)).strip()
        near = near if re.fullmatch(r"[0-9]+", near) and lo <= int(near) <= hi else None
        raise UserError(f"context {key}={show(value)}: expected a whole number from {lo} to {hi}"
                        + (f"; closest: {near}" if near else ""))
    if not math.isfinite(x):
        raise UserError(f"context {key}={show(value)}: not a finite number; expected a whole number from {lo} to {hi}")
    n = round(x)
    if x != n:
        raise UserError(f"context {key}={shown}: expected a whole number from {lo} to {hi}; "
                        f"closest: {min(max(math.floor(x + 0.5), lo), hi)}")
    if not lo <= n <= hi:
        where = f"{shown} ({n})" if isinstance(value, str) and value.strip() != str(n) else str(n)
        raise UserError(f"context {key}={where}: allowed {lo} to {hi}; closest: {min(max(n, lo), hi)}")
    return int(n)


def choice(key: str, value: Any, allowed: tuple[str, ...]) -> str:
    """One of `allowed`, exactly; a prefix or a near miss names the closest."""
    v = str(value).strip()
    named(key, v, allowed)
    if v not in allowed:
        near = [a for a in allowed if v and a.startswith(v)] or closest(v, allowed, n=1)  # "same-acc"
        raise UserError(f"context {key}={show(value)}: allowed {', '.join(allowed)}"
                        + (f"; closest: {near[0]}" if near else ""))
    return v
