"""Run records of the claims runner: read back and checked as a whole before anything uses them.

A record (``OUT/runs/<arm>/<seed or tune>/<tag>.json``) is what a finished run leaves; a later call
(or a fresh clone holding the committed records) reads it instead of training again. A record that
is not a regular file, not JSON, not an object, or whose fields have the wrong type is refused with
a :class:`~dmlkit.exceptions.DataError` naming the file and what was expected: never half-used.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from dmlkit.exceptions import DataError

#: Fields every record has, with the type each must have (numbers are finite).
RECORD_FIELDS: dict[str, type | tuple[type, ...]] = {
    "arm": str, "seed": int, "point": dict, "steps": int, "budget_steps": int, "best_step": int,
    "start": dict, "val_curve": list, "selected_val_map_at_r": float, "test": dict, "projections": list,
    "wall_seconds": float,
}
_FIX = "delete it to train that run again"


def _type_name(expected: type | tuple[type, ...]) -> str:
    names = {int: "an integer", float: "a number", str: "a string", dict: "a JSON object", list: "a JSON list"}
    kinds = expected if isinstance(expected, tuple) else (expected,)
    return " or ".join(names[k] for k in kinds)


def _is(value: object, expected: type | tuple[type, ...]) -> bool:
    kinds = expected if isinstance(expected, tuple) else (expected,)
    if isinstance(value, bool):
        return False
    if float in kinds and isinstance(value, (int, float)):
        return math.isfinite(value)
    return isinstance(value, kinds)


def _numbers(path: Path, where: str, mapping: object) -> None:
    if not isinstance(mapping, dict) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                 and math.isfinite(v) for v in mapping.values()):
        raise DataError(f"claims record {str(path)!r}: {where} must be a JSON object of finite numbers; {_FIX}.")


def check_record(record: object, path: Path) -> dict:
    """``record`` if it has every field of :data:`RECORD_FIELDS` with its type, else a DataError naming ``path``."""
    if not isinstance(record, dict):
        raise DataError(f"claims record {str(path)!r} holds a JSON {type(record).__name__}; expected a JSON object "
                        f"(a run record written by the claims runner); {_FIX}.")
    for key, expected in RECORD_FIELDS.items():
        if key not in record:
            raise DataError(f"claims record {str(path)!r} has no {key!r}; expected a run record written by the claims "
                            f"runner; {_FIX}.")
        if not _is(record[key], expected):
            raise DataError(f"claims record {str(path)!r}: {key!r} must be {_type_name(expected)}; got "
                            f"{type(record[key]).__name__} {record[key]!r:.40}; {_FIX}.")
    _numbers(path, "'start.val'", record["start"].get("val"))
    if "map_at_r" not in record["start"]["val"]:
        raise DataError(f"claims record {str(path)!r}: 'start.val' has no 'map_at_r'; {_FIX}.")
    _numbers(path, "'test'", record["test"])
    for point in record["val_curve"]:
        if not isinstance(point, dict) or not all(_is(point.get(k), float) for k in ("step", "map_at_r", "time")):
            raise DataError(f"claims record {str(path)!r}: every 'val_curve' entry must be an object with numeric "
                            f"'step', 'map_at_r' and 'time'; {_FIX}.")
    return record


def read_record(path: Path) -> dict:
    """Read and check one run record (:func:`check_record`); a link, folder, unreadable or non-JSON file is refused."""
    if path.is_symlink():
        raise DataError(f"claims record {str(path)!r} is a symbolic link; expected a file the claims runner wrote; "
                        f"{_FIX}.")
    if path.is_dir():
        raise DataError(f"claims record {str(path)!r} is a folder; expected a JSON file; {_FIX}.")
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"claims record {str(path)!r} is not valid JSON ({exc}); {_FIX}.") from None
    except RecursionError:
        raise DataError(f"claims record {str(path)!r} is nested too deeply to be a run record; {_FIX}.") from None
    except OSError as exc:
        raise DataError(f"claims record {str(path)!r} cannot be read ({exc.strerror or exc}).") from None
    return check_record(record, path)


def check_out_folder(out: Path) -> None:
    """``out`` must be a folder (new or from an earlier claims run): made here, or a DataError naming it."""
    if out.exists() and not out.is_dir():
        raise DataError(f"claims --out {str(out)!r} is a file; expected a folder (new, or one an earlier claims run "
                        "wrote).")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(f"claims --out {str(out)!r} cannot be made a folder ({exc.strerror or exc}).") from None


__all__ = ["RECORD_FIELDS", "check_out_folder", "check_record", "read_record"]
