"""The selector's CLI run in-process, as the selector tests call it."""
from __future__ import annotations


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `python -m dl_selector ARGV...`, run in this process."""
    from dl_selector.cli import main  # at call time: a test may have patched what the CLI imports

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err
