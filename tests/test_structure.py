"""The package's import graph has no circle.

Every ``import``/``from ... import`` inside ``src/probeselect`` counts, at module level
or inside a function (a deferred import still ties the two modules together), and so
does ``__import__("probeselect.x")`` / ``importlib.import_module("probeselect.x")``
with a literal name. ``from pkg import name`` points at ``pkg.name`` when that is a
module, else at ``pkg`` itself (so a submodule taking a name from its own package's
``__init__`` is an edge back to the package).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PKG = "probeselect"


def _modules(src: Path = SRC) -> dict[str, Path]:
    mods = {}
    for path in sorted((src / PKG).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _targets(module: str, is_pkg: bool, node: ast.AST) -> list[str]:
    """Absolute dotted names one import node refers to (modules or module.name)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = module.split(".") if is_pkg else module.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            prefix = ".".join(base + ([node.module] if node.module else []))
        else:
            prefix = node.module or ""
        return [f"{prefix}.{a.name}" for a in node.names] + [prefix]
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
            and isinstance(node.args[0].value, str):
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if name in ("__import__", "import_module"):
            target = node.args[0].value
            if target.startswith("."):
                base = module.split(".") if is_pkg else module.split(".")[:-1]
                dots = len(target) - len(target.lstrip("."))
                base = base[: len(base) - (dots - 1)]
                target = ".".join(base + [target.lstrip(".")])
            return [target]
    return []


def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    """module -> the package modules it imports (anywhere in its body)."""
    mods = _modules(src)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for module, path in mods.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            names = _targets(module, is_pkg, node)
            if isinstance(node, ast.ImportFrom):
                # `from pkg import sub` -> pkg.sub when that is a module, else pkg itself
                *items, prefix = names
                hits = [n for n in items if n in mods]
                names = hits if len(hits) == len(items) else hits + [prefix]
            for name in names:
                while name and name not in mods:  # `import a.b.c` / `a.b.func` -> the module part
                    name = name.rpartition(".")[0]
                if name and name != module:
                    graph[module].add(name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

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
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _describe(graph: dict[str, set[str]], comp: list[str]) -> str:
    return "\n".join(f"  {m} -> {', '.join(sorted(graph[m] & set(comp)))}" for m in comp)


def test_graph_sees_function_level_and_dunder_imports(tmp_path):
    pkg = tmp_path / PKG
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from .b import g\n")
    (pkg / "b.py").write_text("def g():\n    return __import__('probeselect.a', fromlist=['f'])\n")
    (pkg / "c.py").write_text("from probeselect import a\n")
    graph = import_graph(tmp_path)
    assert graph[f"{PKG}.a"] == {f"{PKG}.b"} and graph[f"{PKG}.b"] == {f"{PKG}.a"}
    assert graph[f"{PKG}.c"] == {f"{PKG}.a"}
    assert cycles(graph) == [[f"{PKG}.a", f"{PKG}.b"]]


def test_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 30, "the package's modules were not found"
    found = cycles(graph)
    assert not found, "import circles (module -> imports within the circle):\n" + "\n\n".join(
        _describe(graph, comp) for comp in found)


if __name__ == "__main__":
    g = import_graph()
    for comp in cycles(g):
        print(_describe(g, comp), end="\n\n")
