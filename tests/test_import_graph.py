"""No import cycle in the package: the import graph is built from the source with ``ast`` (nothing
is imported), module-level imports and imports inside functions alike, and must have no cycle.

Why: a cycle makes the import order decide whether a name exists yet (a module half-initialised
when the other side reads it), and it hides which layer depends on which. The data flows one way
(``docs/decisions.md``, "Layers"): contract -> op rooms -> backends -> gate -> chain -> CLI. The
package root ``rl_engine/__init__.py`` is the public facade on top; no module inside the package
imports from it (the op list and the version live in ``rl_engine/constants.py``).

Edges: ``import a.b.c`` is an edge to ``a.b.c`` (the parents' ``__init__`` run too, but that is
not one module needing another); ``from a import b`` is an edge to ``a.b`` when that is a module,
else to ``a``; relative imports are resolved against the importing module's package.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "rl_engine"


def module_names(package_dir: Path) -> dict[str, Path]:
    """``dotted.name -> file`` for every module of the package in ``package_dir`` (its
    ``__init__.py`` is the package's own name)."""
    out = {}
    for path in sorted(package_dir.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _from_base(module: str, is_package: bool, node: ast.ImportFrom) -> str | None:
    """The absolute module a ``from ... import`` reads from (``None`` above the top package)."""
    if not node.level:
        return node.module
    parts = module.split(".") if is_package else module.split(".")[:-1]
    if node.level - 1 >= len(parts):
        return None
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def _own_module(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is a module of the package (None: outside it)."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in modules:
            return ".".join(parts)
        parts.pop()
    return None


def import_graph(package_dir: Path) -> dict[str, dict[str, str]]:
    """``module -> {imported module: "file:line" of the first such import}`` over the package's own
    modules, every ``import`` statement of the file counted (module level, functions, methods)."""
    modules = module_names(package_dir)
    graph: dict[str, dict[str, str]] = {}
    for mod, path in modules.items():
        edges: dict[str, str] = {}
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _from_base(mod, path.name == "__init__.py", node)
                if base is None:
                    continue
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for target in targets:
                hit = _own_module(target, modules)
                if hit is not None and hit != mod:
                    edges.setdefault(hit, f"{path.relative_to(package_dir.parent)}:{node.lineno}")
        graph[mod] = edges
    return graph


def cycles(graph: dict[str, dict[str, str]]) -> list[list[str]]:
    """The shortest cycle ``[a, b, ..., a]`` through each module that is in one, written from its
    smallest module name, without repeats: every group of modules that reach each other (a
    strongly connected component, Tarjan's algorithm) shows each of its loops that way."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(v: str) -> None:  # recursion depth is bounded by the package's module count
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    found: set[tuple[str, ...]] = set()
    for group in groups:
        for start in sorted(group):
            prev: dict[str, str] = {start: start}
            frontier, last = [start], None
            while last is None:  # breadth-first inside the group: the shortest way back to start
                nxt = []
                for v in frontier:
                    if start in graph[v]:
                        last = v
                        break
                    for w in sorted(graph[v]):
                        if w in group and w not in prev:
                            prev[w] = v
                            nxt.append(w)
                frontier = nxt
            path = [last]
            while path[-1] != start:
                path.append(prev[path[-1]])
            loop = path[::-1]
            i = loop.index(min(loop))
            found.add(tuple(loop[i:] + loop[:i]))
    return sorted([*loop, loop[0]] for loop in found)


def describe(graph: dict[str, dict[str, str]], cycle: list[str]) -> str:
    return " -> ".join(cycle) + "\n    " + "\n    ".join(
        f"{a} imports {b} at {graph[a][b]}" for a, b in zip(cycle, cycle[1:]))


def test_the_package_has_no_import_cycle():
    graph = import_graph(PACKAGE)
    assert len(graph) > 50 and "rl_engine.gate.runner" in graph  # the whole package was read
    found = cycles(graph)
    assert not found, "import cycles in rl_engine:\n  " + "\n  ".join(describe(graph, c) for c in found)


def test_no_module_imports_the_package_root():
    """The facade rule that keeps the root out of every cycle, checked on its own for a clear message."""
    graph = import_graph(PACKAGE)
    users = sorted(f"{m} at {edges['rl_engine']}" for m, edges in graph.items() if "rl_engine" in edges)
    assert not users, "modules importing from the package root rl_engine/__init__.py: " + ", ".join(users)


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


def test_negative_control_a_planted_cycle_is_found(tmp_path):
    """A tiny package with a cycle through a function-level, a relative and a ``from pkg import
    submodule`` import: the same builder must report it, with the file and line of each edge."""
    pkg = _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "import os\n\ndef f():\n    from pkg.sub import b\n    return b\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/b.py": "from ..c import value\n",
        "pkg/c.py": "from pkg import a\nvalue = 1\n",
        "pkg/leaf.py": "from pkg.c import value\n",
    })
    graph = import_graph(pkg)
    assert graph["pkg.a"] == {"pkg.sub.b": "pkg/a.py:4"}
    assert graph["pkg.sub.b"] == {"pkg.c": "pkg/sub/b.py:1"}
    assert graph["pkg.c"] == {"pkg.a": "pkg/c.py:1"}
    found = cycles(graph)
    assert found == [["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"]]
    assert "pkg.c imports pkg.a at pkg/c.py:1" in describe(graph, found[0])


def test_control_the_same_package_without_the_cycle_is_clean(tmp_path):
    pkg = _write(tmp_path, {
        "pkg/__init__.py": "from pkg.a import f\n",
        "pkg/a.py": "def f():\n    from pkg.sub import b\n    return b\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/b.py": "from ..c import value\n",
        "pkg/c.py": "value = 1\n",
    })
    graph = import_graph(pkg)
    assert graph["pkg"] == {"pkg.a": "pkg/__init__.py:1"}
    assert cycles(graph) == []
