"""The one scoring of a split: retrieval, verification, clustering and geometry metrics merged into one dict.

Validation, the final test and ``dmlkit evaluate`` all score through :func:`evaluate`, so a run's
``metrics.json`` and a later ``dmlkit evaluate`` of the same weights compute the same numbers the same way.
"""

from __future__ import annotations

from typing import Sequence

import torch

from dmlkit.evaluation.clustering import clustering_metrics
from dmlkit.evaluation.geometry import geometry_metrics
from dmlkit.evaluation.retrieval import query_gallery_union, retrieval_metrics
from dmlkit.evaluation.verification import verification_metrics
from dmlkit.exceptions import InvalidParameterError

METRIC_GROUPS = ("retrieval", "verification", "clustering", "geometry")


def evaluate(
    embeddings: torch.Tensor,
    labels: torch.Tensor,
    *,
    reference: torch.Tensor | None = None,
    reference_labels: torch.Tensor | None = None,
    own_reference: torch.Tensor | None = None,
    metrics: Sequence[str] = ("retrieval", "verification", "clustering"),
    ks: Sequence[int] = (1, 2, 4, 8),
    metric: str = "euclidean",
    backend: str = "torch",
    over_cluster: int = 1,
    ami: bool = False,
    seed: int = 1234,
    search_device: torch.device | str | None = None,
) -> dict[str, float | int]:
    """Merged metrics of ``embeddings [N, D]`` (the queries) against ``reference [M, D]`` (a separate
    gallery; None: leave-one-out over the queries).

    Keys: ``precision_at_1, recall_at_<k>, r_precision, map_at_r, num_queries_excluded`` (retrieval),
    ``roc_auc, eer, fnmr_at_fmr_<f>, threshold_at_fmr_<f>, num_*_pairs`` (verification), ``nmi`` (+
    ``nmi_plus`` when ``over_cluster > 1``, ``ami`` when ``ami=True``) (clustering) and
    ``covering_radius, interclass_distance, class_collapse`` (geometry, on the queries).

    Verification and clustering see every embedding of the split once: the queries and the gallery rows
    that are not a query's own row (``own_reference [N]``: the gallery row that is each query itself, -1:
    none). ``search_device``: where the k-NN of the retrieval metrics runs (a GPU: ``knn_device``, same
    neighbours as the CPU); the other groups are computed where the embeddings are.
    """
    unknown = [m for m in metrics if m not in METRIC_GROUPS]
    if unknown:
        raise InvalidParameterError(
            f"The 'metrics' parameter of evaluate must contain only {METRIC_GROUPS}. Got {tuple(metrics)!r} instead."
        )
    out: dict[str, float | int] = {}
    if "retrieval" in metrics:
        def searched(x):
            return x if x is None or search_device is None else x.to(search_device)

        out.update(
            retrieval_metrics(
                searched(embeddings), labels, reference=searched(reference), reference_labels=reference_labels,
                ks=tuple(ks), metric=metric, backend=backend, own_reference=own_reference,
            )
        )
    everything, everything_labels = embeddings, labels
    if reference is not None and ("verification" in metrics or "clustering" in metrics):
        everything, everything_labels = query_gallery_union(embeddings, labels, reference, reference_labels,
                                                            own_reference)
    if "verification" in metrics:
        out.update(verification_metrics(everything, everything_labels, seed=seed))
    if "clustering" in metrics:
        clus = clustering_metrics(everything, everything_labels, over_cluster=over_cluster, seed=seed)
        if not ami:
            clus.pop("ami")
        out.update(clus)
    if "geometry" in metrics:
        out.update(geometry_metrics(embeddings, labels))
    return out
