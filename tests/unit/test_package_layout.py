"""The package root holds the public entry points only; the ground floor lives in ``dmlkit/core/``."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "dmlkit"


def test_the_package_root_has_no_private_modules():
    private = sorted(p.name for p in PACKAGE.glob("_*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert private == [], f"ground-floor modules belong in dmlkit/core/, not the package root: {private}"


def test_core_imports_no_other_room():
    """``core/`` is what every room imports; it imports only itself and the public errors."""
    allowed = {"dmlkit.core", "dmlkit.exceptions"}
    found = {}
    for path in sorted((PACKAGE / "core").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else (
                [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            for name in names:
                if name.startswith("dmlkit") and not any(name == a or name.startswith(a + ".") for a in allowed):
                    found.setdefault(path.name, []).append(name)
    assert found == {}, f"core/ modules import other rooms: {found}"
