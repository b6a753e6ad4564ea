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
    """Every array of an ``.npz`` file (no pickles); a DataError names a missing or unreadable ``what``
    (empty, truncated, bit-flipped, not a zip archive, an array that is not plain data)."""
    import numpy as np

    p = Path(path)
    if not p.is_file():
        raise DataError(f"{what} {str(path)!r} does not exist.")
    if p.stat().st_size == 0:
        raise DataError(f"{what} {str(path)!r} is empty (0 bytes); was it copied completely?")
    try:
        _check_npz_sizes(p)
        with np.load(p, allow_pickle=False) as z:
            if not hasattr(z, "files"):
                raise ValueError("it holds a single array, not an .npz archive of named arrays")
            return {k: z[k] for k in z.files}
    except (MemoryError, DataError):
        raise
    except Exception as exc:  # zipfile.BadZipFile (truncated, bad CRC), EOFError, zlib.error, ValueError, OSError
        reason = str(exc)[:200] or type(exc).__name__
        raise DataError(f"{what} {str(path)!r} is not a readable .npz file (truncated or corrupted?): {reason}") from None


def _check_npz_sizes(path: Path) -> None:
    """Refuse an ``.npz`` member whose header declares more bytes than the member holds (a damaged header
    would otherwise make numpy allocate the declared size before reading a byte)."""
    import zipfile

    import numpy as np
    from numpy.lib import format as npy

    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            with archive.open(info) as f:
                version = npy.read_magic(f)
                read_header = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
                shape, _, dtype = read_header(f)
                declared = int(np.prod(shape, dtype=object)) * dtype.itemsize
                held = info.file_size - f.tell()
                if declared > held:
                    raise DataError(f"{str(path)!r} is damaged: its array {info.filename!r} declares shape {shape} "
                                    f"({declared:,} bytes) but holds {held:,} bytes.")


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
