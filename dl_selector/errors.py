"""User-facing errors: one line that says what was wrong, what is allowed and the closest match."""
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time (a cold CLI start, issue 39 item 7)
    from typing import Iterable


class UserError(Exception):
    """A mistake in what the user asked for. The CLI prints it as one line and exits 2."""


def closest(name: str, choices: Iterable[str], n: int = 3) -> list[str]:
    import difflib  # only on a mistake: the CLI's start is measured (BENCHMARKS.md)

    choices = [str(c) for c in choices]
    name = str(name)
    # Names are case-sensitive (AWS spells regions, types and families in lower case); a
    # case-only miss such as US-EAST-1 gets its exact spelling first, which difflib would miss.
    folded = [c for c in choices if c.lower() == name.lower()]
    found = folded + [c for c in difflib.get_close_matches(name, choices, n=n, cutoff=0.5) if c not in folded]
    found = found[:n]
    if not found:
        # Prefix matches catch "p5" -> "p5.48xlarge" where the ratio is too low.
        found = [c for c in choices if c.startswith(name)][:n]
    return found


def unknown(kind: str, name: str, choices: Iterable[str], show_all_up_to: int = 40,
            hint: str = "") -> UserError:
    """'unknown profile 'multi-node'; closest: multi-node-training; allowed: ...'"""
    choices = sorted(str(c) for c in choices)
    near = closest(name, choices)
    parts = [f"unknown {kind} {name!r}"]
    if near:
        parts.append("closest: " + ", ".join(near))
    if len(choices) <= show_all_up_to:
        parts.append("allowed: " + ", ".join(choices))
    else:
        parts.append(f"{len(choices)} known" + (f" ({hint})" if hint else ""))
    return UserError("; ".join(parts))
