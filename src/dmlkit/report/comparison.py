"""Self-contained HTML page comparing runs: overlaid curves, one metrics table, config differences."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Sequence

from dmlkit.core.validation import Interval, validate_params
from dmlkit.engine.run_layout import REPORT_FILE
from dmlkit.exceptions import InvalidParameterError
from dmlkit.report import html
from dmlkit.report.figures import comparison_curves_figure, figure_html
from dmlkit.report.paths import relative_paths, shown_environment
from dmlkit.report.run_reader import RunData, flatten_mapping, load_run
from dmlkit.report.run_report import (
    METRIC_NAMES,
    describe_run,
    metric_label,
    ordered_metric_keys,
    write_text_atomic,
)


def run_labels(runs: Sequence[RunData]) -> list[str]:
    """A distinct label per run: its name, with the directory (then position) added on clashes."""
    names = [run.name for run in runs]
    labels = [f"{name} ({run.run_dir.name})" if names.count(name) > 1 else name for name, run in zip(names, runs)]
    for i, label in enumerate(list(labels)):
        if labels.count(label) > 1:
            labels[i] = f"{label} #{i + 1}"
    return labels


def best_rows(column: list[float | None]) -> set[int]:
    """Rows holding the largest finite value of a higher-is-better column (none when all tie)."""
    finite = [v for v in column if v is not None and math.isfinite(v)]
    if len(finite) < 2 or min(finite) == max(finite):
        return set()
    top = max(finite)
    return {i for i, v in enumerate(column) if v == top}


def metrics_table(runs: Sequence[RunData], labels: Sequence[str]) -> str:
    """Runs as rows, metrics as columns (union over runs); best standard metric in bold."""
    values = [run.metric_values() for run in runs]
    keys = ordered_metric_keys(set().union(*values))
    if not keys:
        return html.note("None of the runs has numeric metrics.")
    rows, bold = [], set()
    for r, (label, run, vals) in enumerate(zip(labels, runs, values)):
        rows.append([label, str(run.metrics.get("selected_on", "—"))] + [vals.get(k, "—") for k in keys])
    for c, key in enumerate(keys, start=2):
        if key in METRIC_NAMES:
            bold |= {(r, c) for r in best_rows([v.get(key) for v in values])}
    header = ["run", "selected on"] + [metric_label(k) for k in keys]
    note = html.note("Bold: best run per standard metric (higher is better). — : not reported by that run.")
    return html.table(header, rows, numeric_columns=range(2, len(header)), bold_cells=bold) + note


def difference_table(mappings: Sequence[dict[str, Any] | None], labels: Sequence[str], what: str) -> str:
    """Keys as rows, runs as columns; keys whose values differ come first, highlighted."""
    flats = [flatten_mapping(m) if m is not None else {} for m in mappings]
    keys = sorted(set().union(*flats))
    if not keys:
        return html.note(f"No run has a {what}.")

    def differs(key: str) -> bool:
        cells = [json.dumps(f[key], sort_keys=True, default=str) if key in f else "(absent)" for f in flats]
        return len(set(cells)) > 1

    differing = [k for k in keys if differs(k)]
    same = [k for k in keys if k not in differing]
    header = ["key"] + list(labels)

    def rows(selected: list[str]) -> list[list[Any]]:
        return [[k] + [f[k] if k in f else "(absent)" for f in flats] for k in selected]

    missing = [label for label, m in zip(labels, mappings) if m is None]
    body = html.note(f"No {what} for: {', '.join(missing)}.") if missing else ""
    if differing:
        body += f"<p>{len(differing)} of {len(keys)} keys differ between the runs (highlighted).</p>"
        body += html.table(header, rows(differing), row_classes=["differs"] * len(differing))
    else:
        body += html.note(f"All {len(keys)} keys are identical across the runs.")
    if same:
        body += (f"<details><summary>{len(same)} identical keys</summary>"
                 + html.table(header, rows(same)) + "</details>")
    return body


def runs_list(runs: Sequence[RunData], labels: Sequence[str], out_dir: Path) -> str:
    """One line per run: label, description, directory (relative to the page), and a link to its report."""
    items = []
    for label, run in zip(labels, runs):
        report = run.run_dir / REPORT_FILE
        link = ""
        if report.is_file():
            href = Path(os.path.relpath(report.resolve(), out_dir.resolve())).as_posix()
            link = f' — <a href="{html.esc(href)}">report</a>'
        items.append(f"<li><strong>{html.esc(label)}</strong>: {html.esc(describe_run(run))} "
                     f"<code>{html.esc(_relative_to(run.run_dir, out_dir))}</code>{link}</li>")
    return f"<ul>{''.join(items)}</ul>"


def _relative_to(path: Path, out_dir: Path) -> str:
    return Path(os.path.relpath(Path(path).resolve(), Path(out_dir).resolve())).as_posix()


def build_comparison_html(runs: Sequence[RunData], out_dir: Path, dpi: int = 192) -> str:
    """The comparison page of ``runs`` as an HTML string (see :func:`write_comparison`); paths in it are
    relative to ``out_dir`` (the page's folder)."""
    labels = run_labels(runs)
    curves = figure_html(
        comparison_curves_figure(runs, labels), "training curves of all runs overlaid, each quantity on its own axes",
        "MAP@R and R@1 of the validation evaluations by step (dashed when a run only logged test evaluations), "
        "the smoothed training loss by step, and MAP@R by wall-clock time.", dpi,
    )
    sections = [
        ("runs", "Runs", runs_list(runs, labels, out_dir)),
        ("metrics", "Test metrics", metrics_table(runs, labels)),
        ("curves", "Training curves", curves),
        ("config", "Configuration differences",
         difference_table([relative_paths(r.config, out_dir) for r in runs], labels, "config")),
        ("environment", "Environment differences",
         difference_table([shown_environment(r.env, out_dir) for r in runs], labels, "environment record (env.json)")),
    ]
    return html.page(f"dmlkit comparison of {len(runs)} runs", " · ".join(labels), sections)


def write_comparison(run_dirs: Sequence[str | Path], out_path: str | Path, *, dpi: int = 192) -> Path:
    """Write one self-contained HTML page comparing the runs in ``run_dirs``; returns ``out_path``.

    Sections (by ``id``): ``runs``, ``metrics`` (runs as rows), ``curves`` (overlaid by step
    and by wall-clock time), ``config`` and ``environment`` (differing keys highlighted).
    """
    if isinstance(run_dirs, (str, os.PathLike)) or len(run_dirs) == 0:
        raise InvalidParameterError(
            f"The 'run_dirs' parameter of write_comparison must be a non-empty list of run directories. "
            f"Got {run_dirs!r} instead."
        )
    validate_params("write_comparison", {"dpi": dpi}, {"dpi": [Interval(int, 20, 400)]})
    runs = [load_run(d) for d in run_dirs]
    target = Path(out_path)
    write_text_atomic(target, build_comparison_html(runs, target.parent, dpi))
    return target
