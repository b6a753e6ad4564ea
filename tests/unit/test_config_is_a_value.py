"""A config is a value: outside the recipe (``dmlkit/recipe/``) and config loading (``dmlkit/config/``) no module
writes to a config's fields; new configs are built with ``dataclasses.replace`` or ``config_from_dict``.

The scan reads every module's syntax tree: an assignment whose target reaches through a name that holds a config
(``cfg``, ``config``, ``fold_cfg``, ``self.cfg``, or a local bound to one of their sections, ``t = cfg.train``),
and ``setattr(getattr(cfg, ...), ...)``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "dmlkit"
OWNERS = ("recipe", "config")  # the packages that may fill in a config

CONFIG_NAME = re.compile(r"^(cfg|config|\w+_cfg|\w+_config)$")


def _chain(node: ast.AST) -> list[str]:
    """``a.b.c`` as ``["a", "b", "c"]`` (empty for anything else)."""
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    return [node.id, *reversed(names)] if isinstance(node, ast.Name) else []


def _reaches_config(chain: list[str], aliases: set[str]) -> bool:
    return any(CONFIG_NAME.match(name) for name in chain[:-1]) or (len(chain) > 1 and chain[0] in aliases)


def config_writes(source: str) -> list[tuple[int, str]]:
    """``(line, target)`` of every write to a config's field in ``source``."""
    tree = ast.parse(source)
    found = []
    for scope in [tree, *[n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]]:
        aliases: set[str] = set()
        for node in ast.walk(scope):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Attribute):
                value = _chain(node.value)
                if value and any(CONFIG_NAME.match(name) for name in value):
                    aliases.update(t.id for t in node.targets if isinstance(t, ast.Name))
        for node in ast.walk(scope):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            flat = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
            for target in flat:
                chain = _chain(target)
                if chain and _reaches_config(chain, aliases):
                    found.append((node.lineno, ".".join(chain)))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" \
                    and node.args and "cfg" in ast.unparse(node.args[0]):
                found.append((node.lineno, ast.unparse(node)))
    return sorted(set(found))


def test_no_module_outside_the_recipe_and_config_loading_writes_a_config():
    writes = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.split("/")[0] in OWNERS:
            continue
        writes += [f"{relative}:{line}: {target} = ..." for line, target in config_writes(path.read_text())]
    assert not writes, "config fields written outside dmlkit/recipe/ and dmlkit/config/:\n" + "\n".join(writes)


def test_the_scan_sees_each_kind_of_write():
    source = (
        "def f(cfg, fold_cfg, other):\n"
        "    cfg.train.max_steps = 3\n"
        "    fold_cfg.seed = 1\n"
        "    t = cfg.train\n"
        "    t.eval_every = 2\n"
        "    self.cfg.name, x = 'a', 1\n"
        "    setattr(getattr(cfg, 'model'), 'name', 'x')\n"
        "    other.value = 4\n"  # not a config
        "    self.cfg = cfg\n"  # holding a config is not writing one
    )
    assert [line for line, _ in config_writes(source)] == [2, 3, 5, 6, 7]
