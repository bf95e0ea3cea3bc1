"""Dependencies run one way. The graph is read from the source with ast (imports at module level
and inside functions alike: an import moved into a function still runs, it only hides a cycle),
so a cycle or a wrong-way import fails here before anyone trips over it at import time.

Rules: no cycle among the project's modules; dl_core imports nothing of the project; node code
(constructs_lib/runtime) and the controller's Lambda (constructs_lib/fleet) import nothing from
dl_selector/, since neither ships it. Imports under `if TYPE_CHECKING:` never run and are left out.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("dl_core", "dl_selector", "dl_stacks", "dl_launcher", "constructs_lib")
NO_SELECTOR = ("constructs_lib.runtime", "constructs_lib.fleet")


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(f.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join(parts)] = f
    return mods


def _type_checking_only(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    found, todo = [], [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            if not _type_checking_only(child):
                todo.append(child)
            else:
                todo.extend(child.orelse)
    return found


def graph(mods: dict[str, Path] | None = None) -> dict[str, dict[str, int]]:
    """module -> {imported project module: line}. `from pkg import name` counts as importing
    pkg.name where that is a module, else pkg itself."""
    mods = _modules() if mods is None else mods

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, dict[str, int]] = {}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        out: dict[str, int] = {}
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up) + (f".{node.module}" if node.module else "")
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for target in targets:
                hit = resolve(target)
                if hit and hit != mod:
                    out.setdefault(hit, node.lineno)
        edges[mod] = out
    return edges


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def _explain(edges: dict[str, dict[str, int]], comp: list[str]) -> str:
    inside = [f"{a} -> {b} (line {line})" for a in comp for b, line in sorted(edges[a].items()) if b in comp]
    return "; ".join(inside)


def test_no_import_cycle_among_the_projects_modules():
    edges = graph()
    found = cycles(edges)
    assert not found, "import cycles: " + " | ".join(_explain(edges, c) for c in found)


def test_dl_core_imports_nothing_of_the_project():
    edges = graph()
    wrong = [f"{m} -> {t} (line {line})" for m, out in edges.items() if m.split(".")[0] == "dl_core"
             for t, line in out.items() if t.split(".")[0] != "dl_core"]
    assert not wrong, wrong


def test_node_and_lambda_code_import_nothing_from_the_selector():
    edges = graph()
    wrong = [f"{m} -> {t} (line {line})" for m, out in edges.items() if m.startswith(NO_SELECTOR)
             for t, line in out.items() if t.split(".")[0] == "dl_selector"]
    assert not wrong, wrong


def test_the_graph_sees_imports_inside_functions_and_skips_type_checking(tmp_path):
    """The checker itself, on a made-up package: a cycle closed by a function-level import is
    found; one that exists only for the type checker is not."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from .a import x\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import y\n")
    (pkg / "d.py").write_text("from pkg.c import z\n")
    mods = {"pkg": pkg / "__init__.py", **{f"pkg.{n}": pkg / f"{n}.py" for n in "abcd"}}
    edges = graph(mods)
    assert cycles(edges) == [["pkg.a", "pkg.b"]]
    assert edges["pkg.c"] == {} and edges["pkg.d"] == {"pkg.c": 1}
