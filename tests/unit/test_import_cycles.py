"""No import cycle among dmlkit's modules, counting imports inside functions (deferred) too.

A deferred import only postpones a cycle to the first call; the modules still depend on each
other, so the graph holds every ``import`` in a module (except under ``if TYPE_CHECKING:``).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for n in ast.walk(node))
    return skipped


def imports_of(source: str, name: str, modules: set[str], *, is_package: bool = False) -> set[str]:
    """dmlkit modules imported anywhere in ``source`` (module level or inside functions; not type-checking only)."""
    tree = ast.parse(source)
    package = name if is_package else name.rsplit(".", 1)[0]
    skipped = _type_checking_nodes(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("dmlkit"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if not base.startswith("dmlkit"):
                continue
            for alias in node.names:
                target = f"{base}.{alias.name}"
                found.add(target if target in modules else base)
    return {m for m in found if m in modules and m != name}


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in SRC.joinpath("dmlkit").rglob("*.py")}
    extensions = {module_name(p) for p in SRC.joinpath("dmlkit").rglob("*.c")}  # C modules import nothing of dmlkit
    modules = set(files) | extensions
    graph = {name: imports_of(path.read_text(), name, modules, is_package=path.name == "__init__.py")
             for name, path in files.items()}
    return graph | {name: set() for name in extensions}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = dfs(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = dfs(node)
            if cycle:
                return cycle
    return None


def test_no_import_cycle_in_dmlkit():
    graph = import_graph()
    assert len(graph) > 50 and "dmlkit.losses.base" in graph["dmlkit.losses.pair.base"]
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_deferred_and_type_checking_imports():
    modules = {"dmlkit.a", "dmlkit.b", "dmlkit.c"}
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from dmlkit.c import X\n"
        "def f():\n    from dmlkit.b import g\n    return g\n"
    )
    assert imports_of(source, "dmlkit.a", modules) == {"dmlkit.b"}


def test_the_engine_and_methods_do_not_import_each_other_in_a_circle():
    graph = import_graph()
    assert "dmlkit.methods" in graph["dmlkit.engine.builders"]  # the engine asks the method registry (deferred)
    assert "dmlkit.engine.builders" not in graph["dmlkit.methods.asap"]
