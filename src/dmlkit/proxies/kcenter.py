"""Greedy k-center selection of proxies, batched over classes (ASAP Alg. 2, Sec. 4.3).

ASAP re-initialises the proxies of every class from a pool of ``b`` sample embeddings per
class, choosing the samples that reduce the covering radius most:
``q = argmax_{u in pool \\ r_c} min_{v in rho_c U r_c} ||u - v||_2`` (repeated ``K`` times).
All classes are processed at once: the pool is a padded ``[C, b, D]`` tensor with an
optional validity mask ``[C, b]``; only the ``k`` picks are a Python loop.
"""

from __future__ import annotations

import torch

from dmlkit.exceptions import DataError, InvalidParameterError


def _check_pool(pool: torch.Tensor, pool_mask: torch.Tensor | None) -> torch.Tensor:
    if pool.dim() != 3:
        raise DataError(f"pool_embeddings must be 3-D [C, b, D]. Got shape {tuple(pool.shape)}.")
    if pool_mask is None:
        return torch.ones(pool.shape[:2], dtype=torch.bool, device=pool.device)
    if tuple(pool_mask.shape) != tuple(pool.shape[:2]):
        raise DataError(
            f"pool_mask has shape {tuple(pool_mask.shape)} but pool_embeddings has {tuple(pool.shape[:2])} [C, b]."
        )
    return pool_mask.to(device=pool.device, dtype=torch.bool)


