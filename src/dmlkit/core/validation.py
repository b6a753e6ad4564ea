"""Declarative parameter constraints and input checks with one message template.

Message template (scikit-learn style)::

    The 'margin' parameter of ProxyAnchorLoss must be a float >= 0. Got -1 instead.
"""

from __future__ import annotations

import difflib
import math
import numbers
import reprlib
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import torch

from dmlkit.exceptions import DataError, InvalidParameterError


@dataclass(frozen=True)
class Interval:
    """A numeric range; ``kind`` is ``int`` or ``float`` (ints are accepted for floats)."""

    kind: type
    low: float | None = None
    high: float | None = None
    closed: str = "both"  # "both", "left", "right", "neither"

    def accepts(self, value: Any) -> bool:
        if isinstance(value, bool):
            return False
        if self.kind is int:
            if not isinstance(value, numbers.Integral):
                return False
        elif not isinstance(value, numbers.Real):
            return False
        v = float(value)
        if math.isnan(v):
            return False
        if self.low is not None:
            if v < self.low or (v == self.low and self.closed in ("right", "neither")):
                return False
        if self.high is not None:
            if v > self.high or (v == self.high and self.closed in ("left", "neither")):
                return False
        return True

    def describe(self) -> str:
        name = "an int" if self.kind is int else "a float"
        lo_op = ">=" if self.closed in ("both", "left") else ">"
        hi_op = "<=" if self.closed in ("both", "right") else "<"
        if self.high == math.inf and self.closed in ("left", "neither"):  # finite: read as "a float > low"
            return Interval(self.kind, self.low, None, self.closed).describe()
        if self.low is not None and self.high is not None:
            lo_b = "[" if self.closed in ("both", "left") else "("
            hi_b = "]" if self.closed in ("both", "right") else ")"
            return f"{name} in the range {lo_b}{_fmt(self.low)}, {_fmt(self.high)}{hi_b}"
        if self.low is not None:
            return f"{name} {lo_op} {_fmt(self.low)}"
        if self.high is not None:
            return f"{name} {hi_op} {_fmt(self.high)}"
        return name


@dataclass(frozen=True)
class Capped(Interval):
    """An :class:`Interval` unbounded above by nature, capped at ``high`` against typos and hostile values
    (``max_steps=10**30``); said as its natural range and the cap: ``an int >= 1, at most 1000000000``."""

    def describe(self) -> str:
        natural = Interval(self.kind, self.low, None, "left" if self.closed in ("both", "left") else "neither")
        return f"{natural.describe()}, at most {_fmt(self.high)}"


@dataclass(frozen=True)
class Options:
    """One of a fixed set of values."""

    values: tuple

    def accepts(self, value: Any) -> bool:
        try:
            return value in self.values
        except TypeError:
            return False

    def describe(self) -> str:
        return "one of {" + ", ".join(repr(v) for v in self.values) + "}"

    def names(self) -> list:
        """The accepted values (for did-you-mean)."""
        return list(self.values)


@dataclass(frozen=True)
class InstanceOf:
    """An instance of one of the given types (``None`` allowed when listed as ``type(None)``)."""

    types: tuple

    def accepts(self, value: Any) -> bool:
        return isinstance(value, self.types)

    def describe(self) -> str:
        names = [("None" if t is type(None) else f"a {t.__name__}") for t in self.types]
        return " or ".join(names)


@dataclass(frozen=True)
class Matches:
    """A string matching ``pattern`` (a regular expression, whole string); ``description`` says it in words."""

    pattern: str
    description: str

    def accepts(self, value: Any) -> bool:
        import re

        return isinstance(value, str) and re.fullmatch(self.pattern, value) is not None

    def describe(self) -> str:
        return self.description


@dataclass(frozen=True)
class Text:
    """A string of at most ``max_chars`` characters (a name that becomes part of a file name)."""

    max_chars: int

    def accepts(self, value: Any) -> bool:
        return isinstance(value, str) and len(value) <= self.max_chars

    def describe(self) -> str:
        return f"a text of at most {self.max_chars} characters"


@dataclass(frozen=True)
class FilePath:
    """A path the file system can hold: names of at most 255 bytes, the whole under 4096 (:mod:`dmlkit.core.paths`)."""

    def accepts(self, value: Any) -> bool:
        from dmlkit.core.paths import path_problem

        return isinstance(value, str) and path_problem(value) is None

    def describe(self) -> str:
        from dmlkit.core.paths import MAX_NAME_BYTES, MAX_PATH_BYTES

        return f"a path under {MAX_PATH_BYTES} bytes whose every name has at most {MAX_NAME_BYTES} bytes"


@dataclass(frozen=True)
class ListOf:
    """A list of ``min_len`` to ``max_len`` items, each accepted by ``item``; ``description`` says it in words."""

    item: Any
    description: str
    min_len: int = 0
    max_len: int | None = None

    def accepts(self, value: Any) -> bool:
        if not isinstance(value, (list, tuple)) or len(value) < self.min_len:
            return False
        if self.max_len is not None and len(value) > self.max_len:
            return False
        return all(self.item.accepts(v) for v in value)

    def describe(self) -> str:
        return self.description


