"""Library code says things through the dmlkit loggers, never ``print``: an application decides what it shows.

The command line (``dmlkit/cli/``) prints its results to stdout; every other module is library code.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "dmlkit"

#: Library modules that hand ``print`` over as a default ``echo``, with the reason.
PRINTS = {
    "data/download.py": "a data set's terms of use are shown before its download whatever logging shows "
                        "(pytorch-metric-learning prints them too)",
    "claims/runner.py": "the claims' reproduction reports progress from spawned worker processes, "
                        "which have no logging configured",
    "claims/experiment.py": "the claims' reproduction (scripts/), as claims/runner.py",
}


def print_uses(path: Path) -> list[int]:
    """Lines where ``path`` calls ``print`` or hands it over as a value."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return sorted(node.lineno for node in ast.walk(tree)
                  if isinstance(node, ast.Name) and node.id == "print" and isinstance(node.ctx, ast.Load))


def test_library_modules_do_not_print():
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        name = path.relative_to(SRC).as_posix()
        if name.startswith("cli/") or name in PRINTS:
            continue
        lines = print_uses(path)
        if lines:
            found[name] = lines
    assert not found, f"print in library code (say it through a logger, dmlkit.core.messages): {found}"


def test_the_listed_exceptions_still_print():
    assert all(print_uses(SRC / name) for name in PRINTS), "a listed module no longer prints: remove it from PRINTS"
