"""The dl-bench line: one per timed window, anywhere in a program's output,

    dl-bench samples_per_second=1234.5 window=2 samples=4096 seconds=3.318 model=resnet50

`dl-bench` first, then `key=value` tokens separated by spaces; `samples_per_second` is required
(finite, > 0), `window`, `samples` and `seconds` are optional numbers, anything else is a label
(no spaces in a value). Any program that prints it can be benchmarked and monitored.

One source for everything that reads or writes the line: the reference benchmark and `bench
collect` (dl_selector/bench) and the node monitor (constructs_lib/runtime/monitor.py). Standard
library only, here in dl_core, because the node bundle ships dl_core whole and nothing of the
selector.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Optional

LINE_TAG = "dl-bench"
_KEY = re.compile(r"[a-z_][a-z0-9_]*\Z")
_NUMBERS = ("samples_per_second", "samples", "seconds")


class LineError(ValueError):
    """A line that starts with the tag but does not follow the format (the collector says which)."""


@dataclass(frozen=True)
class Window:
    samples_per_second: float
    window: Optional[int] = None
    samples: Optional[float] = None
    seconds: Optional[float] = None
    labels: dict = field(default_factory=dict)


def format_line(samples_per_second: float, **fields: Any) -> str:
    """`dl-bench samples_per_second=... k=v ...` (fields in the order given; None left out)."""
    parts = [LINE_TAG, f"samples_per_second={samples_per_second:.6g}"]
    for key, value in fields.items():
        if value is None:
            continue
        if not _KEY.match(key):
            raise ValueError(f"dl-bench key {key!r}: lower-case letters, digits and _ only")
        text = f"{value:.6g}" if isinstance(value, float) else str(value)
        if not text or any(c.isspace() for c in text):
            raise ValueError(f"dl-bench {key}={text!r}: a value is one word")
        parts.append(f"{key}={text}")
    return " ".join(parts)


def parse_line(line: str) -> Optional[Window]:
    """The window a line reports, None for any other line, LineError for a broken dl-bench line."""
    tokens = line.strip().split()
    if not tokens or tokens[0] != LINE_TAG:
        return None
    values: dict[str, str] = {}
    for token in tokens[1:]:
        key, eq, value = token.partition("=")
        if not eq or not _KEY.match(key) or not value:
            raise LineError(f"token {token[:60]!r} is not key=value")
        if key in values:
            raise LineError(f"{key} given twice")
        values[key] = value
    if "samples_per_second" not in values:
        raise LineError("no samples_per_second=")
    numbers: dict[str, float] = {}
    for key in _NUMBERS:
        if key in values:
            try:
                numbers[key] = float(values.pop(key))
            except ValueError:
                raise LineError(f"{key} is not a number") from None
            if not math.isfinite(numbers[key]) or numbers[key] <= 0:
                raise LineError(f"{key} must be finite and above 0, got {numbers[key]:g}")
    window = None
    if "window" in values:
        raw = values.pop("window")
        if not raw.isdigit():
            raise LineError(f"window must be a whole number, got {raw[:20]!r}")
        window = int(raw)
    return Window(samples_per_second=numbers["samples_per_second"], window=window,
                  samples=numbers.get("samples"), seconds=numbers.get("seconds"), labels=values)


def parse_output(text: str) -> tuple[list[Window], list[str]]:
    """Every window in a program's output, and one problem per broken dl-bench line."""
    windows, problems = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        try:
            w = parse_line(line)
        except LineError as e:
            problems.append(f"line {number}: {e}")
            continue
        if w is not None:
            windows.append(w)
    return windows, problems
