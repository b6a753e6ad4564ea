"""Exact k-nearest-neighbour search: float32 shortlist, float64 re-ranking, certified exactness.

How a neighbour list is defined (both backends return exactly this):

* every (query, reference) pair gets a float64 *key* computed from the inputs one pair at a
  time: ``-||q - r||^2`` for ``metric="euclidean"``, ``<q/|q|, r/|r|>`` for ``"cosine"`` and
  ``<q, r>`` for ``"dot"`` (products of float32 values are exact in float64; only the final
  sum of ``D`` terms rounds, at ~1e-16 relative);
* references are ordered by key, larger first; equal keys are ordered by the smaller
  reference index (deterministic tie-breaking);
* with ``exclude_self=True`` reference ``i`` is never a neighbour of query ``i``.

How it is computed fast: the scores ``<q, r> - h_q - h_r`` (``h = |x|^2 / 2`` for Euclidean,
so the score is ``-d^2 / 2``; ``h = 0`` otherwise) are first taken from float32 matrix products
in tiles (memory O(tile^2 + N * k), never N x N) and each query keeps a running top-``m``
shortlist (``m = k + 4``). In leave-one-out on one tensor only the tiles on and above the
diagonal are multiplied; each tile serves its rows and, transposed, its columns (half the
products). The shortlist is re-ranked with the float64 keys. Float32 scores differ from the
exact ones by at most ``eps_i = c (|q_i| max_j |r_j| + h_i + max_j h_j)`` with
``c = 2 (D + 6) 2^-24`` (standard dot-product rounding bound with a factor-2 margin). If the
k-th exact score of the shortlist beats the smallest shortlisted float32 score by more than
``eps_i``, no reference outside the shortlist can enter the top k, so the result is exact.
Queries that cannot be certified (near-ties, duplicates) are searched again with a 4x larger
shortlist until certified; at ``m = N`` the search is exhaustive, so the loop always ends.
The faiss backend takes its shortlist from ``IndexFlatIP`` and shares everything else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch

from dmlkit._validation import BOOL, Interval, Options, validate_params
from dmlkit.evaluation._checks import BACKENDS, METRICS, check_finite
from dmlkit.exceptions import DataError, InvalidParameterError

FLOAT32_UNIT_ROUNDOFF = 2.0**-24
RESCORE_BYTES = 64 * 2**20  # float64 [rows, m, D] gather budget for re-ranking
TILE_BYTES = 32 * 2**20  # float32 score tile budget
SYMMETRIC_TILE = 2048  # rows / columns of a leave-one-out tile
SHORTLIST_SLACK = 4  # shortlist m = k + slack; uncertified queries retry with 4x larger m


@dataclass
class _Prepared:
    """Float32 search operands, float64 re-ranking operands and the float32 error bound.

    Search score (larger is closer): ``s_ij = <q_i, r_j> - h_i - h_j`` with ``h = |x|^2 / 2``
    for Euclidean (so ``s_ij = -|q_i - r_j|^2 / 2``) and ``h = 0`` otherwise. When the
    reference ``h`` are all (nearly) equal, as for L2-normalised embeddings, the float32 tiles
    skip the bias and ``h_j`` is replaced by its mean; the spread goes into the bound.
    """

    query32: torch.Tensor  # [Nq, D]
    reference32: torch.Tensor  # [Nr, D]
    query64: torch.Tensor  # [Nq, D]
    reference64: torch.Tensor  # [Nr, D]
    query_bias: torch.Tensor  # [Nq] float64 h_i
    reference_bias32: torch.Tensor | None  # [Nr] float32 h_j, None when folded into the offset
    offset: float  # constant subtracted from every float32 score (mean h_j when folded)
    bound: torch.Tensor  # [Nq] float64 bound on |float32 score - exact score|
    metric: str
    exclude_self: bool
    symmetric: bool  # leave-one-out on one tensor: tiles are shared by rows and columns

    @property
    def num_references(self) -> int:
        return self.reference32.shape[0]

    @property
    def num_candidates(self) -> int:
        return self.num_references - int(self.exclude_self)


def _prepare(query: torch.Tensor, reference: torch.Tensor, metric: str, exclude_self: bool) -> _Prepared:
    """Build the float32 / float64 operands and the per-query rounding bound."""
    symmetric = exclude_self and query is reference
    q64 = query.detach().cpu().double()
    r64 = q64 if symmetric else reference.detach().cpu().double()
    if metric == "cosine":
        q64 = q64 / q64.norm(dim=1, keepdim=True).clamp_min(1e-300)
        r64 = q64 if symmetric else r64 / r64.norm(dim=1, keepdim=True).clamp_min(1e-300)
    if metric == "euclidean":
        q_h, r_h = 0.5 * (q64 * q64).sum(1), 0.5 * (r64 * r64).sum(1)
    else:
        q_h, r_h = torch.zeros(q64.shape[0], dtype=torch.float64), torch.zeros(r64.shape[0], dtype=torch.float64)
    r_norm_max = float(r64.norm(dim=1).max()) if r64.shape[0] else 0.0
    h_max = float(r_h.max()) if r_h.numel() else 0.0
    spread = float(r_h.max() - r_h.min()) if r_h.numel() else 0.0
    folded = spread <= 1e-6 * (1.0 + h_max)
    offset = float(r_h.mean()) if folded and r_h.numel() else 0.0
    c = 2.0 * (q64.shape[1] + 6) * FLOAT32_UNIT_ROUNDOFF + 1e-12
    bound = c * (q64.norm(dim=1) * r_norm_max + q_h + h_max) + (2.0 * spread if folded else 0.0) + 1e-300
    q32 = q64.float().contiguous()
    return _Prepared(
        query32=q32,
        reference32=q32 if symmetric else r64.float().contiguous(),
        query64=q64,
        reference64=r64,
        query_bias=q_h,
        reference_bias32=None if folded else r_h.float(),
        offset=offset,
        bound=bound,
        metric=metric,
        exclude_self=exclude_self,
        symmetric=symmetric,
    )


def _exact_keys(prep: _Prepared, rows: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Float64 keys ``[b, m]`` (larger is closer) of the pairs ``(rows[i], idx[i, j])``."""
    q = prep.query64[rows].unsqueeze(1)  # [b, 1, D]
    r = prep.reference64[idx]  # [b, m, D]
    if prep.metric == "euclidean":
        diff = q - r
        return -(diff * diff).sum(-1)
    return (q * r).sum(-1)


