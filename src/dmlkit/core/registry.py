"""A small registry of named components with did-you-mean errors (timm-style factories).

A package of components imports its modules with :func:`import_submodules` (each registers its
components on import) and exports :meth:`Registry.classes_in` itself, so a new module needs no
line anywhere else.
"""

from __future__ import annotations

import difflib
import fnmatch
import importlib
import pkgutil
from typing import Any, Callable, Generic, Iterable, TypeVar

from dmlkit.exceptions import InvalidParameterError

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to constructors of one kind of component (losses, miners, models, ...)."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, Callable[..., T]] = {}

    def register(self, name: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """Decorator registering a class or factory under ``name``."""

        def deco(obj: Callable[..., T]) -> Callable[..., T]:
            if name in self._entries and self._entries[name] is not obj:
                raise ValueError(f"{self.kind} name {name!r} is registered twice")
            self._entries[name] = obj
            return obj

        return deco

    def get(self, name: str) -> Callable[..., T]:
        """Return the constructor registered as ``name``, or raise with close matches."""
        try:
            return self._entries[name]
        except KeyError:
            raise InvalidParameterError(self.unknown_message(name)) from None

    def unknown_message(self, name: str) -> str:
        close = difflib.get_close_matches(str(name), list(self._entries), n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        return (
            f"Unknown {self.kind} {name!r}.{hint} Valid names: {', '.join(sorted(self._entries))}."
        )

    def create(self, name: str, **kwargs: Any) -> T:
        """Build the component registered as ``name`` with keyword arguments."""
        return self.get(name)(**kwargs)

    def names(self, pattern: str = "*") -> list[str]:
        """Sorted registered names matching a shell-style ``pattern``."""
        return sorted(n for n in self._entries if fnmatch.fnmatch(n, pattern))

    def classes_in(self, package: str) -> dict[str, type]:
        """The registered classes defined in the modules of ``package``, by class name (sorted)."""
        prefix = package + "."
        found = {obj.__name__: obj for obj in self._entries.values()
                 if isinstance(obj, type) and obj.__module__.startswith(prefix)}
        return dict(sorted(found.items()))

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)


def import_submodules(package: str, path: Iterable[str]) -> None:
    """Import every public module (name without a leading ``_``) of ``package``, in name order.

    Called from a package's ``__init__`` as ``import_submodules(__name__, __path__)``: the modules
    register their components on import, so adding a module is enough to add a component.
    """
    for module in sorted(pkgutil.iter_modules(list(path)), key=lambda m: m.name):
        if not module.name.startswith("_"):
            importlib.import_module(f"{package}.{module.name}")
