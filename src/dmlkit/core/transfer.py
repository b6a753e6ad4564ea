"""What dmlkit's downloads and extractions share: folders, free space, URLs opened with their redirects.

The callers (data set downloads, archive extraction, weight downloads) raise their own error type
with these sentences, so a read-only, full or mistyped folder is told the same way everywhere.
"""

from __future__ import annotations

import errno
import os
import shutil
import urllib.request
from pathlib import Path
from typing import Any

#: ``errno`` values that mean "no room for this write": disk full, quota exceeded, file-size limit.
OUT_OF_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def free_bytes(folder: str | os.PathLike) -> int | None:
    """Bytes free to this user on the file system holding ``folder`` (None when it cannot be asked)."""
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def space_shortfall(folder: str | os.PathLike, needed: int) -> str | None:
    """Why ``needed`` more bytes do not fit in ``folder`` (with both numbers), or None when they do."""
    free = free_bytes(folder)
    if free is None or needed <= free:
        return None
    return f"{needed:,} bytes are needed but '{folder}' has only {free:,} bytes free"


def folder_problem(path: str | os.PathLike) -> str | None:
    """Why ``path`` cannot be made into (or used as) a writable folder, or None after making it.

    Creates the folder and its parents; the answer names the path component at fault (a file where
    a folder must be, a folder that refuses writes) rather than repeating the OS's errno text only.
    """
    path = Path(path)
    for parent in (path, *path.parents):
        if os.path.lexists(parent) and not parent.is_dir():
            return (f"'{parent}' is a file, not a folder" if parent == path
                    else f"'{path}' cannot be created: '{parent}' is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        return f"'{path}' cannot be created ({err.strerror or err})"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"'{path}' is not writable by this user"
    return None


def write_failure(err: OSError, folder: str | os.PathLike, needed: int | None = None) -> str:
    """What an ``OSError`` met while writing into ``folder`` means for the user (full disk: the numbers)."""
    if err.errno in OUT_OF_SPACE:
        free = free_bytes(folder)
        parts = [f"{needed:,} bytes needed" if needed is not None else "",
                 f"{free:,} bytes free there" if free is not None else ""]
        numbers = ", ".join(p for p in parts if p)
        return f"the disk holding '{folder}' is full ({os.strerror(err.errno).lower()}{'; ' + numbers if numbers else ''})"
    return f"'{folder}' cannot be written ({err.strerror or err})"


class _RecordedRedirects(urllib.request.HTTPRedirectHandler):
    """urllib's redirect handling, keeping the URLs it was sent to (so messages name the one that answered)."""

    def __init__(self, chain: list[str]):
        self.chain = chain

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]
        self.chain.append(newurl)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def open_url(request: str | urllib.request.Request, chain: list[str], timeout: float) -> Any:
    """``urlopen(request)``, appending to ``chain`` each URL a redirect leads to."""
    return urllib.request.build_opener(_RecordedRedirects(chain)).open(request, timeout=timeout)


def answered_by(url: str, chain: list[str]) -> str:
    """``url``, and the URL its redirects led to when they did (``url -> final``)."""
    return " -> ".join([url, *chain[-1:]])