@dataclass(frozen=True)
class OptionsFrom:
    """One of the options held by ``module.attr`` (a tuple, or a :class:`~dmlkit.core.registry.Registry`'s
    names), looked up when checked: the list lives where the options are implemented, and importing
    the constraint imports nothing."""

    module: str
    attr: str
    extra: tuple = ()

    def names(self) -> list[str]:
        """The accepted values, read from where they are implemented (for did-you-mean)."""
        import importlib

        options = getattr(importlib.import_module(self.module), self.attr)
        return [*self.extra, *(options.names() if hasattr(options, "names") else options)]

    def accepts(self, value: Any) -> bool:
        return isinstance(value, str) and value in self.names()

    def describe(self) -> str:
        return "one of {" + ", ".join(repr(v) for v in self.names()) + "}"


def suggest_value(value: Any, constraints: list) -> str:
    """`` Did you mean 'proxy_anchor'?`` for a string close to an option of ``constraints`` (case, ``-`` and ``_``
    ignored), else ``""``."""
    if not isinstance(value, str):
        return ""
    options = [str(v) for c in constraints if hasattr(c, "names") for v in c.names() if isinstance(v, str)]

    def plain(text: str) -> str:
        return text.lower().replace("-", "").replace("_", "")

    by_plain = {plain(o): o for o in options}
    close = difflib.get_close_matches(plain(value), list(by_plain), n=1, cutoff=0.6)
    return f" Did you mean {by_plain[close[0]]!r}?" if close else ""


NONE = InstanceOf((type(None),))
BOOL = InstanceOf((bool,))


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother, _SHORT.maxlong = 3, 60, 60, 40
_SHORT.maxlist = _SHORT.maxtuple = _SHORT.maxdict = _SHORT.maxset = 6


def short_repr(value: Any) -> str:
    """``repr(value)`` cut to a short prefix (about 60 characters per string, 6 items per container, 3 levels):
    an error message never quotes a whole huge value, and never builds its full repr."""
    return _SHORT.repr(value)


def validate_params(owner: str, params: Mapping[str, Any], constraints: Mapping[str, Iterable]) -> None:
    """Check every ``params[name]`` against the list of constraints ``constraints[name]``.

    A value is valid when any of its constraints accepts it. Raises
    :class:`InvalidParameterError` naming the parameter, its owner and what was allowed.
    """
    for name, cons in constraints.items():
        if name not in params:
            continue
        value = params[name]
        cons = list(cons)
        if any(c.accepts(value) for c in cons):
            continue
        allowed = " or ".join(c.describe() for c in cons)
        raise InvalidParameterError(
            f"The {name!r} parameter of {owner} must be {allowed}. Got {short_repr(value)} instead."
        )


def reads_on_host(tensor: torch.Tensor) -> bool:
    """Whether reading ``tensor``'s values in Python is free: it lives in host memory.

    On an accelerator the same read (``.item()``, ``int(t)``, ``if t.any():``) makes the host wait
    for every queued kernel; checks of data go through ``torch._assert_async`` there instead.
    """
    return tensor.device.type == "cpu"


def check_embeddings_labels(
    embeddings: torch.Tensor,
    labels: torch.Tensor | None,
    *,
    name: str = "embeddings",
    labels_name: str = "labels",
    allow_empty: bool = False,
    ndim: int | None = 2,
) -> None:
    """Validate a ``[B, D]`` float embedding tensor and its ``[B]`` integer labels.

    ``ndim=None`` leaves the number of dimensions to the caller (a distance's ``check_shapes``).
    """
    if not isinstance(embeddings, torch.Tensor):
        raise InvalidParameterError(f"{name} must be a torch.Tensor of shape [B, D]. Got {type(embeddings).__name__}.")
    if ndim is not None and embeddings.dim() != ndim:
        raise DataError(f"{name} must be 2-D [B, D]. Got shape {tuple(embeddings.shape)}.")
    if not embeddings.is_floating_point():
        raise DataError(f"{name} must be a floating-point tensor. Got dtype {embeddings.dtype}.")
    if not allow_empty and embeddings.shape[0] == 0:
        raise DataError(f"{name} is empty (0 rows).")
    if labels is None:
        return
    if not isinstance(labels, torch.Tensor):
        raise InvalidParameterError(
            f"{labels_name} must be a torch.Tensor of integer class ids. Got {type(labels).__name__}."
        )
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise DataError(f"{labels_name} must hold integer class ids (int64). Got dtype {labels.dtype}.")
    if labels.dim() != 1:
        raise DataError(f"{labels_name} must be 1-D [B]. Got shape {tuple(labels.shape)}.")
    if labels.shape[0] != embeddings.shape[0]:
        raise DataError(
            f"{name} has {embeddings.shape[0]} rows but {labels_name} has {labels.shape[0]}."
        )


def as_class_ids(labels: Any, owner: str) -> torch.Tensor:
    """``labels`` as a CPU int64 ``[N]`` tensor of class ids; float, complex or bool labels are a :class:`DataError`.

    Never truncates: ``[0.2, 0.9]`` is refused, not read as ``[0, 0]``.
    """
    labels = torch.as_tensor(labels)
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise DataError(f"labels given to {owner} must hold integer class ids (int64). Got dtype {labels.dtype}.")
    if labels.dim() != 1:
        raise DataError(f"labels given to {owner} must be a 1-D [N] tensor. Got shape {tuple(labels.shape)}.")
    return labels.to(torch.int64).cpu()


def require_module(module: str, package: str, feature: str, extra: str):
    """Import ``module`` for an optional ``feature``, or raise a ConfigError naming ``package`` to install."""
    import importlib

    from dmlkit.exceptions import ConfigError

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(
            f"{feature} needs the {package!r} package, which is not installed: "
            f"pip install {package} (or pip install 'dmlkit[{extra}]')."
        ) from None
