"""No import cycle among dmlkit's modules or packages, counting deferred imports and package ``__init__`` files.

A deferred import only postpones a cycle to the first call; the modules still depend on each
other, so the graph holds every ``import`` in a module (except under ``if TYPE_CHECKING:``).
Importing ``dmlkit.a.b.c`` also runs ``dmlkit/a/__init__.py`` and ``dmlkit/a/b/__init__.py``, so
an import depends on every package on the way to its target (:func:`with_package_chain`). The
root ``dmlkit/__init__.py`` is on every such way; it imports nothing of dmlkit at module level
(checked below), so it is left out of the chain. Packages must not depend on each other in a
circle either (:func:`package_graph`): ``engine -> methods -> engine`` is a cycle even when no
two modules form one.
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


def with_package_chain(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """``graph`` plus an edge from each importer to every package ``__init__`` on the way to what it imports.

    The importer's own packages are left out: they are already being imported when its code runs.
    """
    packages = set(graph)
    chained = {}
    for name, targets in graph.items():
        own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 2)}
        edges = set(targets)
        for target in targets:
            parts = target.split(".")
            edges.update(".".join(parts[:i]) for i in range(2, len(parts)))
        chained[name] = {t for t in edges if t in packages and t not in own}
    return chained


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Which of dmlkit's top-level packages and modules (``dmlkit.engine``, ``dmlkit.api``) import which others."""

    def top(name: str) -> str:
        return ".".join(name.split(".")[:2])

    out: dict[str, set[str]] = {}
    for name, targets in graph.items():
        if name == "dmlkit":
            continue
        out.setdefault(top(name), set()).update(top(t) for t in targets if t != "dmlkit" and top(t) != top(name))
    return out


def module_level_imports(path: Path, modules: set[str]) -> set[str]:
    """dmlkit modules imported by ``path`` at module level (what importing it runs at once)."""
    tree = ast.parse(path.read_text())
    top_level = ast.Module(body=[n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))], type_ignores=[])
    return imports_of(ast.unparse(top_level), "dmlkit", modules, is_package=True)


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
    modules = import_graph()
    graph = with_package_chain(modules)
    assert len(graph) > 50 and "dmlkit.losses.base" in graph["dmlkit.losses.pair.base"]
    # importing dmlkit.losses.base runs dmlkit/losses/__init__.py first
    assert "dmlkit.losses" in graph["dmlkit.memory.cross_batch"] and "dmlkit.losses" not in modules["dmlkit.memory.cross_batch"]
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_import_cycle_between_packages():
    graph = package_graph(import_graph())
    assert "dmlkit.methods" in graph["dmlkit.engine"] and "dmlkit.engine" in graph["dmlkit.report"]
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle between packages: " + " -> ".join(cycle)


def test_the_root_package_imports_nothing_of_dmlkit_at_module_level():
    modules = set(import_graph())
    assert module_level_imports(SRC / "dmlkit" / "__init__.py", modules) == set()


def test_the_package_chain_and_the_package_graph_see_what_modules_alone_do_not():
    graph = {"dmlkit.a.x": {"dmlkit.b.y"}, "dmlkit.b.y": {"dmlkit.a.z"}, "dmlkit.a.z": set(), "dmlkit.a": set(),
             "dmlkit.b": set(), "dmlkit.c.p": {"dmlkit.c.q.r"}, "dmlkit.c.q": {"dmlkit.c.p"}, "dmlkit.c.q.r": set()}
    assert find_cycle(graph) is None
    assert find_cycle(with_package_chain(graph)) == ["dmlkit.c.p", "dmlkit.c.q", "dmlkit.c.p"]
    assert find_cycle(with_package_chain({"dmlkit.c": {"dmlkit.c.p"}, "dmlkit.c.p": {"dmlkit.c.q"},
                                          "dmlkit.c.q": set()})) is None  # a package's own modules: no cycle
    assert find_cycle(package_graph(graph)) == ["dmlkit.a", "dmlkit.b", "dmlkit.a"]


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
    assert "dmlkit.methods" in graph["dmlkit.engine.objective"]  # the engine asks the method registry
    assert not any(t.startswith("dmlkit.engine") for name, targets in graph.items()
                   if name.startswith("dmlkit.methods") for t in targets)  # the hook contract is methods/hooks.py


def test_the_engine_never_imports_the_recipe():
    """The recipe plans and the engine builds: ``dmlkit.recipe`` may use the engine's mechanics, never the reverse."""
    graph = import_graph()
    reaching = sorted(f"{name} -> {target}" for name, targets in graph.items() if name.startswith("dmlkit.engine")
                      for target in targets if target == "dmlkit.recipe" or target.startswith("dmlkit.recipe."))
    assert not reaching, "engine modules importing the recipe:\n" + "\n".join(reaching)
