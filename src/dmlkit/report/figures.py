"""Matplotlib figures of training curves and ASAP projections, encoded as base64 PNG.

Figures are built on ``matplotlib.figure.Figure`` with the Agg canvas directly, so making a
report never touches pyplot's global state or the user's chosen backend.
"""

from __future__ import annotations

import base64
import io
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from dmlkit.evaluation.metrics import CURVES
from dmlkit.report.run_reader import RunData

DEFAULT_DPI = 192  # 2x PNG: figures are shown at 96 CSS px per inch
CURVE_METRICS = CURVES


def new_figure(width: float, height: float) -> Figure:
    """A figure of ``width`` x ``height`` inches attached to an Agg canvas."""
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def figure_to_base64_png(fig: Figure, dpi: int = DEFAULT_DPI) -> str:
    """Render ``fig`` as PNG (no metadata, so output is reproducible) and base64-encode it."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, metadata={"Software": None})
    return base64.b64encode(buffer.getvalue()).decode("ascii")


@dataclass
class Series:
    """One curve: x values (steps or seconds) and y values, NaN where unknown."""

    steps: np.ndarray
    times: np.ndarray
    values: np.ndarray


def _column(records: Sequence[dict], key: str) -> np.ndarray:
    out = np.full(len(records), np.nan)
    for i, record in enumerate(records):
        value = record.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[i] = float(value)
    return out


def train_loss_series(run: RunData) -> Series:
    """Training loss against step and wall-clock time from ``kind == "train"`` records."""
    records = run.records_of("train")
    return Series(_column(records, "step"), _column(records, "time"), _column(records, "loss"))


def curve_split(run: RunData) -> str | None:
    """The eval split drawn as the learning curve: ``val`` when logged, else ``test``, else None."""
    for split in ("val", "test"):
        if run.records_of("eval", split=split):
            return split
    return None


def eval_series(run: RunData, split: str, metric: str) -> Series:
    """``metric`` of the ``split`` evaluations against step and wall-clock time."""
    records = run.records_of("eval", split=split)
    return Series(_column(records, "step"), _column(records, "time"), _column(records, metric))


def time_axis(max_seconds: float) -> tuple[float, str]:
    """Divisor and label for wall-clock axes: seconds, minutes or hours by the run's length."""
    if not math.isfinite(max_seconds) or max_seconds <= 180:
        return 1.0, "wall-clock time (s)"
    if max_seconds <= 3 * 3600:
        return 60.0, "wall-clock time (min)"
    return 3600.0, "wall-clock time (h)"


def moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over ``window`` points, ignoring NaNs (same length as ``values``)."""
    if window <= 1 or values.size == 0:
        return values
    finite = np.isfinite(values)
    sums = np.cumsum(np.where(finite, values, 0.0))
    counts = np.cumsum(finite.astype(np.float64))
    sums[window:] = sums[window:] - sums[:-window]
    counts[window:] = counts[window:] - counts[:-window]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


RAW_COLOR = "#9ab8d8"
SMOOTH_COLOR = "#1f5fa8"
SELECTED_COLOR = "#bc4c00"
MIN_FONT_PT = 10.0  # 13.3 CSS px at the figure's own width; figures are 7.5 in = 720 CSS px wide
CSS_PX_PER_INCH = 96


def smoothing_window(num_points: int) -> int:
    """Trailing-mean window for a loss curve: about a fifth of the points (>= 1), at most 50."""
    return max(1, min(50, num_points // 5))


def _plot_loss(ax, series: Series, x: np.ndarray, label: str | None = None, color=None) -> None:
    window = smoothing_window(len(series.values))
    if label is None:  # one run: raw points faint, the trailing mean on top
        ax.plot(x, series.values, color=RAW_COLOR, linewidth=0.8, marker="o", markersize=2.5, alpha=0.6,
                label="loss per logged step")
        if window > 1:
            ax.plot(x, moving_average(series.values, window), color=SMOOTH_COLOR, linewidth=1.8,
                    label=f"loss, mean of {window}")
    else:
        ax.plot(x, moving_average(series.values, window), linewidth=1.4, label=label, color=color)


def style_axes(ax, xlabel: str, ylabel: str, title: str) -> None:
    """Labelled axes, a light grid and fonts no smaller than :data:`MIN_FONT_PT`."""
    ax.set_xlabel(xlabel, fontsize=MIN_FONT_PT + 1)
    ax.set_ylabel(ylabel, fontsize=MIN_FONT_PT + 1)
    ax.set_title(title, fontsize=MIN_FONT_PT + 2)
    ax.tick_params(labelsize=MIN_FONT_PT)
    ax.grid(alpha=0.3)


def figure_html(fig: Figure, alt: str, caption: str | None = None, dpi: int = 2 * CSS_PX_PER_INCH,
                data: dict | None = None) -> str:
    """``fig`` as a ``<figure>`` shown at ``width_in * 96`` CSS px (a 2x PNG at the default ``dpi``).

    The ``<figure>`` carries ``data-axes`` (every axes' x and y labels, ``|`` between axes) and
    ``data-min-font-px`` (the smallest text at the figure's own width) so tests can check them.
    """
    from dmlkit.report import html

    fig.canvas.draw()
    axes = [ax for ax in fig.axes if ax.get_visible() and ax.axison]
    labels = "|".join(f"{ax.get_xlabel()};{ax.get_ylabel()}" for ax in axes)
    sizes = [t.get_fontsize() for t in fig.findobj(lambda a: hasattr(a, "get_text") and hasattr(a, "get_fontsize"))
             if t.get_visible() and str(t.get_text()).strip()]
    attributes = {"axes": labels, "min-font-px": f"{min(sizes, default=MIN_FONT_PT) * CSS_PX_PER_INCH / 72:.1f}"}
    attributes.update(data or {})
    width = round(fig.get_figwidth() * CSS_PX_PER_INCH)
    return html.figure(figure_to_base64_png(fig, dpi), alt, caption, width=width, data=attributes)


def _mark_step(ax, step: int | None) -> None:
    if step is not None:
        ax.axvline(step, color=SELECTED_COLOR, linestyle="--", linewidth=1.2, label=f"selected step {step}")


def selected_step(run: RunData) -> int | None:
    """The step whose weights the run kept (``best_step`` of metrics.json), if recorded."""
    step = run.metrics.get("best_step")
    return int(step) if isinstance(step, (int, float)) and not isinstance(step, bool) else None


def run_curves_figure(run: RunData) -> tuple[Figure | None, list[str]]:
    """Panels on their own axes: eval MAP@R, eval R@1, then (when train records were logged) training loss
    (raw and smoothed) and learning rate, each with the selected step marked (dashed). Returns the figure
    (``None`` when the log has nothing to draw)
    and notes."""
    notes: list[str] = []
    loss = train_loss_series(run)
    split = curve_split(run)
    if loss.values.size == 0 and split is None:
        return None, ["log.jsonl has no train or eval records; no curves to draw."]
    if loss.values.size == 0:
        notes.append("log.jsonl has no train records (the run was shorter than train.log_every); no loss or "
                     "learning-rate panels.")
    if split is None:
        notes.append("log.jsonl has no eval records; the MAP@R and R@1 panels are empty.")
    elif split == "test":
        notes.append("No validation evaluations were logged; the curves show the test split.")
    best = selected_step(run)
    has_loss = loss.values.size > 0
    fig = new_figure(7.5, 6.2 if has_loss else 3.6)
    axes = fig.subplots(2 if has_loss else 1, 2, squeeze=False)
    for ax, (metric, label) in zip(axes[0], CURVE_METRICS):
        if split is not None:
            series = eval_series(run, split, metric)
            if np.isfinite(series.values).any():
                ax.plot(series.steps, series.values, marker="o", markersize=4, color="C0",
                        label=f"{split} {label}")
            test = eval_series(run, "test", metric) if split != "test" else Series(*(np.empty(0),) * 3)
            if np.isfinite(test.values).any():
                ax.plot(test.steps[-1:], test.values[-1:], marker="s", markersize=6, linestyle="none",
                        color="C3", label=f"test {label} (selected weights)")
        _mark_step(ax, best)
        style_axes(ax, "step", f"{split or 'eval'} {label}", f"{label} by step")
    if has_loss:
        _plot_loss_and_learning_rate(run, loss, axes[1], best)
    _figure_legend(fig, axes.flat)
    return fig, notes


def _plot_loss_and_learning_rate(run: RunData, loss: Series, axes, best: int | None) -> None:
    ax_loss, ax_lr = axes
    _plot_loss(ax_loss, loss, loss.steps)
    _mark_step(ax_loss, best)
    style_axes(ax_loss, "step", "training loss", "Training loss")
    lr = _column(run.records_of("train"), "lr")
    if np.isfinite(lr).any():
        ax_lr.plot(loss.steps, lr, color="C2", linewidth=1.5, label="learning rate")
        positive = lr[np.isfinite(lr) & (lr > 0)]
        if positive.size and positive.max() / positive.min() > 50:
            ax_lr.set_yscale("log")
    _mark_step(ax_lr, best)
    style_axes(ax_lr, "step", "learning rate", "Learning rate (first group)")


def _figure_legend(fig: Figure, axes, ncols: int = 2) -> None:
    """One legend below every panel (never over the data), each label once."""
    handles, texts = [], []
    for ax in axes:
        for handle, text in zip(*ax.get_legend_handles_labels()):
            if text not in texts:
                handles.append(handle)
                texts.append(text)
    if handles:
        fig.legend(handles, texts, loc="outside lower center", ncols=min(ncols, len(handles)),
                   fontsize=MIN_FONT_PT, frameon=False)


def _all_times(run: RunData) -> np.ndarray:
    times = _column([r for r in run.records if r.get("kind") in ("train", "eval")], "time")
    return times[np.isfinite(times)]


def comparison_curves_figure(runs: Sequence[RunData], labels: Sequence[str]) -> Figure:
    """Curves of several runs overlaid, each quantity on its own axes: loss (smoothed), eval MAP@R and
    R@1 by step, and MAP@R by wall-clock time; one legend of run labels below the panels."""
    fig = new_figure(7.5, 6.6)
    axes = fig.subplots(2, 2)
    all_times = np.concatenate([_all_times(run) for run in runs]) if runs else np.empty(0)
    scale, time_label = time_axis(float(np.max(all_times)) if all_times.size else float("nan"))
    ax_map, ax_r1, ax_loss, ax_time = axes.flat
    colors = [f"C{i % 10}" for i in range(len(runs))]
    for run, label, color in zip(runs, labels, colors):
        loss = train_loss_series(run)
        if loss.values.size:
            _plot_loss(ax_loss, loss, loss.steps, label=label, color=color)
        split = curve_split(run)
        if split is None:
            continue
        for ax, (metric, _) in zip((ax_map, ax_r1), CURVE_METRICS):
            series = eval_series(run, split, metric)
            if np.isfinite(series.values).any():
                style = dict(marker="o", markersize=3.5, color=color, label=label,
                             linestyle="-" if split == "val" else "--")
                ax.plot(series.steps, series.values, **style)
                if ax is ax_map:
                    ax_time.plot(series.times / scale, series.values, **style)
    for ax, (_, name) in zip((ax_map, ax_r1), CURVE_METRICS):
        style_axes(ax, "step", f"validation {name}", f"{name} by step (dashed = test)")
    style_axes(ax_loss, "step", "training loss (smoothed)", "Training loss")
    style_axes(ax_time, time_label, f"validation {CURVE_METRICS[0][1]}", f"{CURVE_METRICS[0][1]} by wall-clock time")
    _figure_legend(fig, axes.flat, ncols=3)
    return fig


def projections_figure(records: Sequence[dict]) -> Figure:
    """ASAP per-projection covering radius before/after, proxy spread and best MAP@R."""
    projection = _column(records, "projection")
    fig = new_figure(7.5, 3.4)
    ax_radius, ax_map = fig.subplots(1, 2)
    for key, label in (("covering_radius_before", "covering radius before"),
                       ("covering_radius_after", "covering radius after"),
                       ("proxy_spread", "proxy spread")):
        values = _column(records, key)
        if np.isfinite(values).any():
            ax_radius.plot(projection, values, marker="o", markersize=4, label=label)
    if ax_radius.lines:
        ax_radius.legend(fontsize=MIN_FONT_PT)
    style_axes(ax_radius, "projection", "covering radius", "Covering radius per projection")
    best = _column(records, "best_map_at_r")
    if np.isfinite(best).any():
        ax_map.plot(projection, best, marker="o", markersize=4, color="C3")
    style_axes(ax_map, "projection", "MAP@R", "Best MAP@R per projection")
    for ax in (ax_radius, ax_map):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return fig
