"""The package's public names (issue 26): every name in `__all__` loads, type checkers see the same
names statically (the TYPE_CHECKING imports), dir() lists them, and importing the package or its
node runtime loads no aws_cdk (the node has none)."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import constructs_lib

ROOT = Path(__file__).resolve().parents[2]


def test_every_exported_name_loads_and_is_listed():
    for name in constructs_lib.__all__:
        assert getattr(constructs_lib, name) is not None, name
    assert set(constructs_lib.__all__) <= set(dir(constructs_lib))


def test_type_checkers_see_exactly_the_exported_names():
    tree = ast.parse((ROOT / "constructs_lib" / "__init__.py").read_text())
    static = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom)
                static |= {a.asname or a.name for a in imp.names}
                for a in imp.names:  # each from the module the lazy table names
                    assert constructs_lib._EXPORTS[a.name] == "." + imp.module, a.name
    assert static == set(constructs_lib.__all__)


def test_the_package_and_the_node_runtime_import_no_aws_cdk():
    code = ("import sys, constructs_lib, constructs_lib.runtime.supervisor, constructs_lib.runtime.cluster; "
            "print('aws_cdk' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_py_typed_ships_with_each_package():
    for pkg in ("dl_selector", "constructs_lib", "dl_launcher", "dl_core", "dl_stacks"):
        assert (ROOT / pkg / "py.typed").exists(), pkg
    text = (ROOT / "pyproject.toml").read_text()
    assert text.count('"py.typed"') == 5
