"""Atomic checkpoint files that are only ever loaded with ``weights_only=True``.

A checkpoint is written to a temporary file in the same directory, flushed and fsync'ed,
then renamed over the target (``os.replace`` is atomic on POSIX), so a crash while writing
leaves the previous checkpoint intact and a partial file is never loaded.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any, BinaryIO, Callable

import torch

from dmlkit.exceptions import CheckpointError, RecordError, StorageError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


#: ``errno`` values that mean "no room for this write": disk full, quota exceeded, file-size limit.
OUT_OF_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def raise_if_out_of_space(err: OSError, path: str | Path, needed: int | None = None) -> None:
    """Turn a disk-full ``err`` met while writing ``path`` into a :class:`StorageError` naming the path, the
    bytes needed and the bytes free; any other error is left to the caller."""
    if err.errno not in OUT_OF_SPACE:
        return
    path = Path(path)
    try:
        free = f"{shutil.disk_usage(path.parent).free:,} bytes free there"
    except OSError:
        free = "free space unknown"
    need = f"{needed:,} bytes needed, " if needed is not None else ""
    reason = "file-size limit reached" if err.errno == errno.EFBIG else os.strerror(err.errno).lower()
    raise StorageError(f"cannot write {str(path)!r}: {reason} ({need}{free}). Nothing was lost: the file keeps "
                       "its previous version, if it had one (writes are atomic). Free some space and run the command again "
                       "(a training continues with --resume RUN_DIR).") from None


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temp file + fsync + rename)."""
    atomic_write_with(path, lambda f: f.write(data), len(data))


def atomic_write_with(path: str | Path, write: Callable[[BinaryIO], Any], size: int | None = None) -> None:
    """Let ``write(file)`` fill ``path`` atomically (temp file + fsync + rename): a large payload (``torch.save`` of
    a feature store) streams to disk without a copy in memory; ``size``: the bytes expected (for a disk-full error)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as err:
        raise_if_out_of_space(err, path, size)
        raise
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600 files; results should read like any other file
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(err, OSError):
            raise_if_out_of_space(err, path, size)
        raise
    try:  # make the rename durable
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def open_for_append(path: str | Path) -> io.TextIOWrapper:
    """``path`` opened to append UTF-8 text (created if absent), only when it is a plain file of its own: a
    symbolic link, a folder, a FIFO or device, or a file with other hard links is a :class:`RecordError`
    naming it, so a run never writes through a link into a file it did not create."""
    path = Path(path)
    nonblocking = getattr(os, "O_NONBLOCK", 0)  # POSIX flags; Windows has none of them (and no FIFOs or links to fear)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | nonblocking | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise RecordError(f"{str(path)!r} is a symbolic link; dmlkit writes this file itself and never through "
                              "a link (it could be someone's file). Remove the link and run again.") from None
        if err.errno == errno.EISDIR:
            raise RecordError(f"{str(path)!r} is a folder where dmlkit writes a file; move it away and run "
                              "again.") from None
        if err.errno == errno.ENXIO:  # a FIFO no one reads (O_NONBLOCK: never waits for a reader)
            raise RecordError(f"{str(path)!r} is not a plain file; dmlkit writes there only a file of its own. "
                              "Remove it and run again.") from None
        raise_if_out_of_space(err, path)
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
        os.close(fd)
        what = "has other hard links (it is also another file)" if stat.S_ISREG(info.st_mode) else "is not a plain file"
        raise RecordError(f"{str(path)!r} {what}; dmlkit writes there only a file of its own. Remove it and run "
                          "again.")
    if nonblocking:
        os.set_blocking(fd, True)
    return os.fdopen(fd, "a", encoding="utf-8")


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write text atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any) -> None:
    """Write JSON atomically (sorted keys, indented)."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def save_checkpoint(path: str | Path, state: dict) -> None:
    """Serialise ``state`` with ``torch.save`` and write it atomically."""
    buf = io.BytesIO()
    torch.save(state, buf)
    atomic_write_bytes(path, buf.getvalue())


def load_checkpoint(path: str | Path) -> dict:
    """Load a checkpoint safely (``weights_only=True``); errors name the file and the cause."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"Checkpoint {str(path)!r} does not exist.")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # truncated, corrupted, or contains non-tensor objects
        raise CheckpointError(
            f"Checkpoint {str(path)!r} cannot be read safely (truncated, corrupted, or not a dmlkit checkpoint): {exc}"
        ) from None
    if not isinstance(state, dict) or "format" not in state or state.get("format") != "dmlkit-checkpoint-1":
        raise CheckpointError(f"Checkpoint {str(path)!r} is not a dmlkit checkpoint (missing format tag).")
    return state


def config_fingerprint(config: dict, ignore: tuple[str, ...] = ("train", "eval", "name")) -> str:
    """Hash of the parts of a config that determine parameter shapes and the data split."""
    kept = {k: v for k, v in config.items() if k not in ignore}
    text = json.dumps(kept, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
