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


def _table_after(text: str, heading: str) -> list[list[str]]:
    """The rows (cells stripped) of the first table after ``heading``, its header and separator dropped."""
    rest = text[text.index(heading):]
    lines = [line for line in rest.splitlines() if line.startswith("|")]
    start = rest.splitlines().index(lines[0])
    rows = []
    for line in rest.splitlines()[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows[2:]


#: The README's short names of the machines of docs/results.md's table.
README_MACHINES = {"Xeon, fp32": "CPU-fp32", "bf16 CPU": "CPU-bf16"}


def test_readme_table_matches_the_results_page() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    results = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    measured = _table_after(readme, "## Measured")
    by_data = {row[0]: row for row in _table_after(results, "## `dmlkit train` on each data set")}
    assert len(measured) >= 4
    for data, model, map_at_r, wall, machine in measured:
        assert data in by_data, f"README row {data!r} has no row in docs/results.md's table"
        _, their_model, their_map, their_wall, their_machine = by_data[data]
        assert model == their_model, data
        numbers = re.findall(r"\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?", map_at_r)
        assert numbers and all(number in their_map for number in numbers), (data, map_at_r, their_map)
        assert wall == their_wall, (data, wall, their_wall)
        assert their_machine.startswith(README_MACHINES[machine]), (data, machine, their_machine)
    # the sorted-split figures the README quotes in its prose
    for data, figure in (("Pets, `data.class_split=sorted`", "0.803"), ("mini-ImageNet, `data.class_split=sorted`", "0.484")):
        assert figure in readme and by_data[data][2].startswith(figure), data
