"""Exact k-nearest-neighbour search: float32 shortlist, float64 re-ranking, certified exactness.

How a neighbour list is defined (both backends return exactly this):

* every (query, reference) pair gets a float64 *key* computed from the inputs one pair at a
  time: ``-||q - r||^2`` for ``metric="euclidean"``, ``<q/|q|, r/|r|>`` for ``"cosine"`` and
  ``<q, r>`` for ``"dot"`` (products of float32 values are exact in float64; only the final
  sum of ``D`` terms rounds, at ~1e-16 relative);
* references are ordered by key, larger first; equal keys are ordered by the smaller
  reference index (deterministic tie-breaking);
* with ``exclude_self=True`` reference ``i`` is never a neighbour of query ``i``.

How it is computed fast: the scores are first taken from a float32 matrix product (blocked,
so memory is O(block * N + N * k), never N x N) and each query keeps a running top-``m``
shortlist (``m > k``). The shortlist is re-ranked with the float64 keys. The float32 scores
differ from the exact ones by at most ``eps_i = c * |q_i| * max_j |r_j|`` (standard dot-product
rounding bound, ``c = 2 (D + 3) 2^-24``). If the k-th exact key of the shortlist beats the
smallest shortlisted float32 score by more than ``eps_i``, no reference outside the shortlist
can enter the top k, so the result is exact. Queries that cannot be certified (near-ties,
duplicates) are searched again with a 4x larger shortlist until certified; at ``m = N`` the
search is exhaustive, so the loop always ends.
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


@dataclass
class _Prepared:
    """Float32 search operands (augmented for Euclidean) and float64 re-ranking operands."""

    query32: torch.Tensor  # [Nq, Da]
    reference32: torch.Tensor  # [Nr, Da]
    query64: torch.Tensor  # [Nq, D]
    reference64: torch.Tensor  # [Nr, D]
    query_sq_norm: torch.Tensor  # [Nq] float64 (Euclidean only, else zeros)
    bound: torch.Tensor  # [Nq] float64 bound on |float32 score - exact score|
    metric: str
    exclude_self: bool

    @property
    def num_references(self) -> int:
        return self.reference32.shape[0]

    @property
    def num_candidates(self) -> int:
        return self.num_references - int(self.exclude_self)


def _prepare(query: torch.Tensor, reference: torch.Tensor, metric: str, exclude_self: bool) -> _Prepared:
    """Build operands so that ``query32 @ reference32.T`` approximates a larger-is-closer score."""
    q64, r64 = query.detach().cpu().double(), reference.detach().cpu().double()
    if metric == "cosine":
        q64 = q64 / q64.norm(dim=1, keepdim=True).clamp_min(1e-300)
        r64 = r64 / r64.norm(dim=1, keepdim=True).clamp_min(1e-300)
    q_sq = (q64 * q64).sum(1)
    if metric == "euclidean":
        # <[q, 1], [r, -|r|^2 / 2]> = (|q|^2 - |q - r|^2) / 2 ranks like -|q - r|^2.
        qa = torch.cat([q64, torch.ones_like(q64[:, :1])], 1)
        ra = torch.cat([r64, -0.5 * (r64 * r64).sum(1, keepdim=True)], 1)
    else:
        qa, ra = q64, r64
        q_sq = torch.zeros_like(q_sq)
    width = qa.shape[1]
    c = 2.0 * (width + 3) * FLOAT32_UNIT_ROUNDOFF + 1e-12
    r_max = ra.norm(dim=1).max() if ra.shape[0] else torch.tensor(0.0, dtype=torch.float64)
    bound = c * qa.norm(dim=1) * r_max + 1e-300
    return _Prepared(
        query32=qa.float().contiguous(),
        reference32=ra.float().contiguous(),
        query64=q64,
        reference64=r64,
        query_sq_norm=q_sq,
        bound=bound,
        metric=metric,
        exclude_self=exclude_self,
    )


def _exact_keys(prep: _Prepared, rows: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Float64 keys ``[b, m]`` (larger is closer) of the pairs ``(rows[i], idx[i, j])``."""
    q = prep.query64[rows].unsqueeze(1)  # [b, 1, D]
    r = prep.reference64[idx]  # [b, m, D]
    if prep.metric == "euclidean":
        diff = q - r
        return -(diff * diff).sum(-1)
    return (q * r).sum(-1)


def _keys_to_scores(prep: _Prepared, rows: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Express float64 keys in the units of the float32 search scores."""
    if prep.metric == "euclidean":
        return 0.5 * (prep.query_sq_norm[rows].unsqueeze(1) + keys)
    return keys


def _shortlist_torch(prep: _Prepared, rows: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Running top-``m`` float32 scores and indices ``[b, m]`` over reference chunks."""
    q = prep.query32[rows]
    b, n_ref = q.shape[0], prep.num_references
    chunk = max(m, min(n_ref, TILE_BYTES // (4 * max(b, 1))))
    best_v = best_i = None
    for c0 in range(0, n_ref, chunk):
        c1 = min(n_ref, c0 + chunk)
        s = q @ prep.reference32[c0:c1].T
        if prep.exclude_self:
            inside = (rows >= c0) & (rows < c1)
            s[inside.nonzero().squeeze(1), rows[inside] - c0] = float("-inf")
        v, i = s.topk(min(m, c1 - c0), dim=1, sorted=False)
        i += c0
        if best_v is not None:
            v, i = torch.cat([best_v, v], 1), torch.cat([best_i, i], 1)
            if v.shape[1] > m:
                v, pos = v.topk(m, dim=1, sorted=False)
                i = i.gather(1, pos)
        best_v, best_i = v, i
    return best_v, best_i


class _FaissShortlist:
    """Top-``m`` float32 inner products from an exact flat faiss index (built once)."""

    def __init__(self, prep: _Prepared):
        import faiss

        self.prep = prep
        self.index = faiss.IndexFlatIP(prep.reference32.shape[1])
        self.index.add(prep.reference32.numpy())

    def __call__(self, rows: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
        extra = int(self.prep.exclude_self)
        v, i = self.index.search(self.prep.query32[rows].numpy(), m + extra)
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
    kth = _keys_to_scores(prep, rows, keys[:, -1:]).squeeze(1)
    threshold = v.double().min(dim=1).values + prep.bound[rows]
    return keys, i, kth > threshold


def _search_rows(prep: _Prepared, rows: torch.Tensor, k: int, m: int, shortlist) -> tuple[torch.Tensor, ...]:
    """Certified exact top-``k`` for ``rows``: shortlist, re-rank, retry uncertain rows with larger m."""
    m = min(m, prep.num_candidates)
    keys, idx, ok = _rank_shortlist(prep, rows, *shortlist(rows, m), k, m)
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
    m0 = k + max(8, k // 2)
    n_q = prep.query32.shape[0]
    if query_block is None:
        query_block = max(1, min(1024, RESCORE_BYTES // (8 * m0 * max(prep.query64.shape[1], 1))))
    for start in range(0, n_q, query_block):
        end = min(n_q, start + query_block)
        rows = torch.arange(start, end)
        keys, idx = _search_rows(prep, rows, k, m0, shortlist)
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
