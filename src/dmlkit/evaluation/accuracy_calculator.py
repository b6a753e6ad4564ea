"""pytorch-metric-learning's ``AccuracyCalculator`` interface on dmlkit's exact k-NN.

``AccuracyCalculator(include, exclude, avg_of_avgs, return_per_class, k).get_accuracy(query,
query_labels, reference, reference_labels, ref_includes_query)`` returns PML's keys with PML's
definitions: queries whose class has no other reference ("lone" queries) are left out of the
k-NN metrics; ``k=None`` ranks every reference, ``"max_bin_count"`` the largest class;
``mean_average_precision`` divides by the class size ``R`` and ``mean_average_precision_at_r``
looks at the first ``R`` neighbours (Musgrave et al. 2020, MAP@R); NMI/AMI come from seeded
k-means with PML's settings. Neighbours are exact (ties broken by the smaller reference index);
labels are compared by equality.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from dmlkit.evaluation.clustering import kmeans_assignments
from dmlkit.evaluation.knn import knn
from dmlkit.exceptions import DataError, InvalidParameterError

#: PML's metric names, in PML's order.
METRICS = (
    "AMI",
    "NMI",
    "mean_average_precision",
    "mean_average_precision_at_r",
    "mean_reciprocal_rank",
    "precision_at_1",
    "r_precision",
)
_CLUSTERING = ("AMI", "NMI")


class AccuracyCalculator:
    """Drop-in for ``pytorch_metric_learning.utils.accuracy_calculator.AccuracyCalculator``.

    ``device`` is accepted and ignored (dmlkit's k-NN runs on the embeddings' device);
    ``label_comparison_fn``, ``knn_func`` and ``kmeans_func`` are not supported (labels are
    compared by equality, neighbours are exact, k-means is faiss's with PML's seed).
    """

    def __init__(
        self,
        include: Sequence[str] = (),
        exclude: Sequence[str] = (),
        avg_of_avgs: bool = False,
        return_per_class: bool = False,
        k: int | str | None = None,
        label_comparison_fn: object | None = None,
        device: object | None = None,
        knn_func: object | None = None,
        kmeans_func: object | None = None,
    ):
        for name, value in (("label_comparison_fn", label_comparison_fn), ("knn_func", knn_func),
                            ("kmeans_func", kmeans_func)):
            if value is not None:
                raise InvalidParameterError(
                    f"AccuracyCalculator does not take '{name}': dmlkit compares labels by equality, finds "
                    f"exact neighbours and runs PML's seeded k-means. Got {value!r}."
                )
        self._check_names(include, exclude)
        if avg_of_avgs and return_per_class:
            raise InvalidParameterError("avg_of_avgs and return_per_class are mutually exclusive; set one.")
        if not (k is None or k == "max_bin_count" or (isinstance(k, int) and not isinstance(k, bool) and k > 0)):
            raise InvalidParameterError(
                f"The 'k' parameter of AccuracyCalculator must be an int > 0, None or 'max_bin_count'. Got {k!r} instead."
            )
        self.include, self.exclude = tuple(include), tuple(exclude)
        self.avg_of_avgs = bool(avg_of_avgs)
        self.return_per_class = bool(return_per_class)
        self.k = k
        self.device = device

    @staticmethod
    def _check_names(include: Sequence[str], exclude: Sequence[str]) -> None:
        for key, names in (("include", include), ("exclude", exclude)):
            if not isinstance(names, (tuple, list)):
                raise TypeError(f"AccuracyCalculator '{key}' must be a tuple or list. Got {type(names).__name__}.")
            unknown = sorted(set(names) - set(METRICS))
            if unknown:
                raise InvalidParameterError(
                    f"AccuracyCalculator '{key}' names unknown metrics {unknown}; choose from {list(METRICS)}."
                )

    def get_curr_metrics(self, include: Sequence[str] = (), exclude: Sequence[str] = ()) -> list[str]:
        """The metrics a call computes: ``include`` (default: all) minus ``exclude``."""
        self._check_names(include, exclude)
        include = tuple(include) or self.include or METRICS
        exclude = set(exclude) | set(self.exclude)
        return [m for m in METRICS if m in include and m not in exclude]

    def get_accuracy(
        self,
        query: torch.Tensor | np.ndarray,
        query_labels: torch.Tensor | np.ndarray,
        reference: torch.Tensor | np.ndarray | None = None,
        reference_labels: torch.Tensor | np.ndarray | None = None,
        ref_includes_query: bool = False,
        include: Sequence[str] = (),
        exclude: Sequence[str] = (),
    ) -> dict[str, float | list[float]]:
        """PML's result dict for ``query [Nq, D]`` against ``reference [Nr, D]`` (default: the query set itself)."""
        metrics = self.get_curr_metrics(include, exclude)
        if reference is None:
            reference, reference_labels, ref_includes_query = query, query_labels, True
        query, reference = _as_float(query, "query"), _as_float(reference, "reference")
        query_labels = _as_labels(query_labels, "query_labels")
        reference_labels = _as_labels(reference_labels, "reference_labels")
        if len(query) != len(query_labels) or len(reference) != len(reference_labels):
            raise DataError(
                f"embeddings and labels must have the same length: query {len(query)} vs query_labels "
                f"{len(query_labels)}, reference {len(reference)} vs reference_labels {len(reference_labels)}."
            )
        if ref_includes_query and not (
            len(reference) >= len(query)
            and torch.allclose(query.double(), reference[: len(query)].double())
            and torch.equal(query_labels, reference_labels[: len(query)])
        ):
            raise DataError("With ref_includes_query=True the first len(query) rows of reference (and labels) must be the query.")
        results: dict[str, float | list[float]] = {}
        knn_metrics = [m for m in metrics if m not in _CLUSTERING]
        if knn_metrics:
            results.update(self._knn_metrics(knn_metrics, query, query_labels, reference, reference_labels, ref_includes_query))
        if any(m in _CLUSTERING for m in metrics):
            from sklearn.metrics import adjusted_mutual_info_score, normalized_mutual_info_score

            truth = query_labels.numpy()
            clusters = kmeans_assignments(query, int(np.unique(truth).size)).numpy()
            scores = {"AMI": adjusted_mutual_info_score, "NMI": normalized_mutual_info_score}
            for m in metrics:
                if m in _CLUSTERING:
                    results[m] = float(scores[m](truth, clusters))
        return {m: results[m] for m in metrics}

    # ------------------------------------------------------------------------------ k-NN
    def _knn_metrics(self, metrics, query, query_labels, reference, reference_labels, ref_includes_query):
        self_count = int(ref_includes_query)
        classes, inverse = torch.unique(query_labels, return_inverse=True)
        counts = _counts_in(classes, reference_labels)  # references per query class
        relevant = (counts - self_count)[inverse]  # R of each query
        keep = relevant > 0  # "lone" queries (no other reference of their class) are left out
        if not bool(keep.any()):
            nan = [float("nan")] * len(classes) if self.return_per_class else float("nan")
            return {m: nan for m in metrics}
        available = len(reference) - self_count
        if self.k is None:
            k = available
        elif self.k == "max_bin_count":
            k = int(counts.max()) - self_count
        else:
            k = self.k
        k = max(1, min(k, available))
        idx = self._neighbours(query, reference, k, ref_includes_query, keep)
        labels = query_labels[keep]
        hits = reference_labels[idx] == labels[:, None]  # [Nq, k]
        r = relevant[keep]
        ranks = torch.arange(1, k + 1, dtype=torch.float64)
        within_r = ranks[None, :] <= r[:, None]
        per_query = {}
        if "precision_at_1" in metrics:
            per_query["precision_at_1"] = hits[:, 0].double()
        if "r_precision" in metrics:
            per_query["r_precision"] = (hits & within_r).sum(1).double() / within_r.sum(1).double()
        for name, mask in (("mean_average_precision_at_r", within_r), ("mean_average_precision", None)):
            if name in metrics:
                correct = hits if mask is None else hits & mask
                precision = correct.cumsum(1).double() * correct / ranks
                per_query[name] = precision.sum(1) / r.double()
        if "mean_reciprocal_rank" in metrics:
            first = hits.double().argmax(1)
            per_query["mean_reciprocal_rank"] = torch.where(hits.any(1), 1.0 / (first + 1).double(), 0.0)
        return {m: self._average(v, labels) for m, v in per_query.items()}

    @staticmethod
    def _neighbours(query, reference, k, ref_includes_query, keep) -> torch.Tensor:
        """``[keep.sum(), k]`` indices of the nearest references of the kept queries, each query's own row
        left out when it is in ``reference``."""
        if not ref_includes_query:
            return knn(query[keep], reference, k)[1]
        if len(reference) == len(query) and torch.equal(query, reference):
            # leave-one-out on one tensor (the symmetric search: half the products); lone queries dropped after
            return knn(reference, reference, k, exclude_self=True)[1][keep]
        # the queries are the first rows of reference: find k + 1 and drop each query's own row
        own = keep.nonzero()[:, 0]
        idx = knn(query[keep], reference, min(k + 1, len(reference)))[1]
        is_self = idx == own[:, None]
        order = torch.sort(is_self.to(torch.int8), dim=1, stable=True).indices  # own row moves to the end
        return idx.gather(1, order)[:, :k]

    def _average(self, per_query: torch.Tensor, labels: torch.Tensor) -> float | list[float]:
        """Mean over queries, or over classes (``avg_of_avgs``), or the per-class list (``return_per_class``)."""
        if not (self.avg_of_avgs or self.return_per_class):
            return float(per_query.mean())
        classes, inverse = torch.unique(labels, return_inverse=True)
        sums = torch.zeros(len(classes), dtype=torch.float64).index_add_(0, inverse, per_query)
        per_class = sums / torch.bincount(inverse, minlength=len(classes)).double()
        return per_class.tolist() if self.return_per_class else float(per_class.mean())


def _counts_in(classes: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """How many of ``labels`` equal each of the sorted unique ``classes`` (``[C]``), in O(N log C)."""
    pos = torch.searchsorted(classes, labels).clamp_max(len(classes) - 1)
    found = classes[pos] == labels
    return torch.bincount(pos[found], minlength=len(classes))


def _as_float(x: object, name: str) -> torch.Tensor:
    t = torch.as_tensor(x)
    if t.dim() != 2 or not t.is_floating_point():
        raise DataError(f"{name} must be a float array of shape [N, D]. Got {tuple(t.shape)} {t.dtype}.")
    return t.detach().cpu()


def _as_labels(x: object, name: str) -> torch.Tensor:
    t = torch.as_tensor(x)
    if t.dim() == 2 and t.shape[1] == 1:
        t = t[:, 0]
    if t.dim() != 1:
        raise DataError(f"{name} must be class ids of shape [N]. Got shape {tuple(t.shape)}.")
    if t.is_floating_point():
        if not torch.equal(t, t.round()):
            raise DataError(f"{name} must hold integer class ids. Got non-integer values.")
        t = t.long()
    return t.cpu().long()
