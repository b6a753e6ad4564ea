"""pytorch-metric-learning's module-level accuracy functions, on the labels of each query's nearest neighbours.

PML's ``utils.accuracy_calculator`` exposes these for custom metrics (a subclass's ``calculate_<name>``
calls e.g. ``precision_at_k(knn_labels, query_labels[:, None], 2, self.avg_of_avgs, self.return_per_class,
self.label_comparison_fn)``); dmlkit's :class:`~dmlkit.evaluation.AccuracyCalculator` re-exports them under
the same names, with PML's arguments and results. ``knn_labels [Nq, k]`` are the neighbours' labels in rank
order, ``gt_labels [Nq, 1]`` the queries' own, ``label_counts`` the pair (unique query labels, references of
each). The per-query values follow Musgrave et al. (2020, Sec. 3.2): R-precision over the first
``min(R, k)`` neighbours, MAP (and MAP@R within the first ``R``) as the summed precision at each hit over
``R``, MRR as one over the first hit's rank. Labels of any shape are compared with ``label_comparison_fn``;
equality holds when every label component is equal. The loops PML runs over classes are vectorised.
"""

from __future__ import annotations

from typing import Callable

import torch

#: PML's default label comparison (``torch.eq``); another function is called with ``(a, b)``.
EQUALITY = torch.eq


