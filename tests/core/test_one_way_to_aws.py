"""One way to talk to AWS (issue 36): an AWS error's code is read by dl_core.aws.error_code (or
not_found / transient), and retries wait by dl_core.aws.Backoff (full jitter), never by hand. A
scan of the project's code: a hand-dug `e.response["Error"]["Code"]` / `.get("Error", ...)` or an
exponential `2 ** n` wait in a function that sleeps fails here, naming the file and line."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("dl_selector", "constructs_lib", "dl_stacks", "dl_launcher", "bench", "scripts", "examples", "app.py")
# dl_core is where it is done; the lead converts these two (issue 36, the supervisor's split).
EXEMPT = {"dl_core/aws.py"}


def _sources() -> list[Path]:
    out = []
    for name in PACKAGES:
        path = ROOT / name
        out += [path] if path.is_file() else sorted(path.rglob("*.py"))
    return [p for p in out if p.relative_to(ROOT).as_posix() not in EXEMPT and "node_modules" not in p.parts]


def _is_error_key(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value == "Error"


def hand_dug(tree: ast.AST) -> list[int]:
    """Lines that read an AWS error's "Error" member themselves (building one, as a fake does, is fine)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and _is_error_key(node.slice):
            lines.append(node.lineno)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and node.args and _is_error_key(node.args[0])):
            lines.append(node.lineno)
    return lines


def _sleeps(fn: ast.AST) -> bool:
    for node in ast.walk(fn):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in ("sleep", "wait", "_sleep"):
                return True
    return False


def hand_backoff(tree: ast.AST) -> list[int]:
    """Lines of `2 ** <something that changes>` inside a function that sleeps or waits: a backoff by
    hand (a constant such as 2 ** 20, or a power of two that sizes a model, is not one)."""
    lines = []
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and _sleeps(fn):
            for node in ast.walk(fn):
                if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow) and isinstance(node.left, ast.Constant)
                        and node.left.value == 2 and not isinstance(node.right, ast.Constant)):
                    lines.append(node.lineno)
    return lines


def _found(check) -> list[str]:
    out = []
    for path in _sources():
        tree = ast.parse(path.read_text(), str(path))
        out += [f"{path.relative_to(ROOT)}:{line}" for line in sorted(set(check(tree)))]
    return out


def test_no_aws_error_code_is_dug_out_by_hand():
    assert _found(hand_dug) == [], "use dl_core.aws.error_code / not_found / transient"


def test_no_backoff_is_written_by_hand():
    assert _found(hand_backoff) == [], "use dl_core.aws.Backoff (full jitter) or dl_core.aws.retry"


def test_the_scan_finds_what_it_is_for():
    """The scan itself, on the forms it replaced (so an empty answer above means something)."""
    dug = ast.parse('def f(e):\n    a = e.response["Error"]["Code"]\n'
                    '    b = getattr(e, "response", {}).get("Error", {}).get("Code", "")\n'
                    '    fake = {"Error": {"Code": "SlowDown"}}\n')
    assert hand_dug(dug) == [2, 3]
    loop = ast.parse("def f(n):\n    for i in range(n):\n        time.sleep(min(30, base * 2 ** (i - 1)))\n"
                     "def g(i):\n    return 64 * 2 ** i\n"
                     "def h():\n    time.sleep(1)\n    return 2 ** 20\n")
    assert hand_backoff(loop) == [3]