@torch.no_grad()
def greedy_k_center(
    pool_embeddings: torch.Tensor,
    k: int,
    existing_centers: torch.Tensor | None = None,
    pool_mask: torch.Tensor | None = None,
    return_radii: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Indices ``[C, k]`` into each class's pool chosen by greedy k-center (ASAP Alg. 2).

    ``pool_embeddings [C, b, D]``: ``b`` candidate embeddings per class. ``existing_centers
    [C, K0, D]``: the converged proxies ``rho_c`` the new picks must be far from (``None``: start
    from nothing; then the first pick is pool index 0 — the pool is a random sample, so this
    is a random choice, and ``b = 1`` reduces to random sampling as in the paper).
    ``pool_mask [C, b]`` marks real entries of a padded pool; padding is never picked. A point
    is re-picked only when every valid point is already a centre (``k`` > valid count). Classes
    with no valid entry get index ``-1``. With ``return_radii`` also returns ``[C, k]`` covering
    radii of the valid pool points after each pick (Euclidean, including ``existing_centers``).
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InvalidParameterError(f"The 'k' parameter of greedy_k_center must be an int >= 1. Got {k!r} instead.")
    valid = _check_pool(pool_embeddings, pool_mask)
    pool = pool_embeddings.detach()
    num_classes, pool_size, _ = pool.shape
    sq_norms = (pool * pool).sum(-1)  # [C, b]
    gram = torch.bmm(pool, pool.transpose(1, 2))  # [C, b, b]
    if existing_centers is not None and existing_centers.shape[1] > 0:
        if existing_centers.dim() != 3 or existing_centers.shape[0] != num_classes or existing_centers.shape[2] != pool.shape[2]:
            raise DataError(
                f"existing_centers has shape {tuple(existing_centers.shape)} but pool_embeddings has "
                f"{tuple(pool.shape)}; expected [C={num_classes}, K0, D={pool.shape[2]}]."
            )
        centers = existing_centers.detach().to(pool.dtype)
        cross = torch.bmm(pool, centers.transpose(1, 2))  # [C, b, K0]
        dist = sq_norms[:, :, None] + (centers * centers).sum(-1)[:, None, :] - 2.0 * cross
        min_dist = dist.clamp_min(0.0).amin(dim=2)
    else:
        min_dist = torch.full_like(sq_norms, float("inf"))
    min_dist = min_dist.masked_fill(~valid, float("-inf"))
    rows = torch.arange(num_classes, device=pool.device)
    picks = torch.empty(num_classes, k, dtype=torch.int64, device=pool.device)
    radii = torch.empty(num_classes, k, dtype=pool.dtype, device=pool.device) if return_radii else None
    for step in range(k):
        chosen = min_dist.argmax(dim=1)  # first maximum on ties
        picks[:, step] = chosen
        to_chosen = sq_norms + sq_norms[rows, chosen][:, None] - 2.0 * gram[rows, :, chosen]
        min_dist = torch.minimum(min_dist, to_chosen.clamp_min(0.0))
        min_dist[rows, chosen] = torch.minimum(min_dist[rows, chosen], torch.zeros((), dtype=pool.dtype))
        if radii is not None:
            radii[:, step] = min_dist.amax(dim=1).clamp_min(0.0).sqrt()
    picks = torch.where(valid.any(dim=1, keepdim=True), picks, torch.full_like(picks, -1))
    return (picks, radii) if return_radii else picks


def gather_centers(
    pool_embeddings: torch.Tensor, indices: torch.Tensor, fallback: torch.Tensor | None = None
) -> torch.Tensor:
    """The chosen pool embeddings ``[C, k, D]`` for ``indices [C, k]``; ``-1`` rows take ``fallback [C, k, D]``."""
    safe = indices.clamp_min(0)
    chosen = torch.gather(pool_embeddings, 1, safe[:, :, None].expand(-1, -1, pool_embeddings.shape[2]))
    missing = indices < 0
    if bool(missing.any()):
        if fallback is None:
            raise DataError("some classes have no valid pool entry and no fallback centers were given.")
        chosen = torch.where(missing[:, :, None], fallback.to(chosen.dtype), chosen)
    return chosen


def covering_radius(
    points: torch.Tensor,
    centers: torch.Tensor,
    points_mask: torch.Tensor | None = None,
    centers_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-class covering radius ``max_{u} min_{v} ||u - v||_2`` ``[C]`` (ASAP Sec. 4.2, Proxy-NCA Eq. (6)).

    ``points [C, n, D]`` and ``centers [C, m, D]`` (2-D inputs give a scalar); masks ``[C, n]`` /
    ``[C, m]`` mark real entries of padded tensors. A class without valid points has radius 0;
    one without valid centers has radius ``inf``.
    """
    squeeze = points.dim() == 2
    if squeeze:
        points, centers = points[None], centers[None]
        points_mask = None if points_mask is None else points_mask[None]
        centers_mask = None if centers_mask is None else centers_mask[None]
    if points.dim() != 3 or centers.dim() != 3 or points.shape[0] != centers.shape[0] or points.shape[2] != centers.shape[2]:
        raise DataError(
            f"points has shape {tuple(points.shape)} but centers has {tuple(centers.shape)}; "
            "expected [C, n, D] and [C, m, D]."
        )
    sq = (points * points).sum(-1)[:, :, None] + (centers * centers).sum(-1)[:, None, :]
    dist = (sq - 2.0 * torch.bmm(points, centers.transpose(1, 2))).clamp_min(0.0)
    if centers_mask is not None:
        dist = dist.masked_fill(~centers_mask.bool()[:, None, :], float("inf"))
    nearest = dist.amin(dim=2)
    if points_mask is not None:
        nearest = nearest.masked_fill(~points_mask.bool(), 0.0)
    radius = nearest.amax(dim=1).sqrt()
    return radius[0] if squeeze else radius


@torch.no_grad()
def average_covering_radius(points: torch.Tensor, points_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean over ``k = 1..n`` of the greedy k-center covering radius of each class ``[C]`` (ASAP App. A.3.1).

    ``points [C, n, D]`` (padded, with ``points_mask [C, n]``). Greedy k-center approximates the
    minimum cover within a factor 2; for a class with ``n_c < n`` valid points the radii after
    ``k >= n_c`` picks are 0 and only ``k = 1..n_c`` are averaged.
    """
    valid = _check_pool(points, points_mask)
    _, radii = greedy_k_center(points, points.shape[1], pool_mask=valid, return_radii=True)
    counts = valid.sum(dim=1)
    steps = torch.arange(points.shape[1], device=points.device)[None, :]
    used = steps < counts[:, None]
    return (radii * used).sum(dim=1) / counts.clamp_min(1).to(radii.dtype)


@torch.no_grad()
def refresh_proxies_k_center(
    bank, pool_embeddings: torch.Tensor, pool_mask: torch.Tensor | None = None, *, keep_current: bool = True
) -> torch.Tensor:
    """Re-initialise every class's ``K`` proxies by greedy k-center on the pool (ASAP Alg. 1-2).

    ``bank`` is a :class:`~dmlkit.proxies.ProxyBank` (or a proxy loss's ``.bank``);
    ``pool_embeddings [C, b, D]`` are fresh embeddings of ``b`` samples per class. With
    ``keep_current`` the current (converged) proxies are the existing centres the picks must
    cover around; without, k-center starts from scratch. Classes without valid pool entries keep
    their proxies. Returns the picked indices ``[C, K]``.
    """
    current = bank.per_class().detach().to(pool_embeddings.device)
    existing = current if keep_current else None
    picks = greedy_k_center(pool_embeddings, int(bank.proxies_per_class), existing_centers=existing, pool_mask=pool_mask)
    bank.set_proxies(gather_centers(pool_embeddings.detach(), picks, fallback=current))
    return picks
