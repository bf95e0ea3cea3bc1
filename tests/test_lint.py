"""Static checks on the project's own Python: undefined names, unused imports, syntax (ruff F, E9)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_pyflakes_clean():
    ruff = Path(sys.executable).parent / "ruff"
    r = subprocess.run([str(ruff), "check", "--select", "F,E9", "--output-format", "concise",
                        "dl_selector", "constructs_lib", "dl_stacks", "dl_launcher", "dl_core", "app.py", "scripts", "bench", "tests", "examples"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


# The node's control code and the controller's Lambda in rooms a newcomer can find (issue 36): a
# module past this size holds more than one thing, a function past this length more than one step.
ROOM_LINES, FUNCTION_LINES = 380, 60
ROOMS = ("constructs_lib/runtime", "constructs_lib/fleet", "dl_core")


def test_node_and_lambda_modules_stay_small_and_their_functions_short():
    import ast
    big = []
    for room in ROOMS:
        for path in sorted((ROOT / room).glob("*.py")):
            text = path.read_text()
            rel = path.relative_to(ROOT)
            if len(text.splitlines()) > ROOM_LINES:
                big.append(f"{rel}: {len(text.splitlines())} lines")
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    length = node.end_lineno - node.lineno + 1
                    if length > FUNCTION_LINES:
                        big.append(f"{rel}:{node.lineno} {node.name}: {length} lines")
    assert not big, "split by what changes together:\n" + "\n".join(big)
