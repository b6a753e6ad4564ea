"""``DIR/report.html`` of a sweep: validation MAP@R against each parameter and the best trials.

Built from ``DIR/sweep.json`` alone (no Optuna needed), as one self-contained page with
matplotlib figures embedded as base64 PNG.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from dmlkit.engine.checkpoint_files import atomic_write_text
from dmlkit.engine.run_layout import REPORT_FILE
from dmlkit.report.figures import figure_to_base64_png, new_figure
from dmlkit.report.html import esc, figure, note, page, table
from dmlkit.sweep.space import parse_param
from dmlkit.sweep.study import load_sweep

BEST_ROWS = 10


def _complete(trials: Sequence[dict]) -> list[dict]:
    return [t for t in trials if t["state"] == "COMPLETE" and t["value"] is not None]


def _axis_values(values: list[Any], kind: str) -> tuple[np.ndarray, list[str] | None]:
    """Numeric positions for a parameter's values; categorical choices get indices and tick labels."""
    if kind == "choice":
        labels = sorted({str(v) for v in values})
        return np.array([labels.index(str(v)) for v in values], dtype=float), labels
    return np.array(values, dtype=float), None


def score_vs_parameter_png(trials: Sequence[dict], spec_text: str, best_number: int | None) -> str:
    """Scatter of validation MAP@R (y) against one parameter (x; log axis for log ranges), best trial starred."""
    spec = parse_param(spec_text)
    done = [t for t in _complete(trials) if spec.path in t["params"]]
    fig = new_figure(4.2, 3.0)
    ax = fig.add_subplot(1, 1, 1)
    if done:
        x, labels = _axis_values([t["params"][spec.path] for t in done], spec.kind)
        y = np.array([t["value"] for t in done])
        ax.scatter(x, y, s=22, color="#0969da", alpha=0.8, label="trials")
        best = [i for i, t in enumerate(done) if t["number"] == best_number]
        if best:
            ax.scatter(x[best], y[best], s=140, marker="*", color="#cf222e", label="best", zorder=3)
        if labels is not None:
            ax.set_xticks(range(len(labels)), labels)
        elif spec.log:
            ax.set_xscale("log")
        ax.legend(loc="best", fontsize=8)
    ax.set_xlabel(spec.path)
    ax.set_ylabel("validation MAP@R")
    ax.grid(alpha=0.3)
    return figure_to_base64_png(fig)


def history_png(trials: Sequence[dict]) -> str:
    """Validation MAP@R of each complete trial by trial number, with the best-so-far line."""
    done = sorted(_complete(trials), key=lambda t: t["number"])
    fig = new_figure(5.0, 3.0)
    ax = fig.add_subplot(1, 1, 1)
    if done:
        numbers = np.array([t["number"] for t in done])
        values = np.array([t["value"] for t in done])
        ax.scatter(numbers, values, s=20, color="#0969da", label="trial")
        ax.step(numbers, np.maximum.accumulate(values), where="post", color="#cf222e", label="best so far")
        ax.legend(loc="best", fontsize=8)
    ax.set_xlabel("trial")
    ax.set_ylabel("validation MAP@R")
    ax.grid(alpha=0.3)
    return figure_to_base64_png(fig)


def pair_png(trials: Sequence[dict], first: str, second: str) -> str:
    """Two numeric parameters against each other, coloured by validation MAP@R (cf. ASAP Fig. 2)."""
    a, b = parse_param(first), parse_param(second)
    done = [t for t in _complete(trials) if a.path in t["params"] and b.path in t["params"]]
    fig = new_figure(4.8, 3.4)
    ax = fig.add_subplot(1, 1, 1)
    if done:
        x = np.array([t["params"][a.path] for t in done], dtype=float)
        y = np.array([t["params"][b.path] for t in done], dtype=float)
        points = ax.scatter(x, y, c=[t["value"] for t in done], cmap="viridis", s=40)
        fig.colorbar(points, ax=ax, label="validation MAP@R")
        if a.log:
            ax.set_xscale("log")
        if b.log:
            ax.set_yscale("log")
    ax.set_xlabel(a.path)
    ax.set_ylabel(b.path)
    ax.grid(alpha=0.3)
    return figure_to_base64_png(fig)


def build_sweep_html(summary: dict, title: str) -> str:
    """The report page for a sweep summary (the content of ``sweep.json``)."""
    trials, space, best = summary["trials"], summary["space"], summary["best"]
    best_number = best["number"] if best else None
    paths = [parse_param(s).path for s in space]
    counts = ", ".join(f"{n} {state.lower()}" for state, n in sorted(summary["counts"].items())) or "no trials"
    subtitle = f"objective: {summary['objective']}; sampler: {summary['sampler']}; {counts}"
    if best:
        shown = ", ".join(f"{k} = {v}" for k, v in best["params"].items())
        overview = f"<p>Best: trial {best['number']}, validation MAP@R <b>{best['value']:.4f}</b> ({esc(shown)}).</p>"
    else:
        overview = note("No trial has completed yet.")
    overview += "<pre>" + "\n".join(f"--param {esc(s)}" for s in space) + "</pre>"
    overview += figure(history_png(trials), "validation MAP@R by trial", "Each complete trial's validation MAP@R.")
    plots = "".join(
        figure(score_vs_parameter_png(trials, s, best_number), f"validation MAP@R against {parse_param(s).path}")
        for s in space
    )
    numeric = [s for s in space if parse_param(s).kind != "choice"]
    if len(numeric) == 2:
        plots += figure(pair_png(trials, *numeric), "parameter pair", "Both searched parameters, coloured by score.")
    ranked = sorted(_complete(trials), key=lambda t: (-t["value"], t["number"]))[:BEST_ROWS]
    header = ["trial", "val MAP@R", *paths, "best step", "seconds", "run directory"]
    rows = [[t["number"], t["value"], *[t["params"].get(p) for p in paths], t["best_step"],
             t["duration_seconds"], t["run_dir"]] for t in ranked]
    best_table = table(header, rows, numeric_columns=range(1, 2 + len(paths) + 2)) if rows else note("No complete trial.")
    others = [t for t in trials if t["state"] != "COMPLETE"]
    other_rows = [[t["number"], t["state"], "interrupted" if t["interrupted"] else (t["error"] or "")] for t in others]
    other_html = table(["trial", "state", "reason"], other_rows) if other_rows else note("Every trial completed.")
    sections = [
        ("overview", "Search", overview),
        ("parameters", "Score against each parameter", plots),
        ("best", "Best trials", best_table),
        ("other", "Pruned, failed and interrupted trials", other_html),
    ]
    return page(title, subtitle, sections)


def write_sweep_report(sweep_dir: str | Path) -> Path:
    """Write ``DIR/report.html`` from ``DIR/sweep.json``; returns its path."""
    sweep_dir = Path(sweep_dir)
    summary = load_sweep(sweep_dir)
    path = sweep_dir / REPORT_FILE
    atomic_write_text(path, build_sweep_html(summary, f"Sweep {sweep_dir.name}"))
    return path


__all__ = ["build_sweep_html", "write_sweep_report"]
