"""User documentation reads as documentation: no development history, no unreadable lines.

README.md and docs/**/*.md say what a command does and what it measured (command, machine,
number), not which work session or issue changed it; the package's comments likewise.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
HISTORY = re.compile(r"\b(?:sessions? [0-9]|issue [0-9])", re.I)

#: Pages allowed a few such mentions (none: the history is in the commits and closing notes).
PENDING: dict[str, int] = {}

#: Code files allowed a few 'session N' / 'issue N' references (none).
SOURCE_PENDING: dict[str, int] = {}


def _relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_user_docs_name_no_work_sessions() -> None:
    counts = {_relative(p): len(HISTORY.findall(p.read_text(encoding="utf-8"))) for p in PAGES}
    over = {page: n for page, n in counts.items() if n > PENDING.get(page, 0)}
    assert not over, f"development history ('session N' / 'issue N') in user docs: {over}"


def test_code_comments_name_no_sessions_or_issues() -> None:
    """The package, its scripts, benchmarks and tests (this file's patterns excepted)."""
    files = [p for folder in ("src/dmlkit", "scripts", "benchmarks", "tests") for p in (ROOT / folder).rglob("*")
             if p.suffix in {".py", ".yaml", ".sh"} and p != Path(__file__).resolve()]
    counts = {_relative(p): len(HISTORY.findall(p.read_text(encoding="utf-8"))) for p in files}
    over = {name: n for name, n in counts.items() if n > SOURCE_PENDING.get(name, 0)}
    assert not over, f"'session N' / 'issue N' in code comments: {over}"


def test_architecture_prose_lines_stay_readable() -> None:
    # The module map was one table whose rows ran to thousands of characters; prose and lists are wrapped.
    lines = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8").splitlines()
    long = [number for number, line in enumerate(lines, 1) if len(line) > 200]
    assert not long, f"docs/architecture.md lines over 200 characters: {long}"
