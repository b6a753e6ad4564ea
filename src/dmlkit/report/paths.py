"""Paths in a report are relative to the run directory: a shared page never shows the machine's layout."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

# an absolute POSIX path not inside a word, URL or relative path: "/data/x" in "--set data.root=/data/x"
_ABSOLUTE = re.compile(r"(?<![\w.~/:-])/(?:[^\s\"'<>|,;=]+)")


def relative_paths(value: Any, run_dir: Path) -> Any:
    """``value`` with every absolute path in its strings rewritten relative to ``run_dir`` (recursing
    into dicts and lists; other values unchanged). ``/data/pets`` from ``/runs/a`` becomes ``../../data/pets``."""
    base = os.path.abspath(run_dir)

    def relative(match: re.Match) -> str:
        return Path(os.path.relpath(match.group(0), base)).as_posix()

    if isinstance(value, str):
        return _ABSOLUTE.sub(relative, value)
    if isinstance(value, dict):
        return {key: relative_paths(item, run_dir) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(relative_paths(item, run_dir) for item in value)
    return value


def shown_environment(env: dict[str, Any] | None, base: Path) -> dict[str, Any] | None:
    """``env.json`` as a page shows it: the command line as one string starting with the program's name
    (``dmlkit``, never the file path of ``__main__.py``), every path relative to ``base``."""
    if env is None:
        return None
    import shlex

    record = dict(env)
    command = record.get("command")
    if isinstance(command, list) and command:
        program = Path(str(command[0])).name
        program = "dmlkit" if program in ("__main__.py", "dmlkit") else program
        record["command"] = shlex.join([program] + [str(part) for part in command[1:]])
    return relative_paths(record, base)
