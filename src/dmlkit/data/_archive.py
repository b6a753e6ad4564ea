"""Safe extraction of downloaded tar and zip archives.

Every member is checked from the archive's index before anything is written: a path that is
absolute or leaves the target folder (``..``), a symbolic or hard link, a device or FIFO, more
members than ``max_members`` or more declared bytes than ``max_bytes`` refuses the whole archive.
The members are then written into a staging folder inside the target (bytes counted as they are
written, so a header that under-states a size is caught too) and moved into place only when all
of them are out; a failure removes the staging folder and leaves what the target held untouched.
"""

from __future__ import annotations

import os
import shutil
import stat
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Callable, Iterator

from dmlkit.exceptions import DataError

#: The most bytes one archive may expand to (the largest benchmark, SOP, is about 3 GB).
MAX_EXTRACTED_BYTES = 32 << 30
#: The most members one archive may hold (SOP has about 120,000 files).
MAX_MEMBERS = 1_000_000
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Member:
    """One archive entry: its checked relative path, kind, declared size and a reader of its bytes."""

    path: PurePosixPath
    is_dir: bool
    size: int
    open: Callable[[], IO[bytes]]


def _checked_path(name: str, archive: Path) -> PurePosixPath:
    """``name`` as a relative POSIX path inside the target, or a DataError for one that would leave it."""
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":") or "\\" in name:
        raise DataError(f"Archive '{archive}' has member {name!r} with an absolute or Windows path; refused, "
                        "nothing was extracted.")
    parts = [p for p in PurePosixPath(name).parts if p not in ("", ".")]
    if ".." in parts:
        raise DataError(f"Archive '{archive}' has member {name!r}, which leaves the target folder ('..'); refused, "
                        "nothing was extracted.")
    return PurePosixPath(*parts) if parts else PurePosixPath(".")


def _link_error(archive: Path, name: str, kind: str) -> DataError:
    return DataError(f"Archive '{archive}' has member {name!r}, a {kind}; links and special files are refused, "
                     "nothing was extracted.")


def _tar_members(archive: Path, tar: tarfile.TarFile) -> Iterator[Member]:
    for info in tar.getmembers():
        if info.issym() or info.islnk():
            raise _link_error(archive, info.name, "symbolic link" if info.issym() else "hard link")
        if not (info.isfile() or info.isdir()):
            raise _link_error(archive, info.name, "device, FIFO or other special file")
        yield Member(_checked_path(info.name, archive), info.isdir(), info.size,
                     lambda info=info: tar.extractfile(info))  # type: ignore[misc]


def _zip_members(archive: Path, zf: zipfile.ZipFile) -> Iterator[Member]:
    for info in zf.infolist():
        kind = stat.S_IFMT(info.external_attr >> 16) if info.create_system == 3 else 0  # Unix file type bits
        if kind == stat.S_IFLNK:
            raise _link_error(archive, info.filename, "symbolic link")
        if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
            raise _link_error(archive, info.filename, "device, FIFO or other special file")
        yield Member(_checked_path(info.filename, archive), info.is_dir(), info.file_size,
                     lambda info=info: zf.open(info))


def _check_totals(members: list[Member], archive: Path, max_bytes: int, max_members: int) -> None:
    if len(members) > max_members:
        raise DataError(f"Archive '{archive}' has {len(members):,} members, more than the {max_members:,} allowed; "
                        "refused, nothing was extracted.")
    total = sum(m.size for m in members)
    if total > max_bytes:
        raise DataError(f"Archive '{archive}' would expand to {total:,} bytes, more than the {max_bytes:,} allowed; "
                        "refused, nothing was extracted.")


def _write_members(members: list[Member], staging: Path, archive: Path, max_bytes: int) -> None:
    written = 0
    for member in members:
        out = staging / member.path
        if member.is_dir:
            out.mkdir(parents=True, exist_ok=True)
            continue
        out.parent.mkdir(parents=True, exist_ok=True)
        with member.open() as src, open(out, "wb") as dst:
            while chunk := src.read(_CHUNK):
                written += len(chunk)
                if written > max_bytes:
                    raise DataError(f"Archive '{archive}' expands to more than the {max_bytes:,} bytes allowed "
                                    f"(member {str(member.path)!r} is larger than its header says); refused, "
                                    "nothing was extracted.")
                dst.write(chunk)


def _merge(src: Path, dst: Path) -> None:
    """Move the tree ``src`` into ``dst`` (folders merged, files replaced one rename each)."""
    for entry in src.iterdir():
        target = dst / entry.name
        if entry.is_dir() and target.is_dir():
            _merge(entry, target)
        else:
            if target.is_dir():
                shutil.rmtree(target)
            os.replace(entry, target)


def extract_archive(archive: str | os.PathLike, target: str | os.PathLike, *,
                    max_bytes: int = MAX_EXTRACTED_BYTES, max_members: int = MAX_MEMBERS) -> list[str]:
    """Extract the tar (any compression) or zip file ``archive`` into ``target``; return the top-level names.

    The kind is read from the file's content, not its name. Refusals (see the module docstring) are
    :class:`DataError` naming the archive and the member at fault; nothing is written for them.
    """
    archive, target = Path(archive), Path(target)
    target.mkdir(parents=True, exist_ok=True)
    if zipfile.is_zipfile(archive):
        opened: tarfile.TarFile | zipfile.ZipFile = zipfile.ZipFile(archive)
        read = _zip_members
    else:
        try:
            opened = tarfile.open(archive, "r:*")
        except (tarfile.TarError, OSError) as err:
            raise DataError(f"'{archive}' is neither a zip nor a tar archive, or it is damaged ({err}).") from err
        read = _tar_members
    with opened:
        try:
            members = [m for m in read(archive, opened) if str(m.path) != "."]  # type: ignore[arg-type]
        except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError) as err:
            raise DataError(f"Archive '{archive}' is damaged ({err}); nothing was extracted.") from err
        _check_totals(members, archive, max_bytes, max_members)
        staging = Path(tempfile.mkdtemp(prefix=f".{archive.name}.", suffix=".extracting", dir=target))
        try:
            try:
                _write_members(members, staging, archive, max_bytes)
            except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError) as err:
                raise DataError(f"Archive '{archive}' is damaged ({err}); nothing was extracted.") from err
            tops = sorted(p.name for p in staging.iterdir())
            _merge(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return tops
