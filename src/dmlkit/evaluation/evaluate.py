"""One call for the training engine: retrieval, verification, clustering and geometry metrics merged into one dict."""

from __future__ import annotations

from typing import Sequence

import torch

from dmlkit.evaluation.clustering import clustering_metrics
from dmlkit.evaluation.geometry import geometry_metrics
from dmlkit.evaluation.retrieval import retrieval_metrics
from dmlkit.evaluation.verification import verification_metrics
from dmlkit.exceptions import InvalidParameterError

METRIC_GROUPS = ("retrieval", "verification", "clustering", "geometry")


def evaluate(
    embeddings: torch.Tensor,
    labels: torch.Tensor,
    *,
    reference: torch.Tensor | None = None,
    reference_labels: torch.Tensor | None = None,
    metrics: Sequence[str] = ("retrieval", "verification", "clustering"),
    ks: Sequence[int] = (1, 2, 4, 8),
    metric: str = "euclidean",
    backend: str = "torch",
    over_cluster: int = 1,
    ami: bool = False,
    seed: int = 1234,
) -> dict[str, float | int]:
    """Merged metrics dict: ``precision_at_1, recall_at_<k>, r_precision, map_at_r, num_queries_excluded``
    (retrieval), ``roc_auc, eer, fnmr_at_fmr_<f>, threshold_at_fmr_<f>, num_*_pairs`` (verification, over
    every pair of the query and reference embeddings together), ``nmi`` (+ ``nmi_plus`` when
    ``over_cluster > 1``, ``ami`` when ``ami=True``) (clustering, on the query embeddings) and
    ``covering_radius, interclass_distance, class_collapse`` (geometry).
    """
    unknown = [m for m in metrics if m not in METRIC_GROUPS]
    if unknown:
        raise InvalidParameterError(
            f"The 'metrics' parameter of evaluate must contain only {METRIC_GROUPS}. Got {tuple(metrics)!r} instead."
        )
    out: dict[str, float | int] = {}
    if "retrieval" in metrics:
        out.update(
            retrieval_metrics(
                embeddings, labels, reference=reference, reference_labels=reference_labels,
                ks=ks, metric=metric, backend=backend,
            )
        )
    if "verification" in metrics:
        both = embeddings if reference is None else torch.cat([embeddings, reference])
        both_labels = labels if reference_labels is None else torch.cat([labels, reference_labels])
        out.update(verification_metrics(both, both_labels, seed=seed))
    if "clustering" in metrics:
        clus = clustering_metrics(embeddings, labels, over_cluster=over_cluster, seed=seed)
        if not ami:
            clus.pop("ami")
        out.update(clus)
    if "geometry" in metrics:
        out.update(geometry_metrics(embeddings, labels))
    return out
