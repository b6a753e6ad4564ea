"""Fetch a benchmark into its official layout: terms, resumable download, checksum, safe extraction, counts.

``download_dataset("cub200", root)`` is what ``dmlkit datasets download cub200 --root ROOT``,
``data.download=true`` and the PML-named data sets' ``download=True`` run:

1. print the data set's terms of use (``sources.DOWNLOADS``) and ask ``confirm`` when given;
2. for each archive: reuse ``ROOT/<file>`` or a finished download when its checksum matches, else
   fetch it into ``ROOT/.dmlkit-downloads/<file>.part`` (HTTP ``Range`` resumes an interrupted
   transfer, within the call and across calls), verify the published md5/sha256, then rename it to
   its final name (a file that fails the checksum is deleted: resuming wrong bytes cannot fix them);
3. extract it with :func:`dmlkit.data._archive.extract_archive` (links, paths leaving the folder
   and archives over the size cap refused before anything is written);
4. check the image and class counts per split against the published ones (``dataset_info``).

Every failure is one :class:`DataError` naming what is at fault: a root that is a file or not
writable, a malformed mirror URL, too little free space for the announced size (checked before the
transfer, with both numbers), a disk that fills up during it (the partial file is deleted to give
its space back), a server that sends more than the cap (the partial file is deleted, the next URL
tried). A redirect to another host is said (``echo``) and errors name the URL that answered.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import sys
from pathlib import Path
from typing import Any, Callable
from urllib.error import HTTPError, URLError
from urllib.parse import urlparse
from urllib.request import Request

from dmlkit.core.transfer import answered_by, folder_problem, open_url, space_shortfall, write_failure
from dmlkit.data._archive import MAX_EXTRACTED_BYTES, MAX_MEMBERS, extract_archive
from dmlkit.data.sources import DOWNLOADS, ArchiveSource, DatasetSource
from dmlkit.exceptions import DataError, DmlkitError

#: The most bytes one downloaded file may have (the largest archive, SOP's zip, is about 3 GB).
MAX_DOWNLOAD_BYTES = 16 << 30
#: Folder under the data set root holding transfers in progress and finished archives.
DOWNLOAD_DIR = ".dmlkit-downloads"
_CHUNK = 1 << 20


class _Interrupted(Exception):
    """A transfer ended before the length the server announced."""


class _Refused(Exception):
    """The server sent more than a download may have (its partial file is worth nothing)."""


class _NoSpace(Exception):
    """The announced size does not fit on the disk, or the disk filled up while writing."""


def _host(url: str) -> str:
    try:
        return urlparse(url).netloc
    except ValueError:
        return url


def _content_length(value: str | None) -> int | None:
    """The announced body length, or None when the header is absent or not a non-negative integer."""
    if value is None or not value.strip().isdigit():
        return None  # http.client reads such a body to the end of the connection; the checksum decides
    return int(value)


def file_checksum(path: str | os.PathLike, algorithm: str) -> str:
    """Hex digest (``md5`` or ``sha256``) of the file at ``path``, read in 1 MiB chunks."""
    digest = hashlib.new(algorithm, usedforsecurity=False)
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def checksum_problem(path: str | os.PathLike, archive: ArchiveSource) -> str | None:
    """Why ``path`` is not ``archive`` (its md5/sha256 differs from the published one), or None."""
    for algorithm in ("sha256", "md5"):
        expected = getattr(archive, algorithm)
        if expected:
            try:
                got = file_checksum(path, algorithm)
            except OSError as err:
                raise DataError(f"'{path}' cannot be read ({err.strerror or err}); check its permissions.") from err
            if got != expected.lower():
                return f"{algorithm} {got}, but the published {algorithm} of {archive.filename} is {expected}"
    return None


def _transfer(url: str, part: Path, *, progress: bool, max_bytes: int, timeout: float, chain: list[str]) -> None:
    """Append the rest of ``url`` to ``part`` (a Range request when ``part`` has bytes); raise on a cut.

    ``chain`` receives the URLs redirects led to.
    """
    have = part.stat().st_size if part.exists() else 0
    headers = {"User-Agent": "dmlkit"}
    if have:
        headers["Range"] = f"bytes={have}-"
    try:
        response = open_url(Request(url, headers=headers), chain, timeout)
    except HTTPError as err:
        if err.code == 416 and have:  # nothing left to send: the part file is already whole
            return
        raise
    with response:
        status = getattr(response, "status", 200)
        content_range = response.headers.get("Content-Range", "")
        if have and not (status == 206 and content_range.startswith(f"bytes {have}-")):
            have = 0  # the server sent the whole file: start over
        length = _content_length(response.headers.get("Content-Length"))
        total = have + length if length is not None else None
        if total is not None and total > max_bytes:
            raise _Refused(f"is {total:,} bytes, more than the {max_bytes:,} a download may have; refused")
        short = space_shortfall(part.parent, total - have) if total is not None else None
        if short is not None:
            raise _NoSpace(f"{answered_by(url, chain)} announces {total:,} bytes: {short}")
        from tqdm.auto import tqdm

        with open(part, "ab" if have else "wb") as out, tqdm(
            total=total, initial=have, unit="B", unit_scale=True, desc=part.name[: -len(".part")],
            disable=not progress, leave=False, dynamic_ncols=True,
        ) as bar:
            while chunk := response.read(_CHUNK):
                have += len(chunk)
                if have > max_bytes:
                    raise _Refused(f"sent more than the {max_bytes:,} bytes a download may have; refused")
                try:
                    out.write(chunk)
                except OSError as err:
                    raise _NoSpace(f"writing '{part}' failed: {write_failure(err, part.parent, total)}") from err
                bar.update(len(chunk))
        if total is not None and have < total:
            raise _Interrupted(f"connection closed after {have:,} of {total:,} bytes")


def fetch(archive: ArchiveSource, folder: str | os.PathLike, *, urls: tuple[str, ...] | None = None,
          progress: bool = True, retries: int = 5, max_bytes: int = MAX_DOWNLOAD_BYTES,
          timeout: float = 60.0, echo: Callable[[str], Any] | None = None) -> Path:
    """Download ``archive`` into ``folder``, verified; return the final path.

    Each URL is tried in turn; an interrupted transfer is resumed from its ``.part`` file (up to
    ``retries`` times while it makes progress). A complete file whose checksum differs, or a body
    over ``max_bytes``, is deleted and the next URL is tried; when none gives the file, a
    :class:`DataError` lists what each did. Too little free space stops at once (no URL can help).
    ``echo`` is told when a URL redirects to another host.
    """
    folder = Path(folder)
    problem = folder_problem(folder)
    if problem is not None:
        raise DataError(f"Cannot download {archive.filename}: {problem}. Move what is in the way, or choose "
                        "another root that is a folder you can write to.")
    final, part = folder / archive.filename, folder / f"{archive.filename}.part"
    if final.is_file() and checksum_problem(final, archive) is None:
        return final
    failures = []
    for url in urls or archive.urls:
        attempts = 0
        while True:
            before = part.stat().st_size if part.exists() else 0
            chain: list[str] = []
            try:
                _transfer(url, part, progress=progress, max_bytes=max_bytes, timeout=timeout, chain=chain)
            except (_Interrupted, http.client.HTTPException, TimeoutError, ConnectionError) as err:
                attempts += 1
                grew = part.exists() and part.stat().st_size > before
                if grew and attempts <= retries:
                    continue  # resume from where it stopped
                kept = f" (the partial file '{part}' is kept; run again to resume)" if part.exists() else ""
                failures.append(f"{answered_by(url, chain)}: {err}{kept}")
                break
            except _Refused as err:
                part.unlink(missing_ok=True)
                failures.append(f"{answered_by(url, chain)} {err}; the partial file was deleted")
                break
            except _NoSpace as err:
                if err.__cause__ is not None:  # writing failed mid-transfer (a full disk): give the space back
                    part.unlink(missing_ok=True)
                    raise DataError(f"Could not download {archive.filename}: {err}. The partial file was deleted; "
                                    "free some space (or make the folder writable) and run again.") from None
                kept = f" (the partial file '{part}' is kept to resume)" if part.exists() else ""
                raise DataError(f"Could not download {archive.filename}: {err}. Free some space or choose another "
                                f"root, and run again{kept}.") from None
            except (HTTPError, URLError, OSError, ValueError) as err:  # ValueError: a URL urllib cannot open
                failures.append(f"{answered_by(url, chain)}: {getattr(err, 'reason', err)}")
                break
            if chain and echo is not None and _host(chain[-1]) != _host(url):
                echo(f"{url} redirected to another host: {chain[-1]}")
            problem = checksum_problem(part, archive)
            if problem is None:
                os.replace(part, final)
                return final
            part.unlink()
            failures.append(f"{answered_by(url, chain)}: the downloaded file has {problem}; it was deleted")
            break
    raise DataError(f"Could not download {archive.filename} ({archive.origin}):\n  " + "\n  ".join(failures))


def _source(name: str) -> DatasetSource:
    return DOWNLOADS.get(name)  # type: ignore[return-value]


def count_problems(name: str, root: str | os.PathLike, expected: dict[str, tuple[int, int]] | None = None) -> list[str]:
    """Why the copy of ``name`` at ``root`` is not complete: the reader's errors, missing files, wrong counts."""
    from dmlkit.data.info import dataset_info

    info = dataset_info(name, root, published=expected)
    problems = list(info["problems"])
    if info["matches_published"] is False and not problems:
        problems.append(f"{name} at '{root}' does not have the published image and class counts.")
    return problems