def _keys_to_scores(prep: _Prepared, keys: torch.Tensor) -> torch.Tensor:
    """Express float64 keys in search-score units (``-d^2 / 2`` for Euclidean)."""
    return 0.5 * keys if prep.metric == "euclidean" else keys


def _merge_topm(
    best_v: torch.Tensor | None, best_i: torch.Tensor | None, v: torch.Tensor, i: torch.Tensor, m: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge a running top-``m`` ``[b, m]`` with new candidates ``[b, c]``."""
    if best_v is not None:
        v, i = torch.cat([best_v, v], 1), torch.cat([best_i, i], 1)
    if v.shape[1] > m:
        v, pos = v.topk(m, dim=1, sorted=False)
        i = i.gather(1, pos)
    return v, i


def _shortlist_torch(prep: _Prepared, rows: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Running top-``m`` float32 scores (query bias not applied) and indices ``[b, m]`` over reference chunks."""
    q = prep.query32[rows]
    b, n_ref = q.shape[0], prep.num_references
    chunk = max(m, min(n_ref, TILE_BYTES // (4 * max(b, 1))))
    best_v = best_i = None
    for c0 in range(0, n_ref, chunk):
        c1 = min(n_ref, c0 + chunk)
        s = q @ prep.reference32[c0:c1].T
        if prep.reference_bias32 is not None:
            s.sub_(prep.reference_bias32[c0:c1])
        if prep.exclude_self:
            inside = (rows >= c0) & (rows < c1)
            s[inside.nonzero().squeeze(1), rows[inside] - c0] = float("-inf")
        v, i = s.topk(min(m, c1 - c0), dim=1, sorted=False)
        best_v, best_i = _merge_topm(best_v, best_i, v, i + c0, m)
    return best_v, best_i


def _shortlist_symmetric(prep: _Prepared, m: int, tile: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``m`` shortlists ``[N, m]`` for leave-one-out, multiplying only tiles ``j >= i`` of X X^T.

    Each off-diagonal tile serves the queries of its rows and, transposed, those of its
    columns, so the matrix products cost half of a full pass.
    """
    x, n = prep.query32, prep.num_references
    bias = prep.reference_bias32
    starts = list(range(0, n, tile))
    best: list[tuple[torch.Tensor | None, torch.Tensor | None]] = [(None, None)] * len(starts)
    for bi, r0 in enumerate(starts):
        r1 = min(n, r0 + tile)
        for bj in range(bi, len(starts)):
            c0 = starts[bj]
            c1 = min(n, c0 + tile)
            s = x[r0:r1] @ x[c0:c1].T
            if bi == bj:
                s.fill_diagonal_(float("-inf"))
            s_cols = None
            if bj != bi:
                s_cols = s.T if bias is None else (s - bias[r0:r1].unsqueeze(1)).T
                s_cols = s_cols.contiguous()
            if bias is not None:
                s.sub_(bias[c0:c1])
            v, i = s.topk(min(m, c1 - c0), dim=1, sorted=False)
            best[bi] = _merge_topm(*best[bi], v, i + c0, m)
            if s_cols is not None:
                v, i = s_cols.topk(min(m, r1 - r0), dim=1, sorted=False)
                best[bj] = _merge_topm(*best[bj], v, i + r0, m)
    return torch.cat([b[0] for b in best]), torch.cat([b[1] for b in best])


class _FaissShortlist:
    """Top-``m`` float32 scores from an exact flat faiss index (built once)."""

    def __init__(self, prep: _Prepared):
        import faiss

        self.prep = prep
        base = prep.reference32
        if prep.reference_bias32 is not None:  # <[q, 1], [r, -h]> = <q, r> - h
            base = torch.cat([base, -prep.reference_bias32.unsqueeze(1)], 1)
        self.index = faiss.IndexFlatIP(base.shape[1])
        self.index.add(base.numpy())

    def __call__(self, rows: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
        extra = int(self.prep.exclude_self)
        q = self.prep.query32[rows]
        if self.prep.reference_bias32 is not None:
            q = torch.cat([q, torch.ones(len(rows), 1)], 1)
        v, i = self.index.search(q.numpy(), m + extra)
        v, i = torch.from_numpy(v), torch.from_numpy(i).long()
        if extra:
            is_self = i == rows.unsqueeze(1)
            is_self[~is_self.any(1), -1] = True  # self not found: drop the last (worst) entry
            keep = ~is_self
            v, i = v[keep].view(len(rows), m), i[keep].view(len(rows), m)
        return v, i


def _rank_shortlist(
    prep: _Prepared, rows: torch.Tensor, v: torch.Tensor, i: torch.Tensor, k: int, m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Re-rank a shortlist with float64 keys; return keys, indices ``[b, k]`` and a certified mask ``[b]``."""
    i, order = i.sort(dim=1)  # ties in key resolve to the smaller index via the stable sort below
    v = v.gather(1, order)
    keys = _exact_keys(prep, rows, i)
    keys, order = keys.sort(dim=1, descending=True, stable=True)
    i = i.gather(1, order)
    keys, i = keys[:, :k], i[:, :k]
    if m >= prep.num_candidates:
        return keys, i, torch.ones(len(rows), dtype=torch.bool)
    kth = _keys_to_scores(prep, keys[:, -1])
    smallest = v.double().min(dim=1).values - prep.query_bias[rows] - prep.offset
    return keys, i, kth > smallest + prep.bound[rows]


def _search_rows(
    prep: _Prepared, rows: torch.Tensor, k: int, m: int, shortlist, first: tuple | None = None
) -> tuple[torch.Tensor, ...]:
    """Certified exact top-``k`` for ``rows``: shortlist, re-rank, retry uncertain rows with larger m."""
    m = min(m, prep.num_candidates)
    keys, idx, ok = _rank_shortlist(prep, rows, *(first if first is not None else shortlist(rows, m)), k, m)
    while not bool(ok.all()):
        m = min(4 * m, prep.num_candidates)
        bad = (~ok).nonzero().squeeze(1)
        step = max(1, RESCORE_BYTES // (8 * m * max(prep.query64.shape[1], 1)))
        for s0 in range(0, len(bad), step):
            sel = bad[s0 : s0 + step]
            r = rows[sel]
            kk, ii, oo = _rank_shortlist(prep, r, *shortlist(r, m), k, m)
            keys[sel], idx[sel], ok[sel] = kk, ii, oo
    return keys, idx


def iter_knn_blocks(
    query: torch.Tensor,
    reference: torch.Tensor,
    k: int,
    *,
    exclude_self: bool = False,
    metric: str = "euclidean",
    backend: str = "torch",
    query_block: int | None = None,
) -> Iterator[tuple[int, int, torch.Tensor, torch.Tensor]]:
    """Yield ``(start, end, keys [b, k], indices [b, k])`` for consecutive query blocks.

    ``keys`` are the float64 ranking keys (``-squared distance`` for Euclidean). Memory stays
    O(block * N + N * D) however many queries there are.
    """
    prep = _prepare(query, reference, metric, exclude_self)
    if backend == "faiss":
        shortlist = _FaissShortlist(prep)
    else:
        shortlist = lambda rows, m: _shortlist_torch(prep, rows, m)  # noqa: E731
    m0 = min(k + SHORTLIST_SLACK, prep.num_candidates)
    n_q = prep.query32.shape[0]
    if query_block is None:
        query_block = max(1, min(1024, RESCORE_BYTES // (8 * m0 * max(prep.query64.shape[1], 1))))
    shared = None
    if backend == "torch" and prep.symmetric and m0 < prep.num_candidates:
        shared = _shortlist_symmetric(prep, m0, SYMMETRIC_TILE)
    for start in range(0, n_q, query_block):
        end = min(n_q, start + query_block)
        rows = torch.arange(start, end)
        first = None if shared is None else (shared[0][start:end], shared[1][start:end])
        keys, idx = _search_rows(prep, rows, k, m0, shortlist, first)
        yield start, end, keys, idx


def keys_to_values(keys: torch.Tensor, metric: str) -> torch.Tensor:
    """Convert float64 ranking keys to distances (Euclidean) or similarities (cosine, dot)."""
    if metric == "euclidean":
        return (-keys).clamp_min(0.0).sqrt()
    return keys


def knn(
    query: torch.Tensor,
    reference: torch.Tensor,
    k: int,
    *,
    exclude_self: bool = False,
    metric: str = "euclidean",
    backend: str = "torch",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact k nearest references of each query: ``(values [Nq, k] float64, indices [Nq, k] int64)``.

    ``values`` are Euclidean distances (ascending) or cosine / dot similarities (descending);
    ties are broken by the smaller reference index. ``exclude_self`` drops reference ``i`` for
    query ``i`` (leave-one-out, ``reference`` is the query set). ``backend`` ``"torch"``
    (blocked matrix products) and ``"faiss"`` (exact flat index) return identical results.
    """
    validate_params(
        "knn",
        {"k": k, "metric": metric, "backend": backend, "exclude_self": exclude_self},
        {
            "k": [Interval(int, 1, None)],
            "metric": [Options(METRICS)],
            "backend": [Options(BACKENDS)],
            "exclude_self": [BOOL],
        },
    )
    for name, x in (("query", query), ("reference", reference)):
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or not x.is_floating_point():
            raise InvalidParameterError(f"{name} must be a floating-point torch.Tensor of shape [N, D].")
        check_finite(x, name)
    if query.shape[1] != reference.shape[1]:
        raise DataError(f"query has {query.shape[1]} columns but reference has {reference.shape[1]}.")
    if exclude_self and query.shape[0] != reference.shape[0]:
        raise DataError(
            f"exclude_self needs the query set as reference: query has {query.shape[0]} rows "
            f"but reference has {reference.shape[0]}."
        )
    available = reference.shape[0] - int(exclude_self)
    if k > available:
        raise InvalidParameterError(f"k={k} neighbours requested but only {available} references are available.")
    keys, idx = [], []
    for _, _, kb, ib in iter_knn_blocks(query, reference, k, exclude_self=exclude_self, metric=metric, backend=backend):
        keys.append(kb)
        idx.append(ib)
    if not keys:
        return torch.empty(0, k, dtype=torch.float64), torch.empty(0, k, dtype=torch.int64)
    return keys_to_values(torch.cat(keys), metric), torch.cat(idx)
