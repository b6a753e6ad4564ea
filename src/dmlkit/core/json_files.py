"""JSON records read back from disk: one reader with a nesting limit and finite numbers only.

dmlkit's records (``resolved.json``, kept plans, ``fit_request.json``, a run's claim) are files a user
can edit, copy from elsewhere or replace. Python's ``json`` accepts ``NaN``, ``Infinity`` and ``1e999``
(read as infinity) and recurses once per nesting level, so a crafted file gives a ``RecursionError`` or
a number no plan can use. :func:`read_json` turns every such file into one :class:`RecordError` that
names the file and what was expected.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from dmlkit.exceptions import RecordError

#: Deepest nesting of lists and objects a record may have (dmlkit's own records nest fewer than 10 levels).
MAX_DEPTH = 32


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text} is out of a float's range")
    return value


def _no_constant(text: str) -> Any:
    raise ValueError(f"{text} is not a number a record may hold (only finite numbers)")


def _depth(value: Any) -> int:
    """How deeply ``value``'s lists and objects nest (iteratively: a deep value cannot exhaust the stack)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            if depth > MAX_DEPTH:
                return depth
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def parse_json(text: str, where: str) -> Any:
    """``text`` as JSON; a :class:`RecordError` naming ``where`` for bad JSON, a non-finite number or nesting
    deeper than :data:`MAX_DEPTH`."""
    try:
        value = json.loads(text, parse_float=_finite_float, parse_constant=_no_constant)
    except RecursionError:
        raise RecordError(f"{where} nests lists or objects deeper than {MAX_DEPTH} levels; a dmlkit record "
                          "never does (an edited or crafted file).") from None
    except ValueError as err:  # JSONDecodeError, a non-finite number, an integer of more than 4300 digits
        raise RecordError(f"{where} is not valid JSON: {err}.") from None
    if _depth(value) > MAX_DEPTH:
        raise RecordError(f"{where} nests lists or objects deeper than {MAX_DEPTH} levels; a dmlkit record "
                          "never does (an edited or crafted file).")
    return value


def read_json(path: str | Path, *, expect: type | None = dict) -> Any:
    """The JSON record in ``path`` (UTF-8), checked by :func:`parse_json`; ``expect``: the type its top level
    must have (``None``: any). Missing files raise ``FileNotFoundError`` (callers decide what absence means);
    any other failure is a :class:`RecordError` naming the file."""
    path = Path(path)
    where = repr(str(path))
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise
    except IsADirectoryError:
        raise RecordError(f"{where} is a folder; a JSON file was expected there.") from None
    except UnicodeDecodeError as err:
        raise RecordError(f"{where} is not UTF-8 text (byte {err.start}); a JSON record was expected.") from None
    except OSError as err:
        raise RecordError(f"{where} cannot be read ({err.strerror or err}).") from None
    value = parse_json(text, where)
    if expect is not None and not isinstance(value, expect):
        raise RecordError(f"{where} must hold a JSON {'object' if expect is dict else expect.__name__}. "
                          f"Got {type(value).__name__}.")
    return value


__all__ = ["MAX_DEPTH", "parse_json", "read_json"]