def print_terms(source: DatasetSource, echo: Callable[[str], Any] = print) -> None:
    """Print the data set's title, homepage and terms of use (before anything is downloaded)."""
    echo(f"{source.title}\n{source.homepage}\n\nTerms of use:\n{source.terms}\n")


def _obtain(archive: ArchiveSource, root: Path, mirror: str | None, **fetch_args: Any) -> Path:
    """A verified copy of ``archive``: one the user put in ``root``, a finished download, or a new one."""
    given = root / archive.filename
    if given.is_file():
        problem = checksum_problem(given, archive)
        if problem is None:
            return given
        raise DataError(f"'{given}' has {problem}. Remove it or replace it with the right file.")
    urls = archive.urls if mirror is None else (f"{mirror.rstrip('/')}/{archive.filename}", *archive.urls)
    return fetch(archive, root / DOWNLOAD_DIR, urls=urls, **fetch_args)


def _check_mirror(mirror: str) -> None:
    """Refuse a mirror that is not a URL folder urllib can open (empty, malformed, no host, another scheme)."""
    try:
        parsed = urlparse(mirror.strip())
        parsed.port  # noqa: B018  a port that is not a number raises here
    except ValueError as err:
        raise DataError(f"The mirror URL {mirror!r} is malformed ({err}); give a URL folder such as "
                        "https://host/path (--mirror).") from None
    if parsed.scheme not in ("http", "https", "ftp", "file") or (parsed.scheme != "file" and not parsed.hostname):
        raise DataError(f"The mirror URL {mirror!r} is not an http(s), ftp or file URL with a host; give a URL folder "
                        "such as https://host/path (--mirror).")


