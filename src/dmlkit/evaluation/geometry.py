"""Embedding-geometry diagnostics used by ASAP and EPS: covering radius, class separation, collapse.

All distances are Euclidean and computed in float64.
"""

from __future__ import annotations

import torch

from dmlkit.core.validation import check_embeddings_labels
from dmlkit.evaluation._checks import check_finite

PAD_BYTES = 256 * 2**20  # budget for the padded [classes, n, n] distance tensors


def _class_groups(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sample order grouped by class, class sizes ``[C]`` and class id of each sample ``[N]``."""
    classes, inverse, counts = torch.unique(labels, return_inverse=True, return_counts=True)
    order = torch.argsort(inverse, stable=True)
    return order, counts, inverse


def _kcenter_mean_radius(points: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over k = 1..n of the greedy k-center covering radius, per padded class ``[G]``.

    ``points [G, n, D]`` with ``mask [G, n]`` marking real samples. The first center is the
    sample closest to the class mean (deterministic); each next center is the farthest sample
    from the chosen ones (farthest-first traversal, ASAP Appendix A.3.1).
    """
    g, n, _ = points.shape
    dist = torch.cdist(points, points)  # [G, n, n]
    sizes = mask.sum(1)
    mean = (points * mask.unsqueeze(-1)).sum(1) / sizes.unsqueeze(-1)
    to_mean = (points - mean.unsqueeze(1)).norm(dim=-1).masked_fill(~mask, float("inf"))
    center = to_mean.argmin(1)
    arange = torch.arange(g)
    nearest = dist[arange, center].masked_fill(~mask, float("-inf"))  # [G, n]
    radius_sum = torch.zeros(g, dtype=points.dtype)
    for step in range(n):
        radius = nearest.max(1).values.clamp_min(0.0)
        active = step < sizes
        radius_sum += torch.where(active, radius, torch.zeros_like(radius))
        center = nearest.argmax(1)
        nearest = torch.minimum(nearest, dist[arange, center].masked_fill(~mask, float("-inf")))
    return radius_sum / sizes


def covering_radius(embeddings: torch.Tensor, labels: torch.Tensor) -> float:
    """Average per-class k-center covering radius (ASAP Appendix A.3.1), averaged over classes.

    For a class of n samples, greedy k-center picks k = 1..n centers; the radius for k is the
    largest distance of a class sample to its nearest center. The class value is the mean of
    these n radii; the result is the mean over classes (a one-sample class contributes 0).
    """
    check_embeddings_labels(embeddings, labels)
    check_finite(embeddings, "embeddings")
    x = embeddings.detach().cpu().double()
    order, counts, _ = _class_groups(labels.cpu())
    starts = torch.cumsum(counts, 0) - counts
    per_class = torch.zeros(len(counts), dtype=torch.float64)
    # group classes of equal size so each group is one padded batched computation
    for size in torch.unique(counts).tolist():
        cls = (counts == size).nonzero().squeeze(1)
        step = max(1, PAD_BYTES // (8 * size * max(size, x.shape[1])))
        for c0 in range(0, len(cls), step):
            chunk = cls[c0 : c0 + step]
            rows = order[starts[chunk].unsqueeze(1) + torch.arange(size)]
            mask = torch.ones(len(chunk), size, dtype=torch.bool)
            per_class[chunk] = _kcenter_mean_radius(x[rows], mask)
    return float(per_class.mean())


def class_centroids(embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean embedding of each class ``[C, D]`` (float64, classes in sorted label order)."""
    _, inverse = torch.unique(labels.cpu(), return_inverse=True)
    x = embeddings.detach().cpu().double()
    sums = torch.zeros(int(inverse.max()) + 1, x.shape[1], dtype=torch.float64).index_add_(0, inverse, x)
    return sums / torch.bincount(inverse).unsqueeze(1).double()


def _blocked_centroid_stats(centroids: torch.Tensor) -> tuple[float, torch.Tensor]:
    """Mean distance between distinct centroids and each centroid's nearest other centroid ``[C]``."""
    c = centroids.shape[0]
    total = 0.0
    nearest = torch.full((c,), float("inf"), dtype=torch.float64)
    block = max(1, (32 * 2**20) // (8 * max(c, 1)))
    for s in range(0, c, block):
        d = torch.cdist(centroids[s : s + block], centroids)
        rows = torch.arange(s, min(c, s + block))
        d[rows - s, rows] = float("inf")
        nearest[rows] = d.min(1).values
        d[rows - s, rows] = 0.0
        total += float(d.sum())
    return (total / (c * (c - 1)) if c > 1 else float("nan")), nearest


def interclass_distance(embeddings: torch.Tensor, labels: torch.Tensor) -> float:
    """Mean Euclidean distance between the centroids of distinct classes (ASAP Fig. 7)."""
    check_embeddings_labels(embeddings, labels)
    check_finite(embeddings, "embeddings")
    mean_dist, _ = _blocked_centroid_stats(class_centroids(embeddings, labels))
    return mean_dist


def class_collapse(embeddings: torch.Tensor, labels: torch.Tensor) -> float:
    """Mean over classes of spread / separation; small means collapsed classes (EPS Sec. 3).

    spread = mean distance of a class's samples to its centroid; separation = distance from
    that centroid to the nearest other class centroid. 0 means every class collapsed to a point.
    """
    check_embeddings_labels(embeddings, labels)
    check_finite(embeddings, "embeddings")
    x = embeddings.detach().cpu().double()
    _, inverse = torch.unique(labels.cpu(), return_inverse=True)
    centroids = class_centroids(embeddings, labels)
    spread_sum = torch.zeros(len(centroids), dtype=torch.float64).index_add_(
        0, inverse, (x - centroids[inverse]).norm(dim=1)
    )
    spread = spread_sum / torch.bincount(inverse).double()
    _, nearest = _blocked_centroid_stats(centroids)
    return float((spread / nearest).mean())


def geometry_metrics(embeddings: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """``covering_radius``, ``interclass_distance`` and ``class_collapse`` of ``embeddings [N, D]``."""
    return {
        "covering_radius": covering_radius(embeddings, labels),
        "interclass_distance": interclass_distance(embeddings, labels),
        "class_collapse": class_collapse(embeddings, labels),
    }
