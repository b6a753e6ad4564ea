"""Clustering metrics: NMI (Proxy-NCA Eq. 8), NMI+ (EPS Sec. 5) and AMI after seeded k-means."""

from __future__ import annotations

import numpy as np
import torch

from dmlkit.core.validation import NONE, Interval, check_embeddings_labels, validate_params
from dmlkit.evaluation._checks import check_finite
from dmlkit.evaluation.information import adjusted_mutual_information, normalized_mutual_information
from dmlkit.exceptions import DataError


def kmeans_assignments(
    embeddings: torch.Tensor, n_clusters: int, *, seed: int = 1234, n_iter: int = 20, n_redo: int = 1
) -> torch.Tensor:
    """Cluster ids ``[N]`` int64 from Lloyd k-means (faiss), reproducible for a seed.

    Centroids start at ``n_clusters`` distinct samples drawn with ``seed``; ``n_iter`` Lloyd
    iterations follow; with ``n_redo > 1`` the run with the lowest objective is kept. The
    defaults (seed 1234, 20 iterations, 1 run) are exactly PML's AccuracyCalculator k-means.
    Reproducible for a given seed and thread count.
    """
    x = np.ascontiguousarray(embeddings.detach().cpu().float().numpy())
    if n_clusters == 1 and len(x):
        return torch.zeros(len(x), dtype=torch.int64)
    return faiss_kmeans(x, n_clusters, niter=n_iter, nredo=n_redo, seed=seed, verbose=False,
                        min_points_per_centroid=1, max_points_per_centroid=10**9)


def faiss_kmeans(x: np.ndarray, n_clusters: int, *, name: str = "n_clusters", **kwargs) -> torch.Tensor:
    """Cluster ids ``[N]`` int64 (CPU) of the rows of ``x [N, D]`` (float32) after ``faiss.Kmeans(**kwargs)``;
    ``name``: the caller's word for ``n_clusters`` in the error when there are fewer samples than clusters."""
    import faiss

    if n_clusters > len(x):
        raise DataError(f"k-means needs at least as many samples as clusters: {len(x)} samples but "
                        f"{name}={n_clusters}.")
    km = faiss.Kmeans(x.shape[1], n_clusters, **kwargs)
    km.train(x)
    _, assign = km.index.search(x, 1)
    return torch.from_numpy(assign[:, 0].astype(np.int64))


def clustering_metrics(
    embeddings: torch.Tensor,
    labels: torch.Tensor,
    *,
    n_clusters: int | None = None,
    over_cluster: int = 1,
    seed: int = 1234,
    n_iter: int = 20,
    n_redo: int = 1,
) -> dict[str, float]:
    """NMI and AMI of k-means on ``embeddings [N, D]`` against ``labels [N]``; NMI+ when over-clustering.

    ``nmi = 2 I(Omega, C) / (H(Omega) + H(C))`` (Proxy-NCA, Eq. 8; scikit-learn's value, computed without
    it by :mod:`dmlkit.evaluation.information`) with ``k = n_clusters``
    (default: number of classes). With ``over_cluster > 1`` also ``nmi_plus``: NMI with
    ``k = over_cluster * n_clusters`` clusters (capped at N), which does not reward class
    collapse (EPS, Sec. 5). ``ami`` is the adjusted mutual information for the first clustering.
    k-means: see :func:`kmeans_assignments` (``seed``, ``n_iter``, ``n_redo``).
    """
    validate_params(
        "clustering_metrics",
        {"n_clusters": n_clusters, "over_cluster": over_cluster, "seed": seed, "n_iter": n_iter, "n_redo": n_redo},
        {
            "n_clusters": [NONE, Interval(int, 1, None)],
            "over_cluster": [Interval(int, 1, None)],
            "seed": [Interval(int, 0, None)],
            "n_iter": [Interval(int, 1, None)],
            "n_redo": [Interval(int, 1, None)],
        },
    )
    check_embeddings_labels(embeddings, labels)
    check_finite(embeddings, "embeddings")
    if embeddings.shape[0] < 2:
        raise DataError(f"Clustering metrics need at least two samples; embeddings has {embeddings.shape[0]} row.")
    k = n_clusters if n_clusters is not None else int(torch.unique(labels).numel())
    assign = kmeans_assignments(embeddings, min(k, embeddings.shape[0]), seed=seed, n_iter=n_iter, n_redo=n_redo)
    out = {"nmi": normalized_mutual_information(labels, assign), "ami": adjusted_mutual_information(labels, assign)}
    if over_cluster > 1:
        k_plus = min(over_cluster * k, embeddings.shape[0])
        assign_plus = kmeans_assignments(embeddings, k_plus, seed=seed, n_iter=n_iter, n_redo=n_redo)
        out["nmi_plus"] = normalized_mutual_information(labels, assign_plus)
    return out
