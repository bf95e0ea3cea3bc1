"""Static checks on the project's own Python: undefined names, unused imports, syntax (ruff F, E9)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_pyflakes_clean():
    ruff = Path(sys.executable).parent / "ruff"
    r = subprocess.run([str(ruff), "check", "--select", "F,E9", "--output-format", "concise",
                        "selector", "constructs_lib", "stacks", "dl_launcher", "dl_core", "app.py", "scripts", "bench", "tests", "examples"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
