"""Kept plans and ``--plan`` replays checked as a whole before one of their numbers is replayed.

A tape (:mod:`dmlkit.recipe.measurements`) is ``[{"name": str, "value": V}, ...]`` where ``V`` is what a
measurement encodes: ``null``, a boolean, a number, or lists and objects of them (keys are Python names).
Every number is a cost, a time, a count or a size: finite, and 0 or within [:data:`SMALLEST`,
:data:`LARGEST`]; anything else (a string, NaN, ``1e308``, a negative cost, an entry without ``value``,
an unknown key) is not something dmlkit records. Checked here:

* a kept plan (``<cache>/plans/<machine>/<request>.json``) that fails is ignored, with a warning naming
  it and why: the run measures again and its measurements replace the file;
* a run's ``resolved.json`` given to ``dmlkit train --plan`` that fails is refused (a ConfigError naming it
  and the entry at fault): ``--plan`` promises that run's plan, so nothing of it is half-used;
* a value that passes but that this dmlkit's measurement does not decode (another object's fields) stops
  the run with a :class:`~dmlkit.exceptions.RecordError` naming the plan and the measurement.

Each record carries a seal, a digest of its request and tape: a file edited by hand (other numbers, another
loss in its request) still replays, with a warning that says so.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
from pathlib import Path
from typing import Any, Callable, TypeVar

from dmlkit.core.json_files import read_json
from dmlkit.core.validation import short_repr
from dmlkit.engine.run_layout import RESOLVED_FILE
from dmlkit.exceptions import ConfigError, RecordError

_log = logging.getLogger(__name__)

T = TypeVar("T")

#: The largest number a measurement may hold: seconds (30 million years), bytes (1 PB), counts alike.
LARGEST = 1e15
#: The smallest non-zero number: a picosecond; smaller ones only come from edits, and divide to infinity.
SMALLEST = 1e-12
#: Entries in one tape, items in one value's list, characters in a measurement's name.
MAX_ENTRIES, MAX_ITEMS, MAX_NAME = 10_000, 10_000, 500
#: The keys of a kept plan file (``PlanStore.keep``) and of one tape entry.
KEPT_KEYS = frozenset({"format", "machine", "kept_at", "measurements", "seal"})
ENTRY_KEYS = frozenset({"name", "value"})
#: ``resolved.json``'s key for the seal of its ``request`` and ``measurements.tape``.
SEAL_KEY = "plan_seal"

_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def seal(request: Any, tape: Any) -> str:
    """A digest of a plan's request and tape: a replay whose file no longer matches it was edited."""
    text = json.dumps({"request": request, "tape": tape}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def value_problem(value: Any) -> str | None:
    """Why ``value`` is not a measurement's encoding (module docstring), or None."""
    stack = [(value, "value")]
    while stack:
        item, where = stack.pop()
        if item is None or isinstance(item, bool):
            continue
        if isinstance(item, (int, float)):
            if not math.isfinite(item) or item < 0 or item > LARGEST or 0 < item < SMALLEST:
                return (f"{where} is {short_repr(item)}; a measurement's numbers are finite, 0 or from {SMALLEST:g} "
                        f"to {LARGEST:g}")
        elif isinstance(item, list):
            if len(item) > MAX_ITEMS:
                return f"{where} has {len(item)} items; at most {MAX_ITEMS} were expected"
            stack.extend((child, f"{where}[{i}]") for i, child in enumerate(item))
        elif isinstance(item, dict):
            bad = next((key for key in item if not (isinstance(key, str) and _FIELD.fullmatch(key))), None)
            if bad is not None:
                return f"{where} has the key {short_repr(bad)}; a measurement's keys are field names"
            stack.extend((child, f"{where}.{key}") for key, child in item.items())
        else:
            return (f"{where} is {short_repr(item)} ({type(item).__name__}); a measurement holds numbers, booleans, "
                    "null, and lists or objects of them")
    return None


def check_tape(tape: Any, where: str) -> list[dict]:
    """``tape`` as a list of ``{"name", "value"}`` entries, each value a measurement's encoding; else a
    :class:`RecordError` naming ``where``, the entry at fault and what was expected."""
    if not isinstance(tape, list):
        raise RecordError(f"{where}: the tape is {short_repr(tape)} ({type(tape).__name__}); a list of "
                          "{'name': ..., 'value': ...} entries was expected.")
    if len(tape) > MAX_ENTRIES:
        raise RecordError(f"{where}: the tape has {len(tape)} entries; at most {MAX_ENTRIES} were expected.")
    for number, entry in enumerate(tape):
        at = f"{where}: tape entry {number}"
        if not isinstance(entry, dict):
            raise RecordError(f"{at} is {short_repr(entry)} ({type(entry).__name__}); an object "
                              "{'name': ..., 'value': ...} was expected.")
        if set(entry) != ENTRY_KEYS:
            missing, unknown = sorted(ENTRY_KEYS - set(entry)), sorted(set(entry) - ENTRY_KEYS)
            said = "; ".join(s for s in (f"no {', '.join(map(repr, missing))}" if missing else "",
                                         f"unknown {', '.join(map(repr, unknown))}" if unknown else "") if s)
            raise RecordError(f"{at} has {said}; exactly the keys 'name' and 'value' were expected.")
        name = entry["name"]
        if not isinstance(name, str) or not name or len(name) > MAX_NAME:
            raise RecordError(f"{at}: its name is {short_repr(name)}; a text of 1 to {MAX_NAME} characters was "
                              "expected.")
        problem = value_problem(entry["value"])
        if problem is not None:
            raise RecordError(f"{at} ({name!r}): its {problem}.")
    return tape


def kept_tape(path: Path, machine: dict, request: dict, tape_format: str) -> list[dict] | None:
    """The tape kept in ``path`` for ``request`` on ``machine`` (``PlanStore.load``), or None: no file, a file of
    another machine or format, or one that does not read or fails :func:`check_tape` (said; measured again)."""
    try:
        if not path.is_file():
            return None
        data = read_json(path)
        if data.get("format") != tape_format or data.get("machine") != machine:
            return None
        unknown = sorted(set(data) - KEPT_KEYS)
        if unknown:
            raise RecordError(f"{str(path)!r} has the keys {', '.join(map(repr, unknown))}, which dmlkit does not "
                              f"write (expected {', '.join(sorted(KEPT_KEYS))}).")
        tape = check_tape(data.get("measurements"), repr(str(path)))
    except (RecordError, OSError) as err:
        _log.warning("kept plan %s does not read and is ignored (%s); measuring again, and the new measurements "
                     "replace it", path, err)
        return None
    if data.get("seal") != seal(request, tape):
        _log.warning("kept plan %s was changed after dmlkit kept it (its seal does not match its numbers); "
                     "replaying it as it now reads (--replan measures again)", path)
    return tape


def replay_record(path: str | Path, tape_format: str) -> tuple[dict, list[dict], Path]:
    """``dmlkit train --plan PATH``: the request, the checked tape and the file of a run's ``resolved.json``
    (``path``: the file or its run folder); a ConfigError naming the file and the fault when it cannot replay."""
    path = Path(path)
    try:
        file = path / RESOLVED_FILE if path.is_dir() else path
        data = read_json(file)
    except FileNotFoundError:
        raise ConfigError(f"--plan {str(path)!r}: no such file; give a run folder or its resolved.json.") from None
    except RecordError as err:
        raise ConfigError(f"--plan: {err} A run's resolved.json was expected.") from None
    except OSError as err:
        raise ConfigError(f"--plan {short_repr(str(path))}: cannot be read ({err.strerror or err}).") from None
    measured = data.get("measurements")
    if not isinstance(measured, dict) or measured.get("format") != tape_format or not isinstance(data.get("request"), dict):
        raise ConfigError(f"--plan {str(file)!r} records no replayable plan (a run of an older dmlkit, or not "
                          "a dmlkit resolved.json): expected its 'request' and 'measurements'.")
    try:
        tape = check_tape(measured.get("tape"), f"--plan {str(file)!r}")
    except RecordError as err:
        raise ConfigError(f"{err} Nothing of it is replayed; to train from that run's settings, use "
                          "--config RUN/config.yaml.") from None
    if data.get(SEAL_KEY) != seal(data["request"], tape):
        _log.warning("--plan %s: its request or measurements were edited after the run wrote them (the seal does "
                     "not match); replaying them as they now read", file)
    return data["request"], tape, file


def decoded(decode: Callable[[Any], T], kept: Any, name: str, source: str) -> T:
    """``decode(kept)`` for the replayed measurement ``name``; a :class:`RecordError` naming the plan and the
    measurement when this dmlkit's decoder does not take it (a value edited into another object's fields)."""
    try:
        return decode(kept)
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError) as err:
        raise RecordError(f"the plan {source or 'given'} cannot be replayed: its {name!r} holds {short_repr(kept)}, "
                          f"which is not what this dmlkit records for it ({type(err).__name__}: {err}). Measure "
                          "again with --replan (it replaces a kept plan); for --plan RUN, start from the run's "
                          "settings with --config RUN/config.yaml.") from None


__all__ = ["ENTRY_KEYS", "KEPT_KEYS", "LARGEST", "SEAL_KEY", "SMALLEST", "check_tape", "decoded", "kept_tape",
           "replay_record", "seal", "value_problem"]
