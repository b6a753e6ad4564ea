"""Optional dependencies, installed with an extra of dmlkit (``pip install "dmlkit[EXTRA]"``).

One place says which import belongs to which extra, so every feature that needs one fails with the
same message: what needed it and the install line that brings it.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from dmlkit.exceptions import DmlkitError


class MissingExtraError(DmlkitError, ImportError):
    """A feature needs a package of an extra that is not installed."""


def require(module: str, extra: str, feature: str) -> ModuleType:
    """``import module``, or a :class:`MissingExtraError` naming ``feature`` and ``pip install "dmlkit[extra]"``."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtraError(f'{feature} needs the package {module!r}: pip install "dmlkit[{extra}]"') from None
