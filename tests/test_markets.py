"""The market names are spelled once (dl_core/markets.py): a module that lists them itself (a
tuple, list or set of two or more) would drift from the others the day a market is added."""
from __future__ import annotations

import ast
from pathlib import Path

from dl_core import markets

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("dl_core", "dl_selector", "dl_stacks", "dl_launcher", "constructs_lib")


def test_market_names_are_listed_only_in_dl_core_markets():
    names = set(markets.MARKETS)
    found = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if path == ROOT / "dl_core" / "markets.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                    spelled = {e.value for e in node.elts if isinstance(e, ast.Constant)} & names
                    if len(spelled) >= 2:
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, f"market names listed outside dl_core/markets.py: {found}"


def test_the_spellings_users_type():
    assert markets.MARKETS == ("spot", "on-demand", "capacity-block")
    assert markets.OPEN_MARKETS == ("spot", "on-demand")
