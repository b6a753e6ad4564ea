"""Paths from users and the environment, checked before the file system sees them.

``Path("~nosuchuser").expanduser()`` raises a bare ``RuntimeError`` and a name longer than the file
system allows fails deep inside the first ``stat`` or ``mkdir`` (``OSError: File name too long``);
both are said here, once, with the limit or the user named.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from dmlkit.exceptions import ConfigError


def _shown(text: str) -> str:
    """``text`` quoted, cut to its first 40 and last 20 characters when longer (a path of 5,000 is not shown)."""
    return repr(text if len(text) <= 64 else f"{text[:40]}...{text[-20:]}")

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


#: File-system refusals that are about the path a user gave (or its place), not a fault of dmlkit.
PATH_ERRNOS = {errno.ENAMETOOLONG: f"a name too long (at most {MAX_NAME_BYTES} bytes a name, {MAX_PATH_BYTES} a path)",
               errno.EROFS: "a read-only file system", errno.EACCES: "permission denied",
               errno.ELOOP: "too many symbolic links", errno.EISDIR: "a folder where a file was expected",
               errno.ENOTDIR: "a file where a folder was expected"}


def path_error(err: OSError) -> ConfigError | None:
    """``err`` as a ConfigError naming its file and the reason in words when it is one of :data:`PATH_ERRNOS`,
    else None (the caller re-raises: an unexpected failure keeps its traceback)."""
    reason = PATH_ERRNOS.get(err.errno)
    if reason is None:
        return None
    where = _shown(str(err.filename)) if err.filename is not None else "a file of this command"
    return ConfigError(f"{where}: {reason}. Choose another path (or fix its permissions) and run again.")


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
        raise ConfigError(f"{source}={_shown(text)}: {problem}.")
    return path


def dmlkit_cache() -> Path:
    """dmlkit's cache folder: ``$DMLKIT_CACHE``, else ``$XDG_CACHE_HOME/dmlkit`` (``~/.cache/dmlkit``)."""
    root = os.environ.get("DMLKIT_CACHE")
    if root:
        return expand_home(root, "DMLKIT_CACHE")
    return expand_home(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "XDG_CACHE_HOME") / "dmlkit"


def cache_folder(variable: str, default: str) -> Path | None:
    """The folder the environment variable ``variable`` names, ``dmlkit_cache() / default`` when it is unset or
    empty, or None when it says ``off`` (or ``0``, ``false``, ``no``): where a kind of kept record lives."""
    where = os.environ.get(variable, "")
    if where.strip().lower() in ("off", "0", "false", "no"):
        return None
    return expand_home(where, variable) if where else dmlkit_cache() / default


__all__ = ["MAX_NAME_BYTES", "MAX_PATH_BYTES", "PATH_ERRNOS", "cache_folder", "dmlkit_cache", "expand_home",
           "path_error", "path_problem"]
