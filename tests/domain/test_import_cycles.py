"""The import graph of benchwright/, api/, activities/ and workflows/ has no cycles (issue 24), read statically from
the modules' ASTs: every import a module can run, function-local ones included (a lazy import hides a cycle from
Python, not from the reader), ``if TYPE_CHECKING:`` blocks left out. The cycles left are listed below, each with why;
the list may only shrink.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("benchwright", "api", "activities", "workflows")

KNOWN_CYCLES: set[frozenset[str]] = set()
"""Import cycles not broken yet (each a strongly connected component, as module names). Shrink-only: remove an
entry when its cycle is gone (the test fails while a listed cycle no longer exists, so the list stays true)."""


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            if "migrations" in rel.parts:
                continue
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            found[".".join(parts)] = path
    return found


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import the module can run: top-level and function-local alike; ``if TYPE_CHECKING:`` bodies never run."""
    out: list[ast.Import | ast.ImportFrom] = []
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            out.append(node)
        elif isinstance(node, ast.If) and _type_checking(node.test):
            pending.extend(node.orelse)
        else:
            pending.extend(ast.iter_child_nodes(node))
    return out


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                           for alias in node.names]
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.add(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_new_import_cycles() -> None:
    found = cycles(import_graph())
    new = found - KNOWN_CYCLES
    assert not new, "new import cycles:\n" + "\n".join(" <-> ".join(sorted(c)) for c in new)
    gone = KNOWN_CYCLES - found
    assert not gone, "listed cycles that are gone (remove them from KNOWN_CYCLES):\n" + "\n".join(
        " <-> ".join(sorted(c)) for c in gone)


def test_the_scan_finds_a_cycle() -> None:
    """Not vacuous: a two-module cycle and a longer one are found, an acyclic chain is not."""
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == {frozenset({"a", "b"})}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == {frozenset({"a", "b", "c"})}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == set()
    assert "benchwright.runs.launch" in import_graph()["api.routes.runs"]
