"""The import graph of agent/, cloud_sync/ and fleet/ has no cycle, and keeps its direction.

Edges are the imports a module runs when it is imported (``import x``, ``from x import y``, at
module level, in a class body or under a module-level ``if``/``try``), read with :mod:`ast`
from the source files, never by importing them; imports under ``if TYPE_CHECKING:`` are not
edges. A second pass adds the imports inside functions (lazy loads): a circle closed by one of
those is the same circle, postponed to the first call; a third adds the ``TYPE_CHECKING``
imports (a circle in the types is a circle in the design). ``from pkg import name`` is an
edge to ``pkg.name`` when that is a module of the tree, else to ``pkg``. A cycle is printed as
the modules around it, so the failing message names the import to move.

Dependency direction (docs/ and the architecture): ``cloud_sync`` imports nothing from
``agent`` or ``fleet``; ``fleet`` imports nothing from ``agent``; ``agent.pipeline`` imports no
I/O module of the agent (sources, store, publish, services, inference runtimes).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("agent", "cloud_sync", "fleet")


def module_name(path: Path) -> str:
    """``agent/store/sqlite.py`` -> ``agent.store.sqlite``; ``agent/__init__.py`` -> ``agent``."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def tree_modules() -> dict[str, Path]:
    """Every module of the three packages, by dotted name."""
    return {
        module_name(p): p
        for pkg in PACKAGES
        for p in sorted((ROOT / pkg).rglob("*.py"))
    }


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(body: list[ast.stmt], lazy: bool, typing: bool) -> Iterator[ast.stmt]:
    """The statements of ``body`` and of every block nested in it, except, unless ``typing``,
    the bodies of ``if TYPE_CHECKING:`` (its ``else:`` runs) and, unless ``lazy``, of
    functions."""
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not lazy:
            continue
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test) and not typing:
            yield from _import_nodes(node.orelse, lazy, typing)
            continue
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            for child in getattr(node, field, ()):
                if isinstance(child, ast.stmt):
                    yield from _import_nodes([child], lazy, typing)
                else:  # an except handler or a match case: its own body
                    yield from _import_nodes(child.body, lazy, typing)


def imports_of(
    name: str, path: Path, modules: dict[str, Path], lazy: bool = False, typing: bool = False
) -> set[str]:
    """The modules of the tree that importing ``name`` imports directly (with ``lazy``: or
    that one of its functions imports when called; with ``typing``: or that its annotations
    name under ``if TYPE_CHECKING:``)."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found: set[str] = set()
    for node in _import_nodes(tree.body, lazy, typing):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's own package
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in modules else target)
    return {m for m in found if m in modules and m != name}


def import_graph(lazy: bool = False, typing: bool = False) -> dict[str, set[str]]:
    """Module -> the tree's modules it imports at import time (``lazy``: or in a function;
    ``typing``: or for its annotations only)."""
    modules = tree_modules()
    return {name: imports_of(name, path, modules, lazy, typing)
            for name, path in modules.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan's
    algorithm, iterative), each as ``[a, b, ..., a]`` along real edges.

    >>> find_cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}})
    [['a', 'b', 'a']]
    >>> find_cycles({"a": {"b"}, "b": set()})
    []
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    comp.append(member)
                    if member == node:
                        break
                if len(comp) > 1:
                    components.append(sorted(comp))
    return [_cycle_in(graph, set(comp)) for comp in sorted(components)]


def _cycle_in(graph: dict[str, set[str]], comp: set[str]) -> list[str]:
    """A path from the component's first module back to itself (breadth first)."""
    start = min(comp)
    came: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt_frontier: list[str] = []
        for node in frontier:
            for nxt in sorted(graph[node] & comp):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came[path[-1]])
                    return [*reversed(path), start]
                if nxt not in came:
                    came[nxt] = node
                    nxt_frontier.append(nxt)
        frontier = nxt_frontier
    raise AssertionError(f"no cycle in component {sorted(comp)}")  # pragma: no cover


def test_the_graph_is_read() -> None:
    graph = import_graph()
    assert "agent.app" in graph and "fleet.app" in graph and "cloud_sync.package" in graph
    # a known edge of each kind: ``from x import y`` of a module, and of a name
    assert "agent.store.sqlite" in graph["agent.services.uploader"]
    assert "agent.errors" in graph["agent.store.sqlite"]


@pytest.mark.parametrize(
    ("lazy", "typing"),
    [(False, False), (True, False), (True, True)],
    ids=["module-level", "with-function-imports", "with-type-checking-imports"],
)
def test_no_import_cycle(lazy: bool, typing: bool) -> None:
    """No cycle at import time, nor one closed by an import inside a function (a lazy import
    only postpones the circle: move the shared code to the lower module instead), nor one
    closed by an annotation (a Protocol of the fields used breaks those)."""
    cycles = find_cycles(import_graph(lazy, typing))
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_cycles_are_found() -> None:
    graph = {"x.a": {"x.b"}, "x.b": {"x.c"}, "x.c": {"x.a", "x.d"}, "x.d": set()}
    assert find_cycles(graph) == [["x.a", "x.b", "x.c", "x.a"]]


def test_type_checking_and_function_imports_are_no_edges(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text(
        "from typing import TYPE_CHECKING\n"
        "import agent.errors\n"
        "if TYPE_CHECKING:\n    import agent.app\nelse:\n    import agent.records\n"
        "try:\n    import agent.logs\nexcept ImportError:\n    pass\n"
        "def f():\n    import agent.metrics\n",
        encoding="utf-8",
    )
    got = imports_of("tmp.m", src, tree_modules())
    assert got == {"agent.errors", "agent.records", "agent.logs"}
    assert imports_of("tmp.m", src, tree_modules(), lazy=True) == got | {"agent.metrics"}
    assert imports_of("tmp.m", src, tree_modules(), typing=True) == got | {"agent.app"}


@pytest.mark.parametrize(
    ("importer", "forbidden"),
    [
        ("cloud_sync", ("agent", "fleet")),
        ("fleet", ("agent",)),
        (
            "agent.pipeline",
            ("agent.sources", "agent.store", "agent.publish", "agent.services", "agent.app"),
        ),
    ],
)
def test_dependency_direction(importer: str, forbidden: tuple[str, ...]) -> None:
    graph = import_graph()
    bad = sorted(
        f"{mod} imports {dep}"
        for mod, deps in graph.items()
        if mod == importer or mod.startswith(importer + ".")
        for dep in deps
        if any(dep == f or dep.startswith(f + ".") for f in forbidden)
    )
    assert not bad, "\n".join(bad)
