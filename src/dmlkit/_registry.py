"""A small registry of named components with did-you-mean errors (timm-style factories)."""

from __future__ import annotations

import difflib
import fnmatch
from typing import Any, Callable, Generic, TypeVar

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

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)