def per_query_knn_metrics(metrics, hits: torch.Tensor, relevant: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-query k-NN metrics ``[Nq]`` float64 from ``hits [Nq, k]`` (neighbour shares the class) and the
    class sizes ``relevant [Nq]`` (``R``, the query itself not counted).

    precision@1; R-precision = hits among the first ``min(R, k)`` over ``min(R, k)``; MAP@R and MAP =
    sum of precision@i at each hit (within ``R`` / within ``k``) over ``R`` (Musgrave et al. 2020, Sec. 3.2);
    MRR = 1 / rank of the first hit (0 without one).
    """
    k = hits.shape[1]
    ranks = torch.arange(1, k + 1, dtype=torch.float64, device=hits.device)
    within_r = ranks[None, :] <= relevant[:, None]
    out = {}
    if "precision_at_1" in metrics:
        out["precision_at_1"] = hits[:, 0].double()
    if "r_precision" in metrics:
        out["r_precision"] = (hits & within_r).sum(1).double() / within_r.sum(1).double()
    for name, mask in (("mean_average_precision_at_r", within_r), ("mean_average_precision", None)):
        if name in metrics:
            correct = hits if mask is None else hits & mask
            precision = correct.cumsum(1).double() * correct / ranks
            out[name] = precision.sum(1) / relevant.double()
    if "mean_reciprocal_rank" in metrics:
        first = hits.double().argmax(1)
        out["mean_reciprocal_rank"] = torch.where(hits.any(1), 1.0 / (first + 1).double(), 0.0)
    return out


def label_counts_of(labels: torch.Tensor, classes, counts) -> torch.Tensor:
    """``[N]`` reference count of each label: ``counts`` at its row of ``classes`` (0 if absent); with
    ``counts=None``, ``classes`` are the reference labels themselves and equal rows are counted."""
    classes = torch.as_tensor(classes, device=labels.device)
    if labels.dim() == 1 and classes.dim() == 1:
        if counts is None:
            uniq, per = torch.unique(classes, return_counts=True)
        else:
            order = torch.argsort(classes)
            uniq, per = classes[order], torch.as_tensor(counts, device=labels.device)[order]
        if len(uniq) == 0:
            return torch.zeros(len(labels), dtype=torch.long, device=labels.device)
        pos = torch.searchsorted(uniq, labels).clamp_max(len(uniq) - 1)
        return torch.where(uniq[pos] == labels, per[pos].long(), 0)
    same = (labels.reshape(len(labels), -1)[:, None, :] == classes.reshape(len(classes), -1)[None, :, :]).all(-1)
    if counts is None:
        return same.sum(1)
    return (same.long() * torch.as_tensor(counts, device=labels.device)[None, :]).sum(1)




def get_unique_labels(labels: torch.Tensor) -> torch.Tensor:
    """The distinct labels (rows, for labels of several components), sorted."""
    return torch.unique(labels, dim=0)


def maybe_get_avg_of_avgs(accuracy_per_sample: torch.Tensor, sample_labels: torch.Tensor, avg_of_avgs: bool,
                          return_per_class: bool) -> float | list[float]:
    """The mean over samples; with ``avg_of_avgs`` the mean of per-class means; with ``return_per_class`` the
    per-class means themselves, in the order of :func:`get_unique_labels`."""
    if not (avg_of_avgs or return_per_class):
        return torch.mean(accuracy_per_sample).item()
    rows = sample_labels.reshape(len(sample_labels), -1)
    classes, inverse = torch.unique(rows, dim=0, return_inverse=True)
    values = accuracy_per_sample.reshape(-1)
    sums = torch.zeros(len(classes), dtype=values.dtype, device=values.device).index_add_(0, inverse, values)
    per_class = sums / torch.bincount(inverse, minlength=len(classes)).to(values.dtype)
    return per_class.cpu().tolist() if return_per_class else torch.mean(per_class).item()


def _relevant_counts(gt_labels: torch.Tensor, ref_includes_query: bool, label_counts) -> torch.Tensor:
    """``[Nq]`` R of each query: the references of its class (0 when absent), itself not counted."""
    classes, counts = label_counts
    labels = gt_labels.reshape(len(gt_labels), *classes.shape[1:]) if classes.dim() > 1 else gt_labels.reshape(-1)
    return (label_counts_of(labels, classes, counts) - int(ref_includes_query)).clamp_min(0)


def get_relevance_mask(shape: tuple[int, int], gt_labels: torch.Tensor, ref_includes_query: bool,
                       label_counts) -> tuple[torch.Tensor, torch.Tensor]:
    """``([Nq, k] bool, [Nq] long)``: which of the first ``k`` ranks lie within each query's R, and R itself."""
    relevant = _relevant_counts(gt_labels, ref_includes_query, label_counts)
    ranks = torch.arange(shape[1], device=gt_labels.device)
    return ranks[None, :] < relevant[:, None], relevant.long()


def same_label(gt_labels: torch.Tensor, knn_labels: torch.Tensor, label_comparison_fn: Callable) -> torch.Tensor:
    """``[Nq, k]`` bool: the neighbour shares the query's label (every component, for labels of several)."""
    same = label_comparison_fn(gt_labels, knn_labels)
    return same.reshape(*same.shape[:2], -1).all(-1) if same.dim() > 2 else same.bool()


def _per_query(name: str, hits: torch.Tensor, relevant: torch.Tensor) -> torch.Tensor:
    return per_query_knn_metrics([name], hits, relevant)[name]


def r_precision(knn_labels: torch.Tensor, gt_labels: torch.Tensor, ref_includes_query: bool, label_counts,
                avg_of_avgs: bool, return_per_class: bool, label_comparison_fn: Callable) -> float | list[float]:
    """R-precision: hits among the first ``min(R, k)`` neighbours over ``min(R, k)``."""
    _, relevant = get_relevance_mask(knn_labels.shape[:2], gt_labels, ref_includes_query, label_counts)
    per_query = _per_query("r_precision", same_label(gt_labels, knn_labels, label_comparison_fn), relevant)
    return maybe_get_avg_of_avgs(per_query, gt_labels, avg_of_avgs, return_per_class)


def mean_average_precision(knn_labels: torch.Tensor, gt_labels: torch.Tensor, ref_includes_query: bool,
                           label_counts, avg_of_avgs: bool, return_per_class: bool, label_comparison_fn: Callable,
                           at_r: bool = False) -> float | list[float]:
    """MAP over the ``k`` neighbours (``at_r``: MAP@R, over the first ``R``), each query's sum divided by ``R``."""
    _, relevant = get_relevance_mask(knn_labels.shape[:2], gt_labels, ref_includes_query, label_counts)
    name = "mean_average_precision_at_r" if at_r else "mean_average_precision"
    per_query = _per_query(name, same_label(gt_labels, knn_labels, label_comparison_fn), relevant)
    return maybe_get_avg_of_avgs(per_query, gt_labels, avg_of_avgs, return_per_class)


def mean_reciprocal_rank(knn_labels: torch.Tensor, gt_labels: torch.Tensor, avg_of_avgs: bool, return_per_class: bool,
                         label_comparison_fn: Callable) -> float | list[float]:
    """One over the rank of the first neighbour sharing the query's label (0 when none of the ``k`` does)."""
    hits = same_label(gt_labels, knn_labels, label_comparison_fn)
    per_query = _per_query("mean_reciprocal_rank", hits, torch.zeros(len(hits), device=hits.device))
    return maybe_get_avg_of_avgs(per_query, gt_labels, avg_of_avgs, return_per_class)


def precision_at_k(knn_labels: torch.Tensor, gt_labels: torch.Tensor, k: int, avg_of_avgs: bool,
                   return_per_class: bool, label_comparison_fn: Callable) -> float | list[float]:
    """The share of the first ``k`` neighbours that share the query's label."""
    hits = same_label(gt_labels, knn_labels[:, :k], label_comparison_fn)
    return maybe_get_avg_of_avgs(hits.sum(1).double() / k, gt_labels, avg_of_avgs, return_per_class)


def get_label_match_counts(query_labels: torch.Tensor, reference_labels: torch.Tensor,
                           label_comparison_fn: Callable) -> tuple[torch.Tensor, torch.Tensor]:
    """``(unique query labels, references matching each)``: PML's ``label_counts``. A custom comparison is
    called once per unique query label (it need not broadcast)."""
    unique = get_unique_labels(query_labels)
    if label_comparison_fn is EQUALITY:
        return unique, label_counts_of(unique, reference_labels, None)
    counts = [torch.sum(label_comparison_fn(unique[i : i + 1], reference_labels)) for i in range(len(unique))]
    return unique, torch.stack(counts).long().to(query_labels.device) if counts else torch.zeros(
        0, dtype=torch.long, device=query_labels.device)


def get_lone_query_labels(query_labels: torch.Tensor, label_counts, ref_includes_query: bool,
                          label_comparison_fn: Callable) -> tuple[torch.Tensor, torch.Tensor]:
    """``(lone labels, [Nq] not-lone mask)``: a label is lone when no reference other than the query itself
    has it; the metrics leave its queries out."""
    unique, counts = label_counts
    if ref_includes_query:
        itself = label_comparison_fn(unique, unique)
        itself = itself.reshape(len(unique), -1).all(-1) if itself.dim() > 1 else itself
        lone = unique[counts - itself.long() <= 0]
    else:
        lone = unique[counts == 0]
    if len(lone) == 0:
        return lone, torch.ones(len(query_labels), dtype=torch.bool, device=query_labels.device)
    same = query_labels[:, None] == lone[None]
    return lone, ~same.reshape(*same.shape[:2], -1).all(-1).any(1)


def try_getting_not_lone_labels(knn_labels: torch.Tensor, query_labels: torch.Tensor,
                                not_lone_query_mask: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The rows of the queries that are not lone, or ``(None, None)`` when every query is."""
    if not bool(torch.as_tensor(not_lone_query_mask).any()):
        return None, None
    return knn_labels[not_lone_query_mask], query_labels[not_lone_query_mask]


def nan_accuracy(unique_labels: torch.Tensor, return_per_class: bool) -> float | list[float]:
    """The value of a metric no query can score: NaN (one per class with ``return_per_class``)."""
    return [float("nan")] * len(unique_labels) if return_per_class else float("nan")


__all__ = [
    "EQUALITY",
    "get_label_match_counts",
    "get_lone_query_labels",
    "get_relevance_mask",
    "get_unique_labels",
    "label_counts_of",
    "maybe_get_avg_of_avgs",
    "mean_average_precision",
    "mean_reciprocal_rank",
    "nan_accuracy",
    "per_query_knn_metrics",
    "precision_at_k",
    "r_precision",
    "same_label",
    "try_getting_not_lone_labels",
]
