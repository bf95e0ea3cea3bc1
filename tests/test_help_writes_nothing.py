"""`--help` says what a command does and does nothing (issue 26, item 5: `build_catalog.py --help`
rebuilt the catalog, and five benchmark scripts ran their benchmark). Every script under scripts/
and bench/ that runs as a program, and every CLI, from the repository root, where a careless
write would land in the source tree."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PROGRAMS = sorted(p for p in [*(ROOT / "scripts").glob("*.py"), *(ROOT / "bench").glob("*.py")]
                  if '__name__ == "__main__"' in p.read_text() and p.name != "minimal_app.py")  # a CDK app, no CLI
MODULES = [
    ["-m", "dl_selector"], ["-m", "dl_selector", "recommend"], ["-m", "dl_selector", "bench", "plan"],
    ["-m", "dl_selector", "catalog", "refresh"], ["-m", "constructs_lib.fleet"], ["-m", "constructs_lib.runtime"],
]


def tree() -> dict[str, tuple[int, int]]:
    """Every file git would show (tracked, or untracked and not ignored): size and mtime."""
    names = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    found = {}
    for name in filter(None, names):
        st = os.stat(ROOT / name) if (ROOT / name).exists() else None
        found[name] = (st.st_size, st.st_mtime_ns) if st else (-1, -1)
    return found


@pytest.mark.parametrize("argv", [[str(p.relative_to(ROOT))] for p in PROGRAMS] + MODULES + [["dl-launcher"]],
                         ids=lambda a: " ".join(a))
def test_help_prints_usage_and_writes_nothing(argv):
    assert PROGRAMS, "no scripts found"
    cmd = [str(BIN / "dl-launcher")] if argv == ["dl-launcher"] else [sys.executable, *argv]
    before = tree()
    out = subprocess.run([*cmd, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage:"), out.stdout[:500]
    after = tree()
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    assert not changed, f"--help wrote {sorted(changed)}"