def download_dataset(
    name: str,
    root: str | os.PathLike,
    *,
    confirm: Callable[[], bool] | None = None,
    mirror: str | None = None,
    source: DatasetSource | None = None,
    progress: bool | None = None,
    keep_archives: bool = False,
    max_download_bytes: int = MAX_DOWNLOAD_BYTES,
    max_extracted_bytes: int = MAX_EXTRACTED_BYTES,
    max_members: int = MAX_MEMBERS,
    echo: Callable[[str], Any] = print,
) -> dict[str, Any]:
    """Get data set ``name`` into ``root`` in its official layout; return its ``dataset_info``.

    Does nothing but the count check when ``root`` already holds a complete copy. Prints the terms
    of use first; ``confirm()`` returning False stops before anything is fetched (None: proceed, as
    pytorch-metric-learning does). ``mirror`` is a URL folder tried first for every file (the
    published checksums still apply). ``source`` replaces the :data:`~dmlkit.data.sources.DOWNLOADS`
    entry (tests, private mirrors). A data set without downloadable archives raises a
    :class:`DataError` with its manual instructions; so do a failed transfer, a wrong checksum, a
    refused archive and counts that differ from the published ones.
    """
    source = source or _source(name)
    root = Path(root)
    if mirror is not None:
        _check_mirror(mirror)
    if not source.archives:
        print_terms(source, echo)
        raise DataError(f"{name} cannot be downloaded by dmlkit.\n{source.manual}")
    if root.is_dir() and not count_problems(name, root, source.expected):
        echo(f"{name}: '{root}' already holds a complete copy; nothing to download.")
        return _info(name, root, source)
    print_terms(source, echo)
    if confirm is not None and not confirm():
        raise DataError(f"{name}: the terms of use were not accepted; nothing was downloaded.")
    problem = folder_problem(root)
    if problem is not None:
        raise DataError(f"{name}: cannot download into the data set root: {problem}. Choose a root (--root, "
                        "data.root, or the data set class's root) that is a folder you can write to; nothing was "
                        "downloaded.")
    try:
        return _download(name, root, source, mirror, progress, keep_archives, max_download_bytes,
                         max_extracted_bytes, max_members, echo)
    except OSError as err:
        if isinstance(err, DmlkitError):
            raise
        # renames and clean-ups inside the root; the transfers and extraction say their own failures
        raise DataError(f"{name}: {write_failure(err, err.filename or root)}; what '{root}' held before is kept.") \
            from err


