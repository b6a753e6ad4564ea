"""Safe extraction of downloaded tar and zip archives.

Every member is checked from the archive's index before anything is written: a path that is
absolute or leaves the target folder (``..``), a symbolic or hard link, a device or FIFO, more
members than ``max_members`` or more declared bytes than ``max_bytes`` refuses the whole archive.
The members are then written into a staging folder inside the target (bytes counted as they are
written, so a header that under-states a size is caught too) and moved into place only when all
of them are out; a failure removes the staging folder and leaves what the target held untouched.

Nothing already in the target is removed or replaced: a member whose path the target holds as
another kind (a file where the archive has a folder, or the reverse) or with other bytes refuses the
archive, naming the paths, before anything is moved (files with the same bytes are left as they are).
The declared size is checked against the free space first, and staging folders left by a killed
extraction of the same archive are removed when a later one runs.
"""

from __future__ import annotations

import filecmp
import os
import shutil
import stat
import tarfile
import tempfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Callable, Iterator

from dmlkit.core.transfer import space_shortfall, write_failure
from dmlkit.exceptions import DataError

#: The most bytes one archive may expand to (the largest benchmark, SOP, is about 3 GB).
MAX_EXTRACTED_BYTES = 32 << 30
#: The most members one archive may hold (SOP has about 120,000 files).
MAX_MEMBERS = 1_000_000
_CHUNK = 1 << 20
_STAGING_SUFFIX = ".extracting"
#: What reading a damaged archive raises (a bad gzip stream is an OSError without an errno; an encrypted or
#: unsupported zip member a RuntimeError or NotImplementedError). Not ValueError: DataError is one.
_READ_ERRORS = (tarfile.TarError, zipfile.BadZipFile, zlib.error, EOFError, OSError, RuntimeError, NotImplementedError)


class _WriteFailed(Exception):
    """Writing an extracted member into the staging folder failed (the disk, not the archive)."""

    def __init__(self, err: OSError):
        super().__init__(str(err))
        self.err = err


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
        try:
            if member.is_dir:
                out.mkdir(parents=True, exist_ok=True)
                continue
            out.parent.mkdir(parents=True, exist_ok=True)
            dst = open(out, "wb")
        except OSError as err:
            raise _WriteFailed(err) from err
        with dst, member.open() as src:
            while chunk := src.read(_CHUNK):
                written += len(chunk)
                if written > max_bytes:
                    raise DataError(f"Archive '{archive}' expands to more than the {max_bytes:,} bytes allowed "
                                    f"(member {str(member.path)!r} is larger than its header says); refused, "
                                    "nothing was extracted.")
                try:
                    dst.write(chunk)
                except OSError as err:
                    raise _WriteFailed(err) from err


def _conflicts(src: Path, dst: Path) -> list[str]:
    """The paths of ``dst`` that moving ``src`` into it would remove or replace, each with why."""
    found = []
    for entry in sorted(src.iterdir()):
        target = dst / entry.name
        if not os.path.lexists(target):
            continue
        if entry.is_dir():
            if target.is_dir():
                found += _conflicts(entry, target)
            else:
                found.append(f"'{target}' is a file where the archive has a folder")
        elif target.is_dir():
            found.append(f"'{target}' is a folder where the archive has a file")
        elif not target.is_file() or not filecmp.cmp(entry, target, shallow=False):
            found.append(f"'{target}' differs from the archive's file")
    return found


def _merge(src: Path, dst: Path) -> None:
    """Move the tree ``src`` into ``dst``: new paths by one rename each, folders merged (checked by :func:`_conflicts`)."""
    for entry in src.iterdir():
        target = dst / entry.name
        if entry.is_dir() and target.is_dir():
            _merge(entry, target)
        elif not os.path.lexists(target):  # an existing file has the same bytes: it stays as it is
            os.replace(entry, target)


def _remove_stale_staging(archive: Path, target: Path) -> None:
    """Remove staging folders of ``archive`` in ``target`` whose extracting process is gone (killed runs)."""
    prefix = f".{archive.name}."
    for entry in target.iterdir():
        name = entry.name
        if not (name.startswith(prefix) and name.endswith(_STAGING_SUFFIX) and entry.is_dir()):
            continue
        pid = name[len(prefix):].split(".", 1)[0]
        if pid.isdigit() and _alive(int(pid)):
            continue  # another process is extracting the same archive right now
        shutil.rmtree(entry, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, owned by someone else
    return True


def extract_archive(archive: str | os.PathLike, target: str | os.PathLike, *,
                    max_bytes: int = MAX_EXTRACTED_BYTES, max_members: int = MAX_MEMBERS) -> list[str]:
    """Extract the tar (any compression) or zip file ``archive`` into ``target``; return the top-level names.

    The kind is read from the file's content, not its name. Refusals (see the module docstring) are
    :class:`DataError` naming the archive and the member or path at fault; nothing is written for them.
    """
    archive, target = Path(archive), Path(target)
    try:
        return _extract(archive, target, max_bytes, max_members)
    except OSError as err:  # the target folder itself (created, listed, renamed into): never the archive's bytes
        raise DataError(f"Archive '{archive}' could not be extracted: {write_failure(err, target)}; "
                        "nothing was extracted.") from err


def _extract(archive: Path, target: Path, max_bytes: int, max_members: int) -> list[str]:
    target.mkdir(parents=True, exist_ok=True)
    try:
        if zipfile.is_zipfile(archive):
            opened: tarfile.TarFile | zipfile.ZipFile = zipfile.ZipFile(archive)
            read = _zip_members
        else:
            opened = tarfile.open(archive, "r:*")
            read = _tar_members
    except _READ_ERRORS as err:
        raise DataError(f"'{archive}' is neither a zip nor a tar archive, or it is damaged ({err}).") from err
    with opened:
        try:
            members = [m for m in read(archive, opened) if str(m.path) != "."]  # type: ignore[arg-type]
        except _READ_ERRORS as err:
            raise DataError(f"Archive '{archive}' is damaged ({err}); nothing was extracted.") from err
        _check_totals(members, archive, max_bytes, max_members)
        _remove_stale_staging(archive, target)
        declared = sum(m.size for m in members)
        short = space_shortfall(target, declared)
        if short is not None:  # a sparse or highly compressed member would otherwise write until the disk is full
            raise DataError(f"Archive '{archive}' declares {declared:,} bytes of members: {short}. Free some space "
                            "or extract elsewhere; nothing was extracted.")
        staging = Path(tempfile.mkdtemp(prefix=f".{archive.name}.{os.getpid()}.", suffix=_STAGING_SUFFIX, dir=target))
        try:
            try:
                _write_members(members, staging, archive, max_bytes)
            except _WriteFailed as failed:
                raise DataError(f"Archive '{archive}' could not be extracted: "
                                f"{write_failure(failed.err, target, declared)}; nothing was extracted.") from None
            except _READ_ERRORS as err:
                raise DataError(f"Archive '{archive}' is damaged ({err}); nothing was extracted.") from err
            conflicts = _conflicts(staging, target)
            if conflicts:
                raise DataError(
                    f"Archive '{archive}' would replace what '{target}' already holds: " + "; ".join(conflicts[:5])
                    + (f"; and {len(conflicts) - 5} more" if len(conflicts) > 5 else "")
                    + ". Nothing was extracted and nothing removed: move these away (or extract into another "
                    "folder) and run again.")
            tops = sorted(p.name for p in staging.iterdir())
            _merge(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return tops
