"""Re-ranking at query time: alpha-query expansion, database-side augmentation, k-reciprocal.

All work on L2-normalised embeddings (rows of ``[N, D]`` tensors) and are vectorised.

- alpha-QE (Radenovic et al., TPAMI 2019, Sec. 4.4): a query becomes the normalised sum of itself
  and its ``n`` nearest gallery items weighted by ``similarity ** alpha``.
- DBA: every gallery item is replaced the same way by its ``n`` nearest gallery items (itself
  first), so gallery and queries live in the same smoothed space.
- k-reciprocal re-ranking (Zhong et al., CVPR 2017, Eqs. 4-12): Jaccard distance of the
  k-reciprocal encodings with local query expansion, mixed with the original distance.
"""

from __future__ import annotations

import torch

from dmlkit.exceptions import InvalidParameterError


def _l2(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(x.float(), dim=1)


def alpha_query_expansion(query: torch.Tensor, gallery: torch.Tensor, n: int = 2, alpha: float = 3.0,
                          *, exclude_self: bool = False) -> torch.Tensor:
    """``[Q, D]`` expanded queries: ``normalise(q + sum_i max(s_i, 0) ** alpha * g_i)`` over the
    ``n`` most similar gallery items ``g_i`` (cosine similarity ``s_i``); Radenovic et al., Eq. (2)
    with the query weighted 1. ``exclude_self`` skips gallery item ``i`` for query ``i``."""
    _check_n(n, "n")
    q, g = _l2(query), _l2(gallery)
    if n == 0:
        return q
    sim = q @ g.T
    if exclude_self:
        sim.fill_diagonal_(float("-inf"))
    top, idx = sim.topk(min(n, g.shape[0] - int(exclude_self)), dim=1)
    weights = top.clamp_min(0) ** alpha  # [Q, n]
    return _l2(q + (weights.unsqueeze(2) * g[idx]).sum(1))


def database_augmentation(gallery: torch.Tensor, n: int = 2, alpha: float = 3.0) -> torch.Tensor:
    """``[N, D]``: each gallery item replaced by the alpha-weighted sum of its ``n`` nearest gallery
    items, itself included (weight 1): DBA as in Radenovic et al., Sec. 4.4."""
    _check_n(n, "n")
    g = _l2(gallery)
    if n <= 1:
        return g
    sim = g @ g.T
    top, idx = sim.topk(min(n, g.shape[0]), dim=1)
    return _l2((top.clamp_min(0) ** alpha).unsqueeze(2).mul(g[idx]).sum(1))


def _check_n(n, what: str) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise InvalidParameterError(f"The {what!r} parameter of the re-ranking must be an int >= 0. Got {n!r} instead.")


def _neighbour_mask(rank: torch.Tensor, k: int) -> torch.Tensor:
    """``[M, M]`` bool: ``j`` is among the ``k + 1`` nearest of ``i`` (``i`` itself included)."""
    m = rank.shape[0]
    mask = torch.zeros(m, m, dtype=torch.bool)
    mask.scatter_(1, rank[:, : k + 1], True)
    return mask


def k_reciprocal_distance(query: torch.Tensor | None, gallery: torch.Tensor, k1: int = 20, k2: int = 6,
                          lambda_value: float = 0.3) -> torch.Tensor:
    """``[Q, N]`` re-ranked distances of queries to gallery items (Zhong et al., CVPR 2017).

    ``query=None`` re-ranks the gallery against itself (leave-one-out): ``[N, N]``. Otherwise the
    ``M = Q + N`` probes and gallery items form one set. The original distance ``d`` is the squared
    Euclidean distance of the normalised embeddings; ``N(p, k)`` the k nearest (p included);
    ``R(p, k) = {g in N(p, k) : p in N(g, k)}`` (Eq. 4);
    ``R*(p, k) = R(p, k) U R(q, k/2)`` for each ``q in R(p, k)`` with
    ``|R(p, k) n R(q, k/2)| >= 2/3 |R(q, k/2)|`` (Eq. 6); ``V[p, g] = exp(-d(p, g))`` on ``R*(p, k1)``
    and 0 elsewhere (Eq. 7); local query expansion ``V_p <- mean of V_g over g in N(p, k2)``
    (Eq. 10); Jaccard distance ``d_J = 1 - sum_j min(V_pj, V_gj) / sum_j max(V_pj, V_gj)``
    (Eq. 11); final ``(1 - lambda) d_J + lambda d`` (Eq. 12).
    """
    for name, value in (("k1", k1), ("k2", k2)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidParameterError(f"The {name!r} parameter of k_reciprocal_distance must be an int >= 1. "
                                        f"Got {value!r} instead.")
    if not 0.0 <= float(lambda_value) <= 1.0:
        raise InvalidParameterError(f"The 'lambda_value' parameter of k_reciprocal_distance must be in [0, 1]. "
                                    f"Got {lambda_value!r} instead.")
    g = _l2(gallery)
    n_query = 0 if query is None else query.shape[0]
    everything = g if query is None else torch.cat([_l2(query), g])
    m = everything.shape[0]
    dist = (2 - 2 * everything @ everything.T).clamp_min_(0)  # squared Euclidean of unit vectors
    dist.fill_diagonal_(0)
    rank = dist.argsort(dim=1, stable=True)  # rank[:, 0] is the item itself
    k1 = min(k1, m - 1)
    half = max(1, int(round(k1 / 2)))
    near = _neighbour_mask(rank, k1)
    near_half = _neighbour_mask(rank, half)
    recip = near & near.T  # Eq. (4)
    recip_half = (near_half & near_half.T).float()
    overlap = recip.float() @ recip_half.T  # [M, M]: |R(p, k) n R(q, k/2)|
    expand = recip & (overlap >= (2 / 3) * recip_half.sum(1).unsqueeze(0))  # q qualifies for p (Eq. 6)
    recip_star = recip | ((expand.float() @ recip_half) > 0)
    v = torch.where(recip_star, torch.exp(-dist), torch.zeros(()))  # Eq. (7)
    if k2 > 1:  # Eq. (10): mean over the k2 nearest (itself included)
        v = v[rank[:, :k2]].mean(1)
    rows = m if query is None else n_query
    final = (1 - lambda_value) * _jaccard_distance(v, rows) + lambda_value * dist[:rows]
    return final if query is None else final[:, n_query:]


def _jaccard_distance(v: torch.Tensor, n_rows: int) -> torch.Tensor:
    """``[n_rows, M]``: ``1 - sum_j min(v_pj, v_gj) / sum_j max(v_pj, v_gj)`` for the first
    ``n_rows`` rows ``p`` against all rows ``g`` of a sparse non-negative ``v [M, M]`` (Eq. 11).

    Only columns where both rows are non-zero add to the minimum, so the sum runs over pairs of
    non-zeros sharing a column; ``sum max = sum v_p + sum v_g - sum min``.
    """
    m = v.shape[0]
    rows, cols = v.nonzero(as_tuple=True)
    values = v[rows, cols]
    order = torch.argsort(cols, stable=True)
    rows, cols, values = rows[order], cols[order], values[order]
    counts = torch.bincount(cols, minlength=m)
    starts = torch.cumsum(counts, 0) - counts
    left = (rows < n_rows).nonzero(as_tuple=True)[0]  # entries of the query rows
    per_left = counts[cols[left]]
    pair_left = left.repeat_interleave(per_left)
    offset = torch.arange(int(per_left.sum())) - (torch.cumsum(per_left, 0) - per_left).repeat_interleave(per_left)
    pair_right = starts[cols[pair_left]] + offset
    mins = torch.minimum(values[pair_left], values[pair_right])
    shared = torch.zeros(n_rows * m, dtype=v.dtype)
    shared.index_add_(0, rows[pair_left] * m + rows[pair_right], mins)
    shared = shared.view(n_rows, m)
    total = v.sum(1)
    union = total[:n_rows].unsqueeze(1) + total.unsqueeze(0) - shared
    return 1 - shared / union.clamp_min(torch.finfo(v.dtype).tiny)
