"""pytorch-metric-learning's ``AccuracyCalculator`` interface on dmlkit's exact k-NN.

``AccuracyCalculator(include, exclude, avg_of_avgs, return_per_class, k).get_accuracy(query,
query_labels, reference, reference_labels, ref_includes_query)`` returns PML's keys with PML's
definitions: queries whose class has no other reference ("lone" queries) are left out of the
k-NN metrics; ``k=None`` ranks every reference, ``"max_bin_count"`` the largest class;
``mean_average_precision`` divides by the class size ``R`` and ``mean_average_precision_at_r``
looks at the first ``R`` neighbours (Musgrave et al. 2020, MAP@R); NMI/AMI come from seeded
k-means with PML's settings. Neighbours are exact (ties broken by the smaller reference index);
labels are compared by equality.

PML's way to extend it works too: a subclass adds a metric with a ``calculate_<name>(**kwargs)``
method (listing it in ``requires_knn()`` or ``requires_clustering()``), and ``knn_func``,
``kmeans_func`` and ``label_comparison_fn`` replace the k-NN search, the k-means and label
equality. Those calls (and overridden metrics) take the general path: every metric function gets
PML's keyword arguments (``knn_labels``, ``query_labels``, ``not_lone_query_mask``,
``label_counts``, ``ref_includes_query``, ``cluster_labels``, ...). Without them the built-in
metrics take the fast path, which never materialises more than the k-NN indices.
"""

from __future__ import annotations

import logging
from typing import Callable, Sequence

import numpy as np
import torch

from dmlkit.evaluation.clustering import kmeans_assignments
from dmlkit.evaluation.information import adjusted_mutual_information, normalized_mutual_information
from dmlkit.evaluation.knn import drop_own_neighbours, knn
from dmlkit.evaluation.knn_label_metrics import (  # PML's module-level functions, importable from here as in PML
    EQUALITY,
    get_label_match_counts,
    get_lone_query_labels,
    get_relevance_mask,
    get_unique_labels,
    label_counts_of,
    maybe_get_avg_of_avgs,
    mean_average_precision,
    mean_reciprocal_rank,
    nan_accuracy,
    per_query_knn_metrics,
    precision_at_k,
    r_precision,
    same_label,
    try_getting_not_lone_labels,
)
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
_LOG = logging.getLogger(__name__)
_PREFIX = "calculate_"


