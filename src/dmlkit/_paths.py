"""Paths from users and the environment, checked before the file system sees them.

``Path("~nosuchuser").expanduser()`` raises a bare ``RuntimeError`` and a name longer than the file
system allows fails deep inside the first ``stat`` or ``mkdir`` (``OSError: File name too long``);
both are said here, once, with the limit or the user named.
"""

from __future__ import annotations

import os
from pathlib import Path

from dmlkit.exceptions import ConfigError

#: Bytes in one file or folder name (POSIX ``NAME_MAX`` on Linux, macOS and Windows' NTFS alike).
MAX_NAME_BYTES = 255
#: Bytes in a whole path (Linux's ``PATH_MAX``).
MAX_PATH_BYTES = 4096


def path_problem(text: str) -> str | None:
    """Why ``text`` cannot name a file here (a name or the whole path too long), or None."""
    size = len(os.fsencode(text))
    if size >= MAX_PATH_BYTES:
        return f"the path is {size} bytes long; the file system takes paths under {MAX_PATH_BYTES} bytes"
    longest = max(Path(text).parts, key=lambda part: len(os.fsencode(part)), default="")
    if len(os.fsencode(longest)) > MAX_NAME_BYTES:
        return (f"its part {longest[:40]!r}... is {len(os.fsencode(longest))} bytes long; a file or folder name "
                f"takes at most {MAX_NAME_BYTES} bytes")
    return None


def expand_home(text: str, source: str) -> Path:
    """``text`` with a leading ``~`` or ``~user`` expanded, as ``Path.expanduser``; ``source`` (an option or an
    environment variable) is named in the ConfigError for an unknown user, a home that cannot be found, or a
    path too long (:func:`path_problem`)."""
    try:
        path = Path(text).expanduser()
    except RuntimeError:  # ~user of no such user, or no HOME and no password entry
        user = text[1:].split(os.sep, 1)[0] or "the current user"
        raise ConfigError(f"{source}={text!r}: the home folder of {user!r} is not known on this machine; expected "
                          "a path under ~/ (your home), ~USER/ of an existing user, or an absolute path.") from None
    problem = path_problem(str(path))
    if problem is not None:
        raise ConfigError(f"{source}={text[:80]!r}...: {problem}.")
    return path


__all__ = ["MAX_NAME_BYTES", "MAX_PATH_BYTES", "expand_home", "path_problem"]
