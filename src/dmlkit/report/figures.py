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
from dmlkit.report.run_dir import RunData

DEFAULT_DPI = 80
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


def _plot_loss(ax, series: Series, x: np.ndarray, label: str | None = None, color=None) -> None:
    window = max(1, len(series.values) // 50)
    if window > 1 and label is None:
        ax.plot(x, series.values, color="#9ab8d8", linewidth=0.7, label="per step")
        ax.plot(x, moving_average(series.values, window), color="#1f5fa8", linewidth=1.4,
                label=f"mean of {window}")
        ax.legend(fontsize=7)
    else:
        ax.plot(x, moving_average(series.values, window), linewidth=1.2, label=label, color=color)


def run_curves_png(run: RunData, dpi: int = DEFAULT_DPI) -> tuple[str | None, list[str]]:
    """Loss vs step; eval MAP@R and R@1 vs step and vs wall-clock time (Proxy-Anchor Fig. 1).

    Returns the base64 PNG (``None`` when the log has nothing to draw) and notes.
    """
    notes: list[str] = []
    loss = train_loss_series(run)
    split = curve_split(run)
    if loss.values.size == 0 and split is None:
        return None, ["log.jsonl has no train or eval records; no curves to draw."]
    if loss.values.size == 0:
        notes.append("log.jsonl has no train records; the loss panel is empty.")
    if split is None:
        notes.append("log.jsonl has no eval records; the MAP@R and R@1 panels are empty.")
    elif split == "test":
        notes.append("No validation evaluations were logged; the curves show the test split.")
    fig = new_figure(12.0, 3.3)
    ax_loss, ax_step, ax_time = fig.subplots(1, 3)
    _plot_loss(ax_loss, loss, loss.steps)
    ax_loss.set(xlabel="step", ylabel="training loss", title="Training loss")
    times = _all_times(run)
    scale, time_label = time_axis(float(times.max()) if times.size else float("nan"))
    if split is not None:
        for metric, label in CURVE_METRICS:
            series = eval_series(run, split, metric)
            if np.isfinite(series.values).any():
                ax_step.plot(series.steps, series.values, marker="o", markersize=3, label=label)
                ax_time.plot(series.times / scale, series.values, marker="o", markersize=3, label=label)
        for ax in (ax_step, ax_time):
            if ax.lines:
                ax.legend(fontsize=8)
    ax_step.set(xlabel="step", ylabel=f"{split or 'eval'} metric", title=f"{split or 'eval'} MAP@R and R@1 by step")
    ax_time.set(xlabel=time_label, ylabel=f"{split or 'eval'} metric", title=f"{split or 'eval'} MAP@R and R@1 by time")
    for ax in (ax_loss, ax_step, ax_time):
        ax.grid(alpha=0.3)
    return figure_to_base64_png(fig, dpi), notes


def _all_times(run: RunData) -> np.ndarray:
    times = _column([r for r in run.records if r.get("kind") in ("train", "eval")], "time")
    return times[np.isfinite(times)]


def comparison_curves_png(runs: Sequence[RunData], labels: Sequence[str], dpi: int = DEFAULT_DPI) -> str:
    """Curves of several runs overlaid: loss, eval MAP@R and R@1, by step (top) and time (bottom)."""
    fig = new_figure(12.0, 6.2)
    axes = fig.subplots(2, 3)
    all_times = np.concatenate([_all_times(run) for run in runs]) if runs else np.empty(0)
    scale, time_label = time_axis(float(np.max(all_times)) if all_times.size else float("nan"))
    colors = [f"C{i % 10}" for i in range(len(runs))]
    for run, label, color in zip(runs, labels, colors):
        loss = train_loss_series(run)
        if loss.values.size:
            _plot_loss(axes[0, 0], loss, loss.steps, label=label, color=color)
            _plot_loss(axes[1, 0], loss, loss.times / scale, label=label, color=color)
        split = curve_split(run)
        if split is None:
            continue
        for col, (metric, _) in enumerate(CURVE_METRICS, start=1):
            series = eval_series(run, split, metric)
            if not np.isfinite(series.values).any():
                continue
            style = dict(marker="o", markersize=3, color=color, label=label,
                         linestyle="-" if split == "val" else "--")
            axes[0, col].plot(series.steps, series.values, **style)
            axes[1, col].plot(series.times / scale, series.values, **style)
    titles = ("Training loss (smoothed)",) + tuple(f"{name} (val; dashed = test)" for _, name in CURVE_METRICS)
    for col, title in enumerate(titles):
        axes[0, col].set(xlabel="step", title=title)
        axes[1, col].set(xlabel=time_label)
    axes[0, 0].set_ylabel("by step")
    axes[1, 0].set_ylabel("by wall-clock time")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    handles, legend_labels = [], []
    for ax in axes.flat:
        for handle, text in zip(*ax.get_legend_handles_labels()):
            if text not in legend_labels:
                handles.append(handle)
                legend_labels.append(text)
    if handles:
        fig.legend(handles, legend_labels, loc="outside lower center", ncols=min(4, len(handles)), fontsize=8)
    return figure_to_base64_png(fig, dpi)


def projections_png(records: Sequence[dict], dpi: int = DEFAULT_DPI) -> str:
    """ASAP per-projection covering radius before/after, proxy spread and best MAP@R."""
    projection = _column(records, "projection")
    fig = new_figure(10.0, 3.2)
    ax_radius, ax_map = fig.subplots(1, 2)
    for key, label in (("covering_radius_before", "covering radius before"),
                       ("covering_radius_after", "covering radius after"),
                       ("proxy_spread", "proxy spread")):
        values = _column(records, key)
        if np.isfinite(values).any():
            ax_radius.plot(projection, values, marker="o", markersize=4, label=label)
    if ax_radius.lines:
        ax_radius.legend(fontsize=8)
    ax_radius.set(xlabel="projection", title="Covering radius per projection")
    best = _column(records, "best_map_at_r")
    if np.isfinite(best).any():
        ax_map.plot(projection, best, marker="o", markersize=4, color="C3")
    ax_map.set(xlabel="projection", ylabel="MAP@R", title="Best MAP@R within each projection")
    for ax in (ax_radius, ax_map):
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return figure_to_base64_png(fig, dpi)