def _download(name: str, root: Path, source: DatasetSource, mirror: str | None, progress: bool | None,
              keep_archives: bool, max_download_bytes: int, max_extracted_bytes: int, max_members: int,
              echo: Callable[[str], Any]) -> dict[str, Any]:
    show = sys.stderr.isatty() if progress is None else progress
    try:
        paths = [_obtain(a, root, mirror, progress=show, max_bytes=max_download_bytes, echo=echo)
                 for a in source.archives]
    finally:
        _remove_if_empty(root / DOWNLOAD_DIR)
    for archive, path in zip(source.archives, paths):
        if archive.extract:
            echo(f"extracting {archive.filename} into '{root}'")
            extract_archive(path, root, max_bytes=max_extracted_bytes, max_members=max_members)
            if not keep_archives and path.parent.name == DOWNLOAD_DIR:
                path.unlink()
        elif path != root / archive.filename:
            os.replace(path, root / archive.filename)
    _remove_if_empty(root / DOWNLOAD_DIR)
    problems = count_problems(name, root, source.expected)
    if problems:
        raise DataError(f"{name}: the extracted copy at '{root}' is not complete:\n  " + "\n  ".join(problems))
    echo(f"{name}: '{root}' holds the published image and class counts.")
    return _info(name, root, source)


def _remove_if_empty(folder: Path) -> None:
    try:
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
    except OSError:
        pass  # tidying only: an empty folder left behind harms nothing


def _info(name: str, root: Path, source: DatasetSource) -> dict[str, Any]:
    from dmlkit.data.info import dataset_info

    return dataset_info(name, root, published=source.expected)


def ensure_dataset(name: str, root: str | os.PathLike | None, download: bool) -> None:
    """``data.download=true``: fetch ``name`` into ``root`` when the reader cannot read it there."""
    from dmlkit.data.info import root_problems

    if not download or name not in DOWNLOADS or root is None:
        return
    if root_problems(name, root):
        download_dataset(name, root)
