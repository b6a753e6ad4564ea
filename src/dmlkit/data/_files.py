"""Helpers for reading annotation files with errors that name the file, line and layout."""

from __future__ import annotations

import os
from pathlib import Path

from dmlkit.exceptions import DataError


def find_root(root: str | os.PathLike, marker: str, subdirs: tuple[str, ...]) -> Path:
    """The directory under ``root`` that holds ``marker``: ``root`` itself or one of ``subdirs``."""
    root = Path(root)
    for candidate in (root, *(root / s for s in subdirs)):
        if (candidate / marker).exists():
            return candidate
    return root


def read_npz(path: str | os.PathLike, what: str = "file") -> dict:
    """Every array of an ``.npz`` file (no pickles); a DataError names a missing or unreadable ``what``."""
    import numpy as np

    p = Path(path)
    if not p.is_file():
        raise DataError(f"{what} {str(path)!r} does not exist.")
    try:
        with np.load(p, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (ValueError, OSError) as exc:
        raise DataError(f"{what} {str(path)!r} is not a readable .npz file: {exc}") from None


def missing_file_error(dataset: str, path: Path, layout: str, hint: str = "") -> DataError:
    extra = f" {hint}" if hint else ""
    return DataError(f"{dataset}: expected file '{path}' was not found.{extra} Expected layout: {layout}")


def read_table(
    path: Path, dataset: str, layout: str, num_columns: int, *, header: str | None = None, skip: int = 0
) -> list[list[str]]:
    """Rows of a whitespace-separated text file, each with exactly ``num_columns`` fields.

    ``skip`` lines are dropped first; a line equal to ``header`` (split on whitespace) is
    dropped too. Any other row with the wrong field count raises a :class:`DataError`
    naming the file, the line number and the expected layout.
    """
    if not path.is_file():
        raise missing_file_error(dataset, path, layout)
    rows = []
    header_fields = header.split() if header else None
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if number <= skip:
                continue
            fields = line.split()
            if not fields or fields == header_fields:
                continue
            if len(fields) != num_columns:
                raise DataError(
                    f"{dataset}: line {number} of '{path}' has {len(fields)} fields but {num_columns} were expected "
                    f"({line.strip()!r}). Expected layout: {layout}"
                )
            rows.append(fields)
    if not rows:
        raise DataError(f"{dataset}: '{path}' has no entries. Expected layout: {layout}")
    return rows


def to_int(value: str, path: Path, dataset: str, what: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise DataError(f"{dataset}: '{path}' has {what} {value!r}, which is not an integer.") from None
