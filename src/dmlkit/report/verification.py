"""Where the test embedding fails: genuine vs impostor similarities, the DET curve with the deployment
thresholds, per-class AP@R (worst classes) and the most-confused class pairs."""

from __future__ import annotations

from typing import Any

import numpy as np

from dmlkit.report import html
from dmlkit.report.figures import MIN_FONT_PT, SELECTED_COLOR, figure_html, new_figure, style_axes
from dmlkit.report.run_reader import TestEmbeddings

FMRS = ("1e-2", "1e-3")
THRESHOLD_STYLES = {"1e-2": ":", "1e-3": "--"}
WORST_CLASSES = 10
CONFUSED_PAIRS = 10


def thresholds(metrics: dict[str, Any], impostor: np.ndarray) -> dict[str, float]:
    """Cosine thresholds at FMR 1e-2 and 1e-3: those of metrics.json, else the impostor quantile."""
    out = {}
    for key in FMRS:
        value = metrics.get(f"threshold_at_fmr_{key}")
        if isinstance(value, (int, float)) and np.isfinite(value):
            out[key] = float(value)
        elif impostor.size * float(key) >= 1:
            out[key] = float(np.quantile(impostor, 1.0 - float(key)))
    return out


def verification_figure_html(data: TestEmbeddings, metrics: dict[str, Any]) -> str:
    """Histogram of genuine and impostor cosine similarities and the DET curve (FNMR against FMR, log
    axes), the thresholds at FMR 1e-2 / 1e-3 marked on both; or a note why there is none."""
    import torch

    from dmlkit.evaluation.verification import det_curve, pair_scores

    labels = torch.from_numpy(data.labels)
    if data.labels.shape[0] < 2 or np.unique(data.labels).size < 2:
        return html.note("No verification plot: the test set needs two classes.")
    scores, genuine = pair_scores(torch.from_numpy(np.ascontiguousarray(data.embeddings, dtype=np.float32)), labels)
    if not bool(genuine.any()):
        return html.note("No verification plot: no test class has two samples.")
    score_np, genuine_np = scores.numpy(), genuine.numpy()
    marks = thresholds(metrics, score_np[~genuine_np])
    _, fmr, fnmr = (t.numpy() for t in det_curve(scores, genuine))
    fig = new_figure(7.5, 3.6)
    ax_hist, ax_det = fig.subplots(1, 2)
    low, high = float(score_np.min()), float(score_np.max())
    bins = np.linspace(low, high if high > low else low + 1e-6, 61)
    ax_hist.hist(score_np[~genuine_np], bins=bins, density=True, color="#d1242f", alpha=0.45,
                 label="impostor pairs (different class)")
    ax_hist.hist(score_np[genuine_np], bins=bins, density=True, color="#1a7f37", alpha=0.45,
                 label="genuine pairs (same class)")
    for key, value in marks.items():
        ax_hist.axvline(value, color=SELECTED_COLOR, linestyle=THRESHOLD_STYLES[key], linewidth=1.4,
                        label=f"threshold at FMR {key}: {value:.4f}")
    style_axes(ax_hist, "cosine similarity", "density", "Pair similarities")
    keep = (fmr > 0) & (fnmr > 0)
    ax_det.plot(fmr[keep], fnmr[keep], color="#0969da", linewidth=1.6)
    for key in marks:
        ax_det.axvline(float(key), color=SELECTED_COLOR, linestyle=THRESHOLD_STYLES[key], linewidth=1.4)
    ax_det.set_xscale("log")
    ax_det.set_yscale("log")
    style_axes(ax_det, "false match rate (FMR)", "false non-match rate (FNMR)", "DET curve")
    handles, texts = ax_hist.get_legend_handles_labels()
    fig.legend(handles, texts, loc="outside lower center", ncols=2, fontsize=MIN_FONT_PT, frameon=False)
    caption = (f"{int(genuine_np.sum()):,} genuine and {int((~genuine_np).sum()):,} impostor test pairs "
               "(all pairs, or a seeded sample of large sets). A pair is accepted when its cosine similarity is at "
               "least the threshold; the dotted and dashed lines are the thresholds to deploy for 1 in 100 and "
               "1 in 1,000 false matches.")
    return figure_html(fig, "genuine and impostor similarity histogram and DET curve", caption)


def per_class_ap(data: TestEmbeddings, distance: str = "cosine") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(classes, AP@R mean, queries)`` of every test class with a true match, MAP@R's per-class terms."""
    import torch

    from dmlkit.evaluation.retrieval import map_at_r_per_query

    per_query = map_at_r_per_query(torch.from_numpy(np.ascontiguousarray(data.embeddings, dtype=np.float32)),
                                   torch.from_numpy(data.labels), metric=distance).numpy()
    valid = np.isfinite(per_query)
    classes, inverse, counts = np.unique(data.labels[valid], return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=per_query[valid], minlength=classes.size)
    return classes, sums / counts, counts


def confused_pairs(labels: np.ndarray, first_neighbour: np.ndarray) -> list[tuple[int, int, int]]:
    """``(class a, class b, count)`` of the class pairs most often confused: test samples of one whose
    nearest neighbour is from the other (both directions summed), most first, ties by class ids."""
    other = labels[first_neighbour]
    wrong = labels != other
    a, b = np.minimum(labels[wrong], other[wrong]), np.maximum(labels[wrong], other[wrong])
    if a.size == 0:
        return []
    pairs, counts = np.unique(np.stack([a, b], axis=1), axis=0, return_counts=True)
    order = np.lexsort((pairs[:, 1], pairs[:, 0], -counts))[:CONFUSED_PAIRS]
    return [(int(pairs[i, 0]), int(pairs[i, 1]), int(counts[i])) for i in order]


def failures_html(data: TestEmbeddings, first_neighbour: np.ndarray, distance: str) -> str:
    """Tables of the worst classes by AP@R and of the most-confused class pairs (by first neighbour)."""
    classes, ap, counts = per_class_ap(data, distance)
    order = np.lexsort((classes, ap))[:WORST_CLASSES]
    worst = html.table(("class", "AP@R (mean over its queries)", "queries"),
                       [(data.label_name(int(classes[i])), float(ap[i]), int(counts[i])) for i in order],
                       numeric_columns=(1, 2))
    pairs = confused_pairs(data.labels, first_neighbour)
    confusion = (html.table(("class", "confused with", "first neighbours across the pair"),
                            [(data.label_name(a), data.label_name(b), n) for a, b, n in pairs], numeric_columns=(2,))
                 if pairs else html.note("No confusions: every first neighbour is from the query's class."))
    return (f"<h3>Worst {min(WORST_CLASSES, classes.size)} of {classes.size} test classes by AP@R</h3>" + worst
            + "<h3>Most-confused class pairs</h3>" + confusion)