class AccuracyCalculator:
    """Drop-in for ``pytorch_metric_learning.utils.accuracy_calculator.AccuracyCalculator``.

    ``device`` is accepted and ignored (dmlkit's k-NN runs on the embeddings' device).
    ``knn_func(query, k, reference, ref_includes_query) -> (distances, indices)`` (PML's
    ``FaissKNN``/``CustomKNN`` or any such callable), ``kmeans_func(query, num_clusters) -> cluster
    ids`` and ``label_comparison_fn(a, b) -> bool tensor`` are used when given.
    """

    def __init__(
        self,
        include: Sequence[str] = (),
        exclude: Sequence[str] = (),
        avg_of_avgs: bool = False,
        return_per_class: bool = False,
        k: int | str | None = None,
        label_comparison_fn: Callable | None = None,
        device: object | None = None,
        knn_func: Callable | None = None,
        kmeans_func: Callable | None = None,
    ):
        for name, value in (("label_comparison_fn", label_comparison_fn), ("knn_func", knn_func),
                            ("kmeans_func", kmeans_func)):
            if value is not None and not callable(value):
                raise InvalidParameterError(
                    f"The '{name}' parameter of AccuracyCalculator must be callable or None. Got {value!r} instead.")
        self.original_function_dict = self._all_metric_functions()
        self._check_names(include, exclude)
        if avg_of_avgs and return_per_class:
            raise InvalidParameterError("avg_of_avgs and return_per_class are mutually exclusive; set one.")
        if not (k is None or k == "max_bin_count" or (isinstance(k, int) and not isinstance(k, bool) and k > 0)):
            raise InvalidParameterError(
                f"The 'k' parameter of AccuracyCalculator must be an int > 0, None or 'max_bin_count'. Got {k!r} instead."
            )
        self.include, self.exclude = tuple(include), tuple(exclude)
        self.original_function_dict = self.get_function_dict(include, exclude)
        self.curr_function_dict = self.get_function_dict()
        self.avg_of_avgs = bool(avg_of_avgs)
        self.return_per_class = bool(return_per_class)
        self.k = k
        self.device = device
        self.knn_func = knn_func
        self.kmeans_func = kmeans_func
        self.label_comparison_fn = label_comparison_fn
        if label_comparison_fn is not None and any(m in self.requires_clustering() for m in self.get_curr_metrics()):
            raise NotImplementedError("AccuracyCalculator: clustering metrics (AMI, NMI) cannot use a custom "
                                      "label_comparison_fn; exclude them.")

    def _check_names(self, include: Sequence[str], exclude: Sequence[str]) -> None:
        known = list(self.original_function_dict)
        for key, names in (("include", include), ("exclude", exclude)):
            if not isinstance(names, (tuple, list)):
                raise TypeError(f"AccuracyCalculator '{key}' must be a tuple or list. Got {type(names).__name__}.")
            unknown = sorted(set(names) - set(known))
            if unknown:
                raise InvalidParameterError(
                    f"AccuracyCalculator '{key}' names unknown metrics {unknown}; choose from {known}."
                )

    def get_curr_metrics(self, include: Sequence[str] = (), exclude: Sequence[str] = ()) -> list[str]:
        """The metrics a call computes: ``include`` (default: the constructor's) minus ``exclude``."""
        self._check_names(include, exclude)
        return list(self.get_function_dict(include, exclude))

    # ------------------------------------------------------------------ PML's metric protocol
    def _all_metric_functions(self) -> dict[str, Callable]:
        """``{name: bound calculate_<name>}`` for every ``calculate_`` method, built-ins in PML's order first."""
        names = [m for m in METRICS if hasattr(self, _PREFIX + m)]
        names += sorted(a[len(_PREFIX):] for a in dir(type(self)) if a.startswith(_PREFIX) and a[len(_PREFIX):] not in names)
        return {name: getattr(self, _PREFIX + name) for name in names}

    def get_function_dict(self, include: Sequence[str] = (), exclude: Sequence[str] = ()) -> dict[str, Callable]:
        """``{metric: calculate_<metric>}`` of the metrics kept by ``include`` (default: all) minus ``exclude``."""
        include = list(include) or list(self.original_function_dict)
        return {k: v for k, v in self.original_function_dict.items() if k in include and k not in exclude}

    def requires_knn(self) -> list[str]:
        """Metrics that read the k-NN kwargs (a subclass adds its own k-NN metrics here)."""
        return [m for m in METRICS if m not in _CLUSTERING]

    def requires_clustering(self) -> list[str]:
        """Metrics that read ``cluster_labels`` (a subclass adds its own clustering metrics here)."""
        return list(_CLUSTERING)

    def get_cluster_labels(self, query: torch.Tensor, query_labels: torch.Tensor, **kwargs) -> torch.Tensor:
        """Cluster ids of ``query``: ``kmeans_func`` or dmlkit's seeded k-means, one cluster per class."""
        num_clusters = int(torch.unique(query_labels.reshape(len(query_labels), -1), dim=0).shape[0])
        if self.kmeans_func is not None:
            return torch.as_tensor(np.asarray(_to_numpy(self.kmeans_func(query, num_clusters))))
        return kmeans_assignments(query.float(), num_clusters)

    def calculate_AMI(self, query_labels, cluster_labels, **kwargs) -> float:
        """scikit-learn's ``adjusted_mutual_info_score`` (PML's), computed by :mod:`dmlkit.evaluation.information`."""
        return adjusted_mutual_information(_to_numpy(query_labels).reshape(-1), _to_numpy(cluster_labels))

    def calculate_NMI(self, query_labels, cluster_labels, **kwargs) -> float:
        """scikit-learn's ``normalized_mutual_info_score`` (PML's), computed by :mod:`dmlkit.evaluation.information`."""
        return normalized_mutual_information(_to_numpy(query_labels).reshape(-1), _to_numpy(cluster_labels))

    def calculate_precision_at_1(self, **kwargs):
        return self._knn_metric_from_kwargs("precision_at_1", **kwargs)

    def calculate_r_precision(self, **kwargs):
        return self._knn_metric_from_kwargs("r_precision", **kwargs)

    def calculate_mean_average_precision_at_r(self, **kwargs):
        return self._knn_metric_from_kwargs("mean_average_precision_at_r", **kwargs)

    def calculate_mean_average_precision(self, **kwargs):
        return self._knn_metric_from_kwargs("mean_average_precision", **kwargs)

    def calculate_mean_reciprocal_rank(self, **kwargs):
        return self._knn_metric_from_kwargs("mean_reciprocal_rank", **kwargs)

    def _knn_metric_from_kwargs(self, name, knn_labels, query_labels, not_lone_query_mask, label_counts,
                                ref_includes_query=False, **kwargs):
        """A built-in k-NN metric from PML's kwargs: neighbour labels ``[Nq, k]`` and reference class sizes."""
        keep = torch.as_tensor(not_lone_query_mask, dtype=torch.bool, device=query_labels.device)
        knn_labels, labels = try_getting_not_lone_labels(knn_labels, query_labels, keep)
        if labels is None:
            return nan_accuracy(label_counts[0], self.return_per_class)
        hits = self._same_label(labels[:, None], knn_labels)
        relevant = label_counts_of(labels, *label_counts) - int(ref_includes_query)
        return self._average(per_query_knn_metrics([name], hits, relevant)[name], labels)

    def _same_label(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """``[Nq, k]`` bool: ``label_comparison_fn(a, b)``, or equality over every label dimension."""
        return same_label(a, b, self.label_comparison_fn or EQUALITY)

    def _uses_fast_path(self) -> bool:
        """True when only built-in metrics, exact k-NN, dmlkit's k-means and label equality are in play."""
        if self.knn_func is not None or self.kmeans_func is not None or self.label_comparison_fn is not None:
            return False
        return all(name in METRICS and getattr(type(self), _PREFIX + name) is getattr(AccuracyCalculator, _PREFIX + name)
                   for name in self.original_function_dict)

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
        self.curr_function_dict = self.get_function_dict(include, exclude)
        if reference is None:
            reference, reference_labels, ref_includes_query = query, query_labels, True
        query, reference = _as_float(query, "query"), _as_float(reference, "reference")
        common = torch.promote_types(query.dtype, reference.dtype)
        query, reference = query.to(common), reference.to(query.device, common)
        fast = self._uses_fast_path()
        query_labels = _as_labels(query_labels, "query_labels", any_shape=not fast)
        reference_labels = _as_labels(reference_labels, "reference_labels", any_shape=not fast)
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
        if not fast:  # PML's protocol on float32, as PML converts every input
            query, reference = query.cpu().float(), reference.cpu().float()
            return self._general_accuracy(metrics, query, query_labels, reference, reference_labels, ref_includes_query)
        results: dict[str, float | list[float]] = {}
        knn_metrics = [m for m in metrics if m not in _CLUSTERING]
        if knn_metrics:
            results.update(self._knn_metrics(knn_metrics, query, query_labels, reference, reference_labels, ref_includes_query))
        if any(m in _CLUSTERING for m in metrics):
            clusters = self.get_cluster_labels(query.cpu(), query_labels)
            for m in metrics:
                if m in _CLUSTERING:
                    results[m] = self.original_function_dict[m](query_labels=query_labels, cluster_labels=clusters)
        return {m: results[m] for m in metrics}

    def _get_accuracy(self, function_dict: dict[str, Callable], **kwargs) -> dict:
        """PML's hook: every metric function of ``function_dict`` called with the same keyword arguments."""
        return {name: fn(**kwargs) for name, fn in function_dict.items()}

    def _general_accuracy(self, metrics, query, query_labels, reference, reference_labels, ref_includes_query):
        """PML's protocol: build the k-NN and clustering kwargs the metrics need, then call each metric."""
        kwargs = {"query": query, "reference": reference, "query_labels": query_labels,
                  "reference_labels": reference_labels, "ref_includes_query": ref_includes_query,
                  "label_comparison_fn": self.label_comparison_fn or torch.eq}
        if any(m in self.requires_knn() for m in metrics):
            label_counts = self._label_match_counts(query_labels, reference_labels)
            kwargs["label_counts"] = label_counts
            kwargs["not_lone_query_mask"] = self._not_lone_mask(query_labels, label_counts, ref_includes_query)
            k = self._num_neighbours(label_counts[1], len(reference), ref_includes_query, metrics)
            distances, indices = self._search(query, k, reference, ref_includes_query)
            kwargs["knn_distances"], kwargs["knn_labels"] = distances, reference_labels[indices]
            if not bool(kwargs["not_lone_query_mask"].any()):
                _LOG.warning("None of the query labels are in the reference set.")
        if any(m in self.requires_clustering() for m in metrics):
            kwargs["cluster_labels"] = self.get_cluster_labels(**kwargs)
        return self._get_accuracy(self.curr_function_dict, **kwargs)

    def _label_match_counts(self, query_labels, reference_labels) -> tuple[torch.Tensor, torch.Tensor]:
        """PML's ``label_counts``: (unique query labels ``[C, ...]``, references matching each ``[C]``)."""
        return get_label_match_counts(query_labels, reference_labels, self.label_comparison_fn or EQUALITY)

    def _not_lone_mask(self, query_labels, label_counts, ref_includes_query) -> torch.Tensor:
        """``[Nq]`` bool: the query's class has a reference other than the query itself."""
        return get_lone_query_labels(query_labels, label_counts, ref_includes_query,
                                     self.label_comparison_fn or EQUALITY)[1]

    def _num_neighbours(self, counts, num_references, ref_includes_query, metrics) -> int:
        """PML's ``k``: all references (``None``), the largest class (``"max_bin_count"``) or ``k``."""
        self_count = int(ref_includes_query)
        largest = int(counts.max()) if len(counts) else 0
        if self.k == "max_bin_count":
            k = largest - self_count
        elif self.k is None:
            k = num_references - self_count
        else:
            k = self.k
            _warn_if_k_cuts_r(k, largest, metrics)
        _LOG.info("AccuracyCalculator: %d nearest neighbours of %d references", k, num_references)
        return k

    def _search(self, query, k, reference, ref_includes_query) -> tuple[torch.Tensor, torch.Tensor]:
        """``(distances, indices)`` ``[Nq, k]``: ``knn_func`` or dmlkit's exact search (own row left out)."""
        if self.knn_func is not None:
            distances, indices = self.knn_func(query, k, reference, ref_includes_query)
            return torch.as_tensor(distances), torch.as_tensor(indices).long().cpu()
        k = max(1, min(k, len(reference) - int(ref_includes_query)))
        indices = self._neighbours(query, reference, k, ref_includes_query, torch.ones(len(query), dtype=torch.bool))
        distances = torch.cat([torch.cdist(query[s : s + 1024].double(), reference.double()).gather(1, indices[s : s + 1024])
                               for s in range(0, len(query), 1024)])
        return distances, indices

    # ------------------------------------------------------------------------------ k-NN
    def _knn_metrics(self, metrics, query, query_labels, reference, reference_labels, ref_includes_query):
        # on the embeddings' device: a GPU searches and scores there (knn.searches_on_device)
        query_labels, reference_labels = query_labels.to(query.device), reference_labels.to(query.device)
        self_count = int(ref_includes_query)
        classes, inverse = torch.unique(query_labels, return_inverse=True)
        counts = _counts_in(classes, reference_labels)  # references per query class
        relevant = (counts - self_count)[inverse]  # R of each query
        keep = relevant > 0  # "lone" queries (no other reference of their class) are left out
        if not bool(keep.any()):
            nan = [float("nan")] * len(classes) if self.return_per_class else float("nan")
            return {m: nan for m in metrics}
        k = max(1, min(self._num_neighbours(counts, len(reference), ref_includes_query, metrics),
                       len(reference) - self_count))
        idx = self._neighbours(query, reference, k, ref_includes_query, keep)
        labels = query_labels[keep]
        hits = reference_labels[idx] == labels[:, None]  # [Nq, k]
        per_query = per_query_knn_metrics(metrics, hits, relevant[keep])
        return {m: self._average(per_query[m], labels) for m in metrics}

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
        idx = knn(query[keep], reference, k + 1)[1]  # k <= len(reference) - 1 (the caller caps it)
        return drop_own_neighbours(idx, keep.nonzero()[:, 0])[0]

    def _average(self, per_query: torch.Tensor, labels: torch.Tensor) -> float | list[float]:
        """Mean over queries, or over classes (``avg_of_avgs``), or the per-class list (``return_per_class``)."""
        return maybe_get_avg_of_avgs(per_query.double(), labels, self.avg_of_avgs, self.return_per_class)


def _warn_if_k_cuts_r(k: int, largest_class: int, metrics) -> None:
    """PML's warning: R-based metrics need ``k`` at least the largest class size."""
    cut = sorted(set(metrics) & {"r_precision", "mean_average_precision_at_r"})
    if k < largest_class and cut:
        _LOG.warning("AccuracyCalculator computes %s with k=%d, below the largest class (%d references): "
                     "those values are wrong. Use k='max_bin_count' (or mean_average_precision for MAP@k).",
                     cut, k, largest_class)


def _to_numpy(x) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _counts_in(classes: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """How many of ``labels`` equal each of the sorted unique ``classes`` (``[C]``), in O(N log C)."""
    pos = torch.searchsorted(classes, labels).clamp_max(len(classes) - 1)
    found = classes[pos] == labels
    return torch.bincount(pos[found], minlength=len(classes))


def _as_float(x: object, name: str) -> torch.Tensor:
    """``[N, D]`` floats on their device (the k-NN metrics run there); integer embeddings become float32
    (as PML converts them)."""
    t = torch.as_tensor(x)
    if t.dim() != 2 or t.is_complex() or t.dtype == torch.bool:
        raise DataError(f"{name} must be a real array of shape [N, D]. Got {tuple(t.shape)} {t.dtype}.")
    if not t.is_floating_point():
        t = t.float()
    return t.detach()


def _as_labels(x: object, name: str, any_shape: bool = False) -> torch.Tensor:
    """Class ids ``[N]`` int64 (``any_shape``: ``[N, ...]`` labels for a custom comparison, kept as given)."""
    t = torch.as_tensor(x)
    if t.dim() == 2 and t.shape[1] == 1:
        t = t[:, 0]
    if any_shape and t.dim() >= 1:
        if t.is_floating_point() and torch.equal(t, t.round()):
            t = t.long()
        return t.cpu()
    if t.dim() != 1:
        raise DataError(f"{name} must be class ids of shape [N]. Got shape {tuple(t.shape)}.")
    if t.is_floating_point():
        if not torch.equal(t, t.round()):
            raise DataError(f"{name} must hold integer class ids. Got non-integer values.")
        t = t.long()
    return t.cpu().long()


__all__ = [
    "EQUALITY",
    "METRICS",
    "AccuracyCalculator",
    "get_label_match_counts",
    "get_lone_query_labels",
    "get_relevance_mask",
    "get_unique_labels",
    "maybe_get_avg_of_avgs",
    "mean_average_precision",
    "mean_reciprocal_rank",
    "nan_accuracy",
    "precision_at_k",
    "r_precision",
    "try_getting_not_lone_labels",
]
