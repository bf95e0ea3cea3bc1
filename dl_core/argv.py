"""One-line argparse errors for every dl-launcher CLI (selector, the node runtime, the fleet).

argparse's own messages name neither the closest flag for a typo (`unrecognized arguments:
--topp 3`) nor the closest choice, and print a usage block. Here each mistake is one line with
what is allowed and the closest match. Standard library only: the node runtime and the
controller's Lambda package carry this file.
"""
from __future__ import annotations

import argparse
import re
TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time (a cold CLI start, issue 39 item 7)
    from typing import Optional

# Patterns, not compiled objects: re compiles (and caches) them on first use, which here is a
# mistake's path; five compiles at import cost every cold start of a CLI ~1 ms (issue 39 item 7).
_UNRECOGNIZED = r"(?s)unrecognized arguments: (?P<args>.*)"
_CHOICE = r"(?s)invalid choice: '(?P<value>.*)' \(choose from (?P<choices>.*)\)"


class _Formatter(argparse.HelpFormatter):
    """argparse's formatter, sized from os.get_terminal_size: the stock one imports shutil (and
    with it bz2, lzma and zlib) on every parser built, help or not."""

    def __init__(self, prog: str, **kwargs) -> None:
        if kwargs.get("width") is None:
            import os
            try:
                kwargs["width"] = int(os.environ.get("COLUMNS", "")) - 2
            except ValueError:
                try:
                    kwargs["width"] = os.get_terminal_size().columns - 2
                except OSError:
                    kwargs["width"] = 78
        super().__init__(prog, **kwargs)


class _RawFormatter(argparse.RawDescriptionHelpFormatter, _Formatter):
    pass


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose error() raises `error_class` (each CLI's own user-error type, which
    its main prints as one line and exit 2) instead of printing usage and exiting."""

    error_class: type[Exception] = ValueError
    # The parser that parsed last: a subcommand's, once argparse has handed it the rest of argv.
    # Unrecognized arguments are reported by the top parser, but the flags a typo was meant for
    # are the subcommand's.
    _active: Optional["OneLineParser"] = None

    def __init__(self, *args, **kwargs) -> None:
        raw = kwargs.get("formatter_class") is argparse.RawDescriptionHelpFormatter
        kwargs["formatter_class"] = _RawFormatter if raw else kwargs.get("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        OneLineParser._active = self
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> None:  # type: ignore[override]
        active = OneLineParser._active or self
        if not re.match(_UNRECOGNIZED, message):
            active = self
        raise self.error_class(f"{active.prog}: {explain(active, message)} (see --help)")


def flags(parser: argparse.ArgumentParser) -> list[str]:
    """The long flags `parser` takes (--help aside), in the order it declares them."""
    return [s for a in parser._actions for s in a.option_strings if s.startswith("--") and s != "--help"]


def explain(parser: argparse.ArgumentParser, message: str) -> str:
    """argparse's `message` with the closest flag or choice, and what is allowed."""
    import difflib  # only on a mistake: every CLI start builds a parser

    m = re.match(_UNRECOGNIZED, message)
    if m:
        first = m.group("args").split()[0] if m.group("args").split() else ""
        known = flags(parser)
        if first.startswith("-"):
            near = difflib.get_close_matches(first.split("=", 1)[0], known, n=1, cutoff=0.6)
            return (f"{message}; " + (f"closest: {near[0]}; " if near else "")
                    + ("flags: " + ", ".join(known) if known else "this command takes no flags"))
        return f"{message}; this command takes no further values" + (f" (flags: {', '.join(known)})" if known else "")
    m = re.search(_CHOICE, message)
    if m:
        choices = re.findall(r"'([^']*)'", m.group("choices"))
        near = difflib.get_close_matches(m.group("value"), choices, n=1, cutoff=0.5)
        if near:
            return f"{message}; closest: {near[0]}"
    return message
