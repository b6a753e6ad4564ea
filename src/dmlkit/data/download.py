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
"""

from __future__ import annotations

import hashlib
import http.client
import os
import sys
from pathlib import Path
from typing import Any, Callable
from urllib.error import HTTPError, URLError
from urllib.request import Request, urlopen

from dmlkit.data._archive import MAX_EXTRACTED_BYTES, MAX_MEMBERS, extract_archive
from dmlkit.data.sources import DOWNLOADS, ArchiveSource, DatasetSource
from dmlkit.exceptions import DataError

#: The most bytes one downloaded file may have (the largest archive, SOP's zip, is about 3 GB).
MAX_DOWNLOAD_BYTES = 16 << 30
#: Folder under the data set root holding transfers in progress and finished archives.
DOWNLOAD_DIR = ".dmlkit-downloads"
_CHUNK = 1 << 20


class _Interrupted(Exception):
    """A transfer ended before the length the server announced."""


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
            got = file_checksum(path, algorithm)
            if got != expected.lower():
                return f"{algorithm} {got}, but the published {algorithm} of {archive.filename} is {expected}"
    return None


def _transfer(url: str, part: Path, *, progress: bool, max_bytes: int, timeout: float) -> None:
    """Append the rest of ``url`` to ``part`` (a Range request when ``part`` has bytes); raise on a cut."""
    have = part.stat().st_size if part.exists() else 0
    headers = {"User-Agent": "dmlkit"}
    if have:
        headers["Range"] = f"bytes={have}-"
    try:
        response = urlopen(Request(url, headers=headers), timeout=timeout)
    except HTTPError as err:
        if err.code == 416 and have:  # nothing left to send: the part file is already whole
            return
        raise
    with response:
        status = getattr(response, "status", 200)
        content_range = response.headers.get("Content-Range", "")
        if have and not (status == 206 and content_range.startswith(f"bytes {have}-")):
            have = 0  # the server sent the whole file: start over
        length = response.headers.get("Content-Length")
        total = have + int(length) if length is not None else None
        if total is not None and total > max_bytes:
            raise DataError(f"{url} is {total:,} bytes, more than the {max_bytes:,} a download may have; refused.")
        from tqdm.auto import tqdm

        with open(part, "ab" if have else "wb") as out, tqdm(
            total=total, initial=have, unit="B", unit_scale=True, desc=part.name[: -len(".part")],
            disable=not progress, leave=False, dynamic_ncols=True,
        ) as bar:
            while chunk := response.read(_CHUNK):
                have += len(chunk)
                if have > max_bytes:
                    raise DataError(f"{url} sent more than the {max_bytes:,} bytes a download may have; refused.")
                out.write(chunk)
                bar.update(len(chunk))
        if total is not None and have < total:
            raise _Interrupted(f"connection closed after {have:,} of {total:,} bytes")


def fetch(archive: ArchiveSource, folder: str | os.PathLike, *, urls: tuple[str, ...] | None = None,
          progress: bool = True, retries: int = 5, max_bytes: int = MAX_DOWNLOAD_BYTES,
          timeout: float = 60.0) -> Path:
    """Download ``archive`` into ``folder``, verified; return the final path.

    Each URL is tried in turn; an interrupted transfer is resumed from its ``.part`` file (up to
    ``retries`` times while it makes progress). A complete file whose checksum differs is deleted
    and the next URL is tried; when none gives the file, a :class:`DataError` lists what each did.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    final, part = folder / archive.filename, folder / f"{archive.filename}.part"
    if final.is_file() and checksum_problem(final, archive) is None:
        return final
    failures = []
    for url in urls or archive.urls:
        attempts = 0
        while True:
            before = part.stat().st_size if part.exists() else 0
            try:
                _transfer(url, part, progress=progress, max_bytes=max_bytes, timeout=timeout)
            except (_Interrupted, http.client.HTTPException, TimeoutError, ConnectionError) as err:
                attempts += 1
                grew = part.exists() and part.stat().st_size > before
                if grew and attempts <= retries:
                    continue  # resume from where it stopped
                kept = f" (the partial file '{part}' is kept; run again to resume)" if part.exists() else ""
                failures.append(f"{url}: {err}{kept}")
                break
            except (HTTPError, URLError, OSError) as err:
                failures.append(f"{url}: {getattr(err, 'reason', err)}")
                break
            problem = checksum_problem(part, archive)
            if problem is None:
                os.replace(part, final)
                return final
            part.unlink()
            failures.append(f"{url}: the downloaded file has {problem}; it was deleted")
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
    if not source.archives:
        print_terms(source, echo)
        raise DataError(f"{name} cannot be downloaded by dmlkit.\n{source.manual}")
    if root.is_dir() and not count_problems(name, root, source.expected):
        echo(f"{name}: '{root}' already holds a complete copy; nothing to download.")
        return _info(name, root, source)
    print_terms(source, echo)
    if confirm is not None and not confirm():
        raise DataError(f"{name}: the terms of use were not accepted; nothing was downloaded.")
    root.mkdir(parents=True, exist_ok=True)
    show = sys.stderr.isatty() if progress is None else progress
    try:
        paths = [_obtain(a, root, mirror, progress=show, max_bytes=max_download_bytes) for a in source.archives]
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
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()


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
