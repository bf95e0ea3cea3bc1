"""The job's secret values, kept out of what the supervisor writes to S3 (issue 35, item 6).

A failed setup's or command's last lines go into failed.json, and a node's health into its join
records: versioned, retained, readable by every node and by `dl-launcher status`. A job that
prints a secret (a `set -x`, an error that echoes a token) would leave it there. The values read
for this job (job_secrets.read_secrets) are remembered in memory only and replaced by MASK in every
record before it is written.

What is searched for: each value whole; each of its lines (a PEM key is printed line by line);
each string inside a JSON object value (a Secrets Manager secret of keys and values); and, at the
end of a text, the start of a value (a line cut at its width limit in the middle of a secret).
Pieces shorter than MIN characters are not searched for: they would blot out ordinary words and
are no secret on their own.
"""
from __future__ import annotations

import json
from typing import Any, Iterable

MASK = "[redacted]"
MIN = 6


class Redactor:
    def __init__(self) -> None:
        self._pieces: list[str] = []  # longest first, so a value is masked before its parts

    def add(self, values: Iterable[str]) -> None:
        found = set(self._pieces)
        for v in values:
            if not isinstance(v, str):
                continue
            found.add(v)
            found.update(line.strip() for line in v.splitlines())
            found.update(_json_strings(v))
        self._pieces = sorted((p for p in found if len(p) >= MIN), key=len, reverse=True)

    def __bool__(self) -> bool:
        return bool(self._pieces)

    def text(self, s: str) -> str:
        for p in self._pieces:
            s = s.replace(p, MASK)
        for p in self._pieces:  # a value cut off at the end: at least MIN of its first characters
            for k in range(min(len(p) - 1, len(s)), MIN - 1, -1):
                if s.endswith(p[:k]):
                    return s[:-k] + MASK
        return s

    def scrub(self, obj: Any) -> Any:
        """`obj` (a record about to be written) with every text in it masked; keys are the code's own."""
        if not self._pieces:
            return obj
        if isinstance(obj, str):
            return self.text(obj)
        if isinstance(obj, list):
            return [self.scrub(x) for x in obj]
        if isinstance(obj, dict):
            return {k: self.scrub(v) for k, v in obj.items()}
        return obj


def _json_strings(v: str) -> list[str]:
    try:
        d = json.loads(v)
    except (ValueError, RecursionError):
        return []
    out: list[str] = []
    stack = [d]
    while stack:
        x = stack.pop()
        if isinstance(x, str):
            out.append(x)
        elif isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
        elif isinstance(x, (int, float)) and not isinstance(x, bool):
            out.append(json.dumps(x))
    return out
