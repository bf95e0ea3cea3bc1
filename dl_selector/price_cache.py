"""The live-price cache and its clock: one JSON file per region under cache_dir() with the time
each part was fetched, replaced atomically; a part younger than the caller's max age is used
without calling AWS. A damaged or foreign file is one warning line and is ignored.
"""
from __future__ import annotations

import datetime as dt
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Callable, Optional

Log = Callable[[str], None]

CACHE_FORMAT = "dl-launcher live prices"
CACHE_VERSION = 1


def to_stderr(msg: str) -> None:
    print(msg, file=sys.stderr)


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def iso_minute(t: dt.datetime) -> str:
    """The as-of form shown to users: 2026-11-22T10:31Z."""
    return t.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%MZ")


def iso_second(t: dt.datetime) -> str:
    return t.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: Any) -> dt.datetime:
    if isinstance(value, dt.datetime):
        t = value
    else:
        t = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)


def cache_dir() -> Path:
    """$DL_LAUNCHER_CACHE, else $XDG_CACHE_HOME/dl-launcher/prices, else ~/.cache/dl-launcher/prices."""
    own = os.environ.get("DL_LAUNCHER_CACHE")
    if own:
        return Path(own)
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"  # the XDG spec ignores a relative one
    return base / "dl-launcher" / "prices"


def cache_path(region: str) -> Path:
    return cache_dir() / f"{region}.json"


def _check_cache(data: Any, region: str) -> dict[str, Any]:
    """The cache file's content, or ValueError saying what is wrong with it."""
    if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT:
        raise ValueError("not a dl-launcher price cache")
    if data.get("version") != CACHE_VERSION:
        raise ValueError(f"cache version {data.get('version')!r}, this dl-launcher writes {CACHE_VERSION}")
    if data.get("region") != region:
        raise ValueError(f"holds prices for {data.get('region')!r}, not {region}")
    spot, od = data.get("spot"), data.get("on_demand")
    for part in (spot, od):
        if part is not None:
            if not isinstance(part, dict):
                raise ValueError("a part is not an object")
            parse_time(part.get("fetched_at"))
    if spot is not None:
        if not isinstance(spot.get("types"), list) or not isinstance(spot.get("quotes"), dict):
            raise ValueError("spot has no types or quotes")
        for name, by_az in spot["quotes"].items():
            for az, q in by_az.items():
                if not (isinstance(q, list) and len(q) == 2 and _number(q[0]) and isinstance(q[1], str)):
                    raise ValueError(f"bad spot quote for {name} in {az}")
    if od is not None:
        if not isinstance(od.get("prices"), dict) or not all(_number(v) for v in od["prices"].values()):
            raise ValueError("on_demand prices are not numbers")
        if not isinstance(od.get("unpriced", {}), dict) or not isinstance(od.get("publication", ""), str):
            raise ValueError("bad on_demand fields")
    return data


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def load_cache(region: str, log: Log = to_stderr) -> dict[str, Any]:
    """The cached parts for `region` ({} when none). A file that cannot be read or is not a price
    cache is ignored with a warning: it is refetched and overwritten, never a traceback."""
    path = cache_path(region)
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return {}  # no cache yet (a bad folder is reported when writing)
    except (OSError, UnicodeDecodeError) as e:
        log(f"warning: ignoring price cache {path}: {getattr(e, 'strerror', None) or e}; fetching afresh")
        return {}
    try:
        return _check_cache(json.loads(text), region)
    except (ValueError, TypeError, AttributeError) as e:
        log(f"warning: ignoring price cache {path}: {str(e)[:160]}; fetching afresh")
        return {}


def save_cache(region: str, data: dict[str, Any], log: Log = to_stderr) -> None:
    """Write all or nothing: a temporary file in the same folder, renamed over the old one."""
    import tempfile

    path = cache_path(region)
    tmp = None
    try:
        text = json.dumps(data, indent=1, sort_keys=True, allow_nan=False) + "\n"
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{region}-", suffix=".json", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
        tmp = None
    except (OSError, ValueError) as e:
        log(f"warning: could not write price cache {path}: {getattr(e, 'strerror', None) or e}")
    finally:
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)


def fresh(part: Optional[dict[str, Any]], now: dt.datetime, max_age: dt.timedelta) -> bool:
    if not part:
        return False
    age = now - parse_time(part["fetched_at"])
    return dt.timedelta(minutes=-5) <= age <= max_age  # a stamp from the future is a clock problem: refetch
