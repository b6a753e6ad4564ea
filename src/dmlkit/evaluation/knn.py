"""Exact k-nearest-neighbour search: float32 shortlist, float64 re-ranking, certified exactness.

How a neighbour list is defined (both backends return exactly this):

* every (query, reference) pair gets a float64 *key* computed from the inputs one pair at a
  time: ``-||q - r||^2`` for ``metric="euclidean"``, ``<q/|q|, r/|r|>`` for ``"cosine"`` and
  ``<q, r>`` for ``"dot"`` (products of float32 values are exact in float64; only the final
  sum of ``D`` terms rounds, at ~1e-16 relative);
* references are ordered by key, larger first; equal keys are ordered by the smaller
  reference index (deterministic tie-breaking);
* with ``exclude_self=True`` reference ``i`` is never a neighbour of query ``i``.

How it is computed fast: search scores approximating ``<q, r> - h_q - h_r`` (``h = |x|^2 / 2``
for Euclidean, so the score is ``-d^2 / 2``; ``h = 0`` otherwise) come from float32 matrix
products in cache-sized tiles (memory O(tile + N * m), never N x N), and each query keeps a
running top-``m`` shortlist (``m = k + 2``). The first tile of a query seeds its shortlist with
``topk``; every later tile only passes the entries above the query's current m-th best score
(found through the maxima of groups of 16 rows of a tile, one cheap pass that serves the row and
the column thresholds, plus work on the few survivors). In leave-one-out on one tensor only the
tiles on and above the diagonal are multiplied; each tile serves its rows and, through per-column
thresholds, its columns (half the products). The tiles are shared among
``torch.get_num_threads()`` single-threaded workers with their own running tops, merged at the
end. When the C extension ``_knn_scan`` was built (``setup.py``, at install time), a worker
multiplies a tile a few hundred rows at a time and the C scan compares each block with the row
and column thresholds while it is still in cache, updating the running tops (min-heaps) entry by
entry; without it PyTorch operations do the filtering and merging. Both find a valid shortlist
(the same up to ties of the tile scores) and the same certified result. The shortlist is re-ranked
with the float64 keys; the queries it cannot certify are searched again together. Float32 scores differ from the exact
ones by at most ``eps_i = c (|q_i| max_j |r_j| + h_i + max_j h_j)`` with ``c = 2 (D + 6) 2^-24``
(standard dot-product rounding bound with a factor-2 margin).

On a CPU with native bf16 products (AVX512-BF16 or AMX, through oneDNN) and when the operands are
the plain embeddings (the reference ``h`` nearly equal: normalised embeddings, cosine, dot), the
tiles are multiplied in bf16 (about 2.3x the float32 rate; fp32 accumulation, bf16 output) and
the shortlist is longer (``m = k + BF16_SHORTLIST_SLACK``). With ``q~ = bf16(q)`` and the measured
rounding residuals ``dq = q - q~`` (float64), ``<q, r> - <q~, r~>`` is at most
``|q~_i| max|dr| + |dq_i| max|r~| + |dq_i| max|dr|``; the bf16 x bf16 products are exact in fp32
and their fp32 sum adds at most ``2 (D + 6) 2^-24 |q~_i| max|r~|``; the bf16 output rounds by
``u = 2^-9`` relative, and a reference dropped below a tile score ``t`` had an fp32 sum of at most
``t + u |t| / (1 - u)``. So the proof below holds with ``eps_i`` = the sum of those terms
(``tile_bound``, with a 1% margin) plus ``u |t_i| / (1 - u)`` for the row's smallest kept score
``t_i``, about ``1.7u`` for unit vectors. Every reference left out of the
shortlist scored at most the smallest shortlisted float32 score, so if the k-th exact score of the
shortlist beats that score by more than ``eps_i``, no reference outside it can enter the top k and
the result is exact. Queries that cannot be certified (near-ties, duplicates, float32 overflow)
are searched again with a 4x larger shortlist until certified; at ``m = N`` every reference is
re-ranked, so the loop always ends. The faiss backend takes its shortlist from ``IndexFlatIP``
and shares everything else.

Embeddings on a GPU (any device but the CPU; :data:`DEVICE_SEARCH`) are searched there: the same
operands, keys and certificate are built on that device, the shortlists come from float32 score
tiles sized to its free memory (:mod:`dmlkit.evaluation.knn_device`: matrix product, top-k, merge),
and the blocks are yielded on the device (the float32 CPU path's blocks).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterator

import torch

from dmlkit.core.cpu_ops import cpu_bf16_native
from dmlkit.core.validation import BOOL, Interval, Options, validate_params
from dmlkit.evaluation._checks import BACKENDS, METRICS, check_finite
from dmlkit.exceptions import DataError, InvalidParameterError

try:  # the C scan of the score tiles, built at install time (setup.py); optional
    from dmlkit.evaluation import _knn_scan
except ImportError:  # built without a C compiler: the PyTorch operations below find the same shortlists
    _knn_scan = None

FLOAT32_UNIT_ROUNDOFF = 2.0**-24
RESCORE_BYTES = 64 * 2**20  # float64 [rows, m, D] gather budget for re-ranking
TILE_BYTES = 32 * 2**20  # float32 score tile budget of the retry search
TILE_ROWS = 2048  # queries per score tile of the shortlist pass
TILE_COLS = 4096  # references per score tile of the shortlist pass
FILTER_GROUP = 16  # entries whose maximum is compared with a threshold before the entries themselves
SHORTLIST_SLACK = 2  # shortlist m = k + slack; uncertified queries retry with 4x larger m
BF16_UNIT_ROUNDOFF = 2.0**-9
BF16_SHORTLIST_SLACK = 9  # bf16 scores are coarser: m = k + 9 certifies 99.6% of the SOP-like benchmark queries at once
NATIVE_SUB_ROWS = 256  # rows per product of the C scan: the scores stay in the core's cache until scanned
#: Scan the shared score tiles with the C extension when it was built (False: PyTorch operations only).
NATIVE_SCAN = True
#: Precision of the shared score tiles: "auto" (bf16 where it is native and the operands allow), "float32", "bfloat16".
TILE_PRECISION = "auto"
#: Where the search runs: "auto" (embeddings off the CPU on their own device, :mod:`~dmlkit.evaluation.knn_device`;
#: CPU embeddings on the CPU's tiles), "always" (the device path for CPU embeddings too: tests, benchmarks),
#: "never" (every search copied to the CPU's tiles). The faiss backend always searches on the CPU.
DEVICE_SEARCH = "auto"


@dataclass
class _Prepared:
    """Float32 search operands, float64 re-ranking operands and the float32 error bound.

    Search score (larger is closer): ``s_ij = <query_op_i, reference_op_j>``, which equals the
    exact score ``<q_i, r_j> - h_i - h_j`` minus ``shift_i`` up to ``bound_i`` (``h = |x|^2 / 2``
    for Euclidean, so the exact score is ``-|q_i - r_j|^2 / 2``; ``h = 0`` otherwise). The biases
    ride in two extra columns (``[q, -h_q, 1]``, ``[r, 1, -h_r]``), so the score is symmetric in
    leave-one-out. When the reference ``h`` are all (nearly) equal, as for L2-normalised
    embeddings, the operands are the plain embeddings, ``shift_i = -h_i - mean_j h_j`` and the
    spread of ``h`` goes into the bound.
    """

    query_op: torch.Tensor  # [Nq, D'] float32
    reference_op: torch.Tensor  # [Nr, D'] float32
    query64: torch.Tensor  # [Nq, D]
    reference64: torch.Tensor  # [Nr, D]
    shift: torch.Tensor  # [Nq] float64: exact score ~= search score + shift
    bound: torch.Tensor  # [Nq] float64 bound on |search score + shift - exact score|
    tile_query: torch.Tensor  # [Nq, D'] operands of the shared score tiles (query_op, or its bf16 copy)
    tile_reference: torch.Tensor  # [Nr, D']
    tile_bound: torch.Tensor  # [Nq] float64: ``bound`` for the tiles' scores, before the output rounding
    tile_output_rounding: float  # the tiles' bound adds this times |smallest kept score| (0 in float32)
    tile_slack: int  # shortlist m = k + tile_slack in the tiled pass
    metric: str
    exclude_self: bool
    symmetric: bool  # leave-one-out on one tensor: tiles are shared by rows and columns

    @property
    def num_references(self) -> int:
        return self.reference_op.shape[0]

    @property
    def num_candidates(self) -> int:
        return self.num_references - int(self.exclude_self)


def _prepare(query: torch.Tensor, reference: torch.Tensor, metric: str, exclude_self: bool,
             device: torch.device | None = None) -> _Prepared:
    """Build the float32 / float64 operands and the per-query rounding bound on ``device`` (default: the CPU;
    off the CPU the tiles are always float32)."""
    device = torch.device("cpu") if device is None else device
    symmetric = exclude_self and query is reference
    q64 = query.detach().to(device).double()
    r64 = q64 if symmetric else reference.detach().to(device).double()
    if metric == "cosine":
        q64 = q64 / q64.norm(dim=1, keepdim=True).clamp_min(1e-300)
        r64 = q64 if symmetric else r64 / r64.norm(dim=1, keepdim=True).clamp_min(1e-300)
    if metric == "euclidean":
        q_h, r_h = 0.5 * (q64 * q64).sum(1), 0.5 * (r64 * r64).sum(1)
    else:
        q_h = torch.zeros(q64.shape[0], dtype=torch.float64, device=device)
        r_h = torch.zeros(r64.shape[0], dtype=torch.float64, device=device)
    r_norm_max = float(r64.norm(dim=1).max()) if r64.shape[0] else 0.0
    h_max = float(r_h.max()) if r_h.numel() else 0.0
    spread = float(r_h.max() - r_h.min()) if r_h.numel() else 0.0
    folded = spread <= 1e-6 * (1.0 + h_max)
    c = 2.0 * (q64.shape[1] + 6) * FLOAT32_UNIT_ROUNDOFF + 1e-12
    bound = c * (q64.norm(dim=1) * r_norm_max + q_h + h_max) + (2.0 * spread if folded else 0.0) + 1e-300
    q32 = q64.float().contiguous()
    r32 = q32 if symmetric else r64.float().contiguous()
    if folded:
        shift = -q_h - (float(r_h.mean()) if r_h.numel() else 0.0)
        q_op, r_op = q32, r32
    else:
        shift = torch.zeros_like(q_h)
        q_op = torch.cat([q32, -q_h.float().unsqueeze(1), torch.ones(len(q32), 1, device=device)], 1)
        r_op = torch.cat([r32, torch.ones(len(r32), 1, device=device), -r_h.float().unsqueeze(1)], 1)
    tile_query, tile_reference, tile_bound, tile_slack, output_rounding = q_op, r_op, bound, SHORTLIST_SLACK, 0.0
    if device.type == "cpu" and _bf16_tiles(folded):  # the operands are the embeddings themselves: q_op ~ q64
        tile_query = q_op.bfloat16()
        tile_reference = tile_query if symmetric else r_op.bfloat16()
        q_norm, q_residual = _norm_and_residual(q64, tile_query)
        r_norm, r_residual = (q_norm, q_residual) if symmetric else _norm_and_residual(r64, tile_reference)
        r_norm_max, r_residual_max = float(r_norm.max()), float(r_residual.max())
        inputs = q_norm * r_residual_max + q_residual * r_norm_max + q_residual * r_residual_max
        accumulation = 2.0 * (q64.shape[1] + 6) * FLOAT32_UNIT_ROUNDOFF * q_norm * r_norm_max
        tile_bound = 1.01 * (inputs + accumulation) + 2.0 * spread + 1e-300
        output_rounding = 1.01 * BF16_UNIT_ROUNDOFF / (1.0 - BF16_UNIT_ROUNDOFF)
        tile_slack = BF16_SHORTLIST_SLACK
    return _Prepared(
        query_op=q_op,
        reference_op=r_op,
        query64=q64,
        reference64=r64,
        shift=shift,
        bound=bound,
        metric=metric,
        exclude_self=exclude_self,
        symmetric=symmetric,
        tile_query=tile_query,
        tile_reference=tile_reference,
        tile_bound=tile_bound,
        tile_output_rounding=output_rounding,
        tile_slack=tile_slack,
    )


def _norm_and_residual(x64: torch.Tensor, rounded: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``|x~|`` and ``|x - x~|`` per row (float64) of a rounded copy ``x~`` of ``x64``."""
    x_rounded = rounded.double()
    return x_rounded.norm(dim=1), (x64 - x_rounded).norm(dim=1)


def _bf16_tiles(folded: bool) -> bool:
    """Whether the shared tiles are multiplied in bf16 (see the module docstring and ``TILE_PRECISION``)."""
    if TILE_PRECISION not in ("auto", "float32", "bfloat16"):
        raise InvalidParameterError(f"TILE_PRECISION must be 'auto', 'float32' or 'bfloat16'. Got {TILE_PRECISION!r} instead.")
    if TILE_PRECISION == "auto":
        return folded and cpu_bf16_native()
    return folded and TILE_PRECISION == "bfloat16"


def _exact_keys(prep: _Prepared, rows: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Float64 keys ``[b, m]`` (larger is closer) of the pairs ``(rows[i], idx[i, j])``."""
    q = prep.query64[rows].unsqueeze(1)  # [b, 1, D]
    # [b, m, D], a fresh copy; an unfilled slot (-1, score -inf) gets any row: its query is not certified anyway
    r = prep.reference64.index_select(0, idx.reshape(-1).clamp_min(0)).view(*idx.shape, -1)
    if prep.metric == "euclidean":
        r.sub_(q)
        return r.mul_(r).sum(-1).neg_()
    return r.mul_(q).sum(-1)


def _keys_to_scores(prep: _Prepared, keys: torch.Tensor) -> torch.Tensor:
    """Express float64 keys in search-score units (``-d^2 / 2`` for Euclidean)."""
    return 0.5 * keys if prep.metric == "euclidean" else keys


def _mask_self(s: torch.Tensor, r0: int, c0: int) -> None:
    """Set the entries ``(i, i)`` of a score tile with rows ``r0..`` and columns ``c0..`` to ``-inf``."""
    lo, hi = max(r0, c0), min(r0 + s.shape[0], c0 + s.shape[1])
    if lo < hi:
        d = torch.arange(lo, hi)
        s[d - r0, d - c0] = float("-inf")


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
    """Running top-``m`` search scores and indices ``[b, m]`` of ``rows`` over reference chunks."""
    q = prep.query_op[rows]
    b, n_ref = q.shape[0], prep.num_references
    chunk = max(m, min(n_ref, TILE_BYTES // (4 * max(b, 1))))
    best_v = best_i = None
    for c0 in range(0, n_ref, chunk):
        c1 = min(n_ref, c0 + chunk)
        s = q @ prep.reference_op[c0:c1].T
        if prep.exclude_self:
            inside = (rows >= c0) & (rows < c1)
            s[inside.nonzero().squeeze(1), rows[inside] - c0] = float("-inf")
        v, i = s.topk(min(m, c1 - c0), dim=1, sorted=False)
        best_v, best_i = _merge_topm(best_v, best_i, v, i + c0, m)
    return best_v, best_i


def _above(
    s: torch.Tensor, t_rows: torch.Tensor, t_cols: torch.Tensor | None, group: int
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...] | None]:
    """Entries of the tile ``s [R, C]`` above their row's threshold ``t_rows [R]`` (and their
    column's ``t_cols [C]``), as ``(row, column, value)`` triples per direction.

    One pass takes the maxima of ``group`` consecutive rows per column; a group passes when its
    maximum beats the smallest row threshold of the group or the column's threshold, and only
    passing groups are compared entry by entry. Thresholds have the tile's dtype.
    """
    r, c = s.shape
    if r % group:
        i, j = (s > t_rows.unsqueeze(1)).nonzero(as_tuple=True)
        by_row = (i, j, s[i, j])
        if t_cols is None:
            return by_row, None
        i, j = (s > t_cols).nonzero(as_tuple=True)
        return by_row, (i, j, s[i, j])
    blocks = s.view(r // group, group, c)
    maxima = blocks.amax(1)  # [R / group, C]
    passing = maxima > t_rows.view(-1, group).amin(1).unsqueeze(1)
    if t_cols is not None:
        passing |= maxima > t_cols
    gi, gj = passing.nonzero(as_tuple=True)
    sub = blocks[gi, :, gj]  # [P, group]
    row = gi.unsqueeze(1) * group + torch.arange(group)  # [P, group]
    p, o = (sub > t_rows[row]).nonzero(as_tuple=True)
    by_row = (row[p, o], gj[p], sub[p, o])
    if t_cols is None:
        return by_row, None
    p, o = (sub > t_cols[gj].unsqueeze(1)).nonzero(as_tuple=True)
    return by_row, (row[p, o], gj[p], sub[p, o])


class _RunningTop:
    """Per-query running top-``m`` search scores ``[N, m]`` with indices and the m-th best as threshold.

    Rows start at ``-inf`` / index ``-1``; the threshold (the smallest kept score) only grows, so
    an entry at or below it can be dropped for good.
    """

    def __init__(self, n: int, m: int):
        self.m = m
        self.values = torch.full((n, m), float("-inf"))
        self.indices = torch.full((n, m), -1, dtype=torch.int64)
        self.threshold = torch.full((n,), float("-inf"))

    def start(self, r0: int, c0: int, s: torch.Tensor) -> None:
        """Fill rows ``r0..`` (still empty) with the top of the tile ``s`` whose columns start at ``c0``."""
        w = min(self.m, s.shape[1])
        v, i = s.topk(w, dim=1, sorted=False)
        r1 = r0 + s.shape[0]
        self.values[r0:r1, :w], self.indices[r0:r1, :w] = v, i + c0
        self.threshold[r0:r1] = self.values[r0:r1].amin(1)

    def copy(self) -> "_RunningTop":
        """An independent copy."""
        out = _RunningTop(0, self.m)
        out.values, out.indices, out.threshold = self.values.clone(), self.indices.clone(), self.threshold.clone()
        return out

    def merge(self, query: torch.Tensor, ref: torch.Tensor, value: torch.Tensor) -> None:
        """Merge candidate triples (query, reference index, score) into the running tops."""
        if len(query) == 0:
            return
        query, order = query.sort(stable=True)
        ref, value = ref[order], value[order]
        uq, counts = torch.unique_consecutive(query, return_counts=True)
        group = torch.repeat_interleave(torch.arange(len(uq)), counts)
        pos = torch.arange(len(query)) - (counts.cumsum(0) - counts)[group] + self.m
        width = self.m + int(counts.max())
        v = torch.full((len(uq), width), float("-inf"))
        i = torch.full((len(uq), width), -1, dtype=torch.int64)
        v[:, : self.m], i[:, : self.m] = self.values[uq], self.indices[uq]
        v[group, pos], i[group, pos] = value.to(v.dtype), ref
        v, sel = v.topk(self.m, dim=1, sorted=False)
        self.values[uq], self.indices[uq] = v, i.gather(1, sel)
        self.threshold[uq] = v.amin(1)


def _union_tops(values: list[torch.Tensor], indices: list[torch.Tensor], m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``m`` scores and indices ``[N, m]`` over several workers' running tops, counting a shared pair once."""
    if len(values) == 1:
        return values[0], indices[0]
    i, order = torch.cat(indices, 1).sort(dim=1)
    v = torch.cat(values, 1).gather(1, order)
    v[:, 1:][i[:, 1:] == i[:, :-1]] = float("-inf")  # a pair kept by several tops (the seeds)
    v, sel = v.topk(m, dim=1, sorted=False)
    return v, i.gather(1, sel)


def _tile_plan(prep: _Prepared) -> tuple[list[tuple[int, int, int, int]], list[tuple[int, int, int, int]]]:
    """Score tiles ``(r0, r1, c0, c1)``: the seeding tiles (one per query strip) and the others.

    In leave-one-out on one tensor the references form blocks of ``TILE_COLS``; the seeding
    tiles are the diagonal blocks and the others are the blocks above the diagonal, each
    pair of samples appearing in exactly one tile, in order of their distance from the diagonal:
    block pair ``(a, a + d)`` comes in sweep ``d``, so by then both its rows and its columns have
    seen about ``2 d`` blocks and their thresholds are equally tight (in row order the columns of
    late blocks would meet the early rows with only their seed behind them).
    """
    n_q, n_r = prep.query_op.shape[0], prep.reference_op.shape[0]
    cols = max(1, TILE_COLS)
    rows = max(1, min(TILE_ROWS, cols))
    if prep.symmetric:
        blocks = [(c0, min(n_r, c0 + cols)) for c0 in range(0, n_r, cols)]
        first = [(r0, min(r0 + rows, c1), c0, c1) for c0, c1 in blocks for r0 in range(c0, c1, rows)]
        rest = [
            (r0, min(r0 + rows, a1), c0, c1)
            for d in range(1, len(blocks))
            for (a0, a1), (c0, c1) in zip(blocks, blocks[d:])
            for r0 in range(a0, a1, rows)
        ]
        return first, rest
    strips = [(r0, min(n_q, r0 + rows)) for r0 in range(0, n_q, rows)]
    first = [(r0, r1, 0, min(n_r, cols)) for r0, r1 in strips]
    return first, [(r0, r1, c0, min(n_r, c0 + cols)) for r0, r1 in strips for c0 in range(cols, n_r, cols)]


def _tile_product(prep: _Prepared, buf: torch.Tensor, r0: int, r1: int, c0: int, c1: int) -> torch.Tensor:
    """Search scores of queries ``r0..r1`` against references ``c0..c1`` written into ``buf``; self pairs ``-inf``."""
    s = torch.mm(prep.tile_query[r0:r1], prep.tile_reference[c0:c1].T,
                 out=buf[: (r1 - r0) * (c1 - c0)].view(r1 - r0, c1 - c0))
    if prep.exclude_self:
        _mask_self(s, r0, c0)
    return s


def _run_workers(n_workers: int, seed, fork, scan) -> None:
    """``seed(w)`` in every worker, then ``fork()`` (each worker gets its own running tops), then ``scan(w)``.

    Each worker runs single-threaded (a busy machine does not stall a parallel region on every small
    operation); torch's thread count is restored afterwards.
    """
    threads = torch.get_num_threads()

    def single_threaded(step):
        def run(w: int) -> None:
            torch.set_num_threads(1)
            step(w)

        return run

    try:
        with ThreadPoolExecutor(n_workers) as pool:
            list(pool.map(single_threaded(seed), range(n_workers)))
            fork()
            list(pool.map(single_threaded(scan), range(n_workers)))
    finally:
        torch.set_num_threads(threads)


def _shortlist_tiled(prep: _Prepared, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``m`` search scores and indices ``[Nq, m]`` of every query from cache-sized score tiles.

    The first tile of each query row (the diagonal block in leave-one-out) seeds the running
    top-``m`` with ``topk``; later tiles only pass entries above the query's current m-th best
    (:func:`_above`), which after a few tiles is a tiny fraction. In leave-one-out on one tensor
    each tile above the diagonal serves its rows and, through the per-column thresholds, its
    columns (half the products). The tiles are shared out among ``torch.get_num_threads()``
    single-threaded workers (:func:`_run_workers`), each with its own running tops (merged at the
    end), so no worker waits on another. A worker filters with the largest threshold of all workers: every running top holds ``m``
    distinct pairs, so the merged m-th best is at least any worker's threshold (reading a
    threshold while another worker raises it is harmless: any value read is a valid lower bound).
    Memory is O(workers * (tile + Nq * m)). With the C extension the tiles are scanned by
    :func:`_shortlist_native` instead (the same shortlists up to ties of the tile scores).
    """
    if NATIVE_SCAN and _knn_scan is not None:
        return _shortlist_native(prep, m)
    first, rest = _tile_plan(prep)
    n_workers = max(1, min(torch.get_num_threads(), len(first)))
    seeded = _RunningTop(prep.tile_query.shape[0], m)
    tops: list[_RunningTop] = []
    tile_size = max(r1 - r0 for r0, r1, _, _ in first) * max(c1 - c0 for _, _, c0, c1 in first)
    dtype = prep.tile_query.dtype

    def threshold(lo: int, hi: int) -> torch.Tensor:
        t = tops[0].threshold[lo:hi]
        for other in tops[1:]:
            t = torch.maximum(t, other.threshold[lo:hi])
        return t

    def seed(w: int) -> None:  # seeding tiles cover disjoint rows of the shared running top
        buf = torch.empty(tile_size, dtype=dtype)
        for r0, r1, c0, c1 in first[w::n_workers]:
            seeded.start(r0, c0, _tile_product(prep, buf, r0, r1, c0, c1))

    def scan(w: int) -> None:
        buf, own = torch.empty(tile_size, dtype=dtype), tops[w]
        for r0, r1, c0, c1 in rest[w::n_workers]:
            s = _tile_product(prep, buf, r0, r1, c0, c1)
            t_cols = threshold(c0, c1).to(dtype) if prep.symmetric else None  # exact: kept scores are tile values
            (i, j, v), by_column = _above(s, threshold(r0, r1).to(dtype), t_cols, FILTER_GROUP)
            query, ref, value = [i + r0], [j + c0], [v]
            if by_column is not None:
                i, j, v = by_column
                query.append(j + c0), ref.append(i + r0), value.append(v)
            own.merge(torch.cat(query), torch.cat(ref), torch.cat(value))

    _run_workers(n_workers, seed, lambda: tops.extend([seeded] + [seeded.copy() for _ in range(n_workers - 1)]), scan)
    return _union_tops([t.values for t in tops], [t.indices for t in tops], m)


def _shortlist_native(prep: _Prepared, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_shortlist_tiled` with the tiles scanned in C (``_knn_scan.c``): same plan, same workers.

    Each worker's running tops are min-heaps ``[N, m]`` (root = the m-th best = the threshold) that
    the C scan updates in place entry by entry, after a vectorised comparison of 32 entries at a time
    with their row and column thresholds. A tile is multiplied ``NATIVE_SUB_ROWS`` rows at a time,
    each block scanned while it is still in cache. Seeding tiles start from a threshold that at least
    ``m`` entries of the row pass (just below the m-th largest maximum of 32-entry chunks). Before each
    tile a worker copies the other workers' thresholds as a floor (any of them bounds the merged
    m-th best from below, as in :func:`_shortlist_tiled`).
    """
    first, rest = _tile_plan(prep)
    n_workers = max(1, min(torch.get_num_threads(), len(first)))
    n, dtype = prep.tile_query.shape[0], prep.tile_query.dtype
    bf16 = dtype == torch.bfloat16
    values = [torch.full((n, m), float("-inf"))]
    indices = [torch.full((n, m), -1, dtype=torch.int64)]
    seed_floor = torch.full((n,), float("-inf"))
    sub_rows = max(1, NATIVE_SUB_ROWS)
    buf_size = sub_rows * max(c1 - c0 for _, _, c0, c1 in first)

    def products(buf: torch.Tensor, r0: int, r1: int, c0: int, c1: int) -> Iterator[tuple[int, torch.Tensor]]:
        for s0 in range(r0, r1, sub_rows):
            yield s0, _tile_product(prep, buf, s0, min(r1, s0 + sub_rows), c0, c1)

    def seed(w: int) -> None:  # seeding tiles cover disjoint rows of the shared tops
        buf = torch.empty(buf_size, dtype=dtype)
        for r0, r1, c0, c1 in first[w::n_workers]:
            for s0, s in products(buf, r0, r1, c0, c1):
                rows, cols = s.shape
                _knn_scan.seed_floor(s.data_ptr(), bf16, rows, cols, s0, m, seed_floor.data_ptr())
                _knn_scan.scan_tile(s.data_ptr(), bf16, rows, cols, s0, c0, False, values[0].data_ptr(),
                                    indices[0].data_ptr(), m, seed_floor.data_ptr())

    def fork() -> None:
        values.extend(values[0].clone() for _ in range(n_workers - 1))
        indices.extend(indices[0].clone() for _ in range(n_workers - 1))

    def scan(w: int) -> None:
        buf = torch.empty(buf_size, dtype=dtype)
        own_v, own_i = values[w], indices[w]
        others = [v for k, v in enumerate(values) if k != w]
        floor = torch.full((n,), float("-inf"))
        for r0, r1, c0, c1 in rest[w::n_workers]:
            if others:
                floor.copy_(others[0][:, 0])
                for other in others[1:]:
                    torch.maximum(floor, other[:, 0], out=floor)
            for s0, s in products(buf, r0, r1, c0, c1):
                rows, cols = s.shape
                _knn_scan.scan_tile(s.data_ptr(), bf16, rows, cols, s0, c0, prep.symmetric, own_v.data_ptr(),
                                    own_i.data_ptr(), m, floor.data_ptr())

    _run_workers(n_workers, seed, fork, scan)
    return _union_tops(values, indices, m)


class _FaissShortlist:
    """Top-``m`` search scores from an exact flat faiss index over the reference operands (built once)."""

    def __init__(self, prep: _Prepared):
        import faiss

        self.prep = prep
        self.index = faiss.IndexFlatIP(prep.reference_op.shape[1])
        self.index.add(prep.reference_op.numpy())

    def __call__(self, rows: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
        extra = int(self.prep.exclude_self)
        v, i = self.index.search(self.prep.query_op[rows].numpy(), m + extra)
        v, i = torch.from_numpy(v), torch.from_numpy(i).long()
        if extra:
            is_self = i == rows.unsqueeze(1)
            is_self[~is_self.any(1), -1] = True  # self not found: drop the last (worst) entry
            keep = ~is_self
            v, i = v[keep].view(len(rows), m), i[keep].view(len(rows), m)
        return v, i


def _rank_shortlist(
    prep: _Prepared, rows: torch.Tensor, v: torch.Tensor, i: torch.Tensor, k: int, m: int,
    bound: torch.Tensor, output_rounding: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Re-rank a shortlist with float64 keys; return keys, indices ``[b, k]`` and a certified mask ``[b]``.

    The scores ``v`` are within ``bound [Nq] + output_rounding * |smallest score|`` of the exact
    ones (``prep.bound``; for the tiles ``prep.tile_bound`` and ``prep.tile_output_rounding``).
    """
    i, order = i.sort(dim=1)  # ties in key resolve to the smaller index via the stable sort below
    v = v.gather(1, order)
    keys = _exact_keys(prep, rows, i)
    keys, order = keys.sort(dim=1, descending=True, stable=True)
    i = i.gather(1, order)
    keys, i = keys[:, :k], i[:, :k]
    if m >= prep.num_candidates:
        return keys, i, torch.ones(len(rows), dtype=torch.bool, device=rows.device)
    kth = _keys_to_scores(prep, keys[:, -1])
    smallest = v.double().min(dim=1).values
    margin = bound[rows] + output_rounding * smallest.abs()
    # a non-finite score (an unfilled slot or float32 overflow) proves nothing: search again
    return keys, i, (kth > smallest + prep.shift[rows] + margin) & torch.isfinite(v).all(1)


def _candidates(prep: _Prepared, rows: torch.Tensor, m: int, shortlist) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``m`` shortlist of ``rows``; at ``m = N`` every reference but the query itself, unscored."""
    if m < prep.num_candidates:
        return shortlist(rows, m)
    n = prep.num_references
    idx = torch.arange(n, device=rows.device).expand(len(rows), n)
    if prep.exclude_self:
        idx = idx[idx != rows.unsqueeze(1)].view(len(rows), n - 1)
    return torch.zeros(idx.shape, device=rows.device), idx


def _search_rows(prep: _Prepared, rows: torch.Tensor, k: int, m: int, shortlist) -> tuple[torch.Tensor, ...]:
    """Certified exact top-``k`` for ``rows``: shortlist, re-rank, retry uncertain rows with larger m."""
    m = min(m, prep.num_candidates)
    keys, idx, ok = _rank_shortlist(prep, rows, *_candidates(prep, rows, m, shortlist), k, m, prep.bound)
    _retry_uncertified(prep, rows, keys, idx, ok, k, m, shortlist)
    return keys, idx


def _retry_uncertified(
    prep: _Prepared, rows: torch.Tensor, keys: torch.Tensor, idx: torch.Tensor, ok: torch.Tensor, k: int, m: int,
    shortlist,
) -> None:
    """Search the rows not certified (``~ok``) again with 4x larger shortlists until all are; updates in place."""
    while not bool(ok.all()):
        m = min(4 * m, prep.num_candidates)
        bad = (~ok).nonzero().squeeze(1)
        step = max(1, RESCORE_BYTES // (8 * m * max(prep.query64.shape[1], 1)))
        for s0 in range(0, len(bad), step):
            sel = bad[s0 : s0 + step]
            r = rows[sel]
            kk, ii, oo = _rank_shortlist(prep, r, *_candidates(prep, r, m, shortlist), k, m, prep.bound)
            keys[sel], idx[sel], ok[sel] = kk, ii, oo


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
    O(tile + Nq * k + N * D) however many queries there are (never Nq x N). Embeddings on a GPU
    are searched there (:func:`searches_on_device`) and the blocks come back on it.
    """
    if searches_on_device(query, backend):
        yield from _iter_device_blocks(query, reference, k, exclude_self, metric, query_block)
        return
    prep = _prepare(query, reference, metric, exclude_self)
    if backend == "faiss":
        shortlist = _FaissShortlist(prep)
    else:
        shortlist = lambda rows, m: _shortlist_torch(prep, rows, m)  # noqa: E731
    m0 = min(k + SHORTLIST_SLACK, prep.num_candidates)
    m_tiled = min(k + prep.tile_slack, prep.num_candidates)
    n_q = prep.query_op.shape[0]
    if query_block is None:
        query_block = max(1, min(1024, RESCORE_BYTES // (8 * m_tiled * max(prep.query64.shape[1], 1))))
    if backend == "torch" and m_tiled < prep.num_candidates:
        # the shared tiles give every query its shortlist at once: re-rank block by block, then
        # search the few uncertified queries of all blocks together
        shared_v, shared_i = _shortlist_tiled(prep, m_tiled)
        keys = torch.empty(n_q, k, dtype=torch.float64)
        idx = torch.empty(n_q, k, dtype=torch.int64)
        ok = torch.empty(n_q, dtype=torch.bool)
        for start in range(0, n_q, query_block):
            end = min(n_q, start + query_block)
            keys[start:end], idx[start:end], ok[start:end] = _rank_shortlist(
                prep, torch.arange(start, end), shared_v[start:end], shared_i[start:end], k, m_tiled,
                prep.tile_bound, prep.tile_output_rounding,
            )
        _retry_uncertified(prep, torch.arange(n_q), keys, idx, ok, k, m_tiled, shortlist)
        for start in range(0, n_q, query_block):
            end = min(n_q, start + query_block)
            yield start, end, keys[start:end], idx[start:end]
        return
    for start in range(0, n_q, query_block):
        end = min(n_q, start + query_block)
        rows = torch.arange(start, end)
        keys, idx = _search_rows(prep, rows, k, m0, shortlist)
        yield start, end, keys, idx


def searches_on_device(x: torch.Tensor, backend: str = "torch") -> bool:
    """Whether the search of ``x`` runs on ``x.device`` (:func:`_iter_device_blocks`) rather than the CPU's tiles.

    Embeddings off the CPU with the torch backend do (:data:`DEVICE_SEARCH` ``"auto"``); ``"always"``
    takes that path for CPU embeddings too, ``"never"`` for none.
    """
    if DEVICE_SEARCH not in ("auto", "always", "never"):
        raise InvalidParameterError(f"DEVICE_SEARCH must be 'auto', 'always' or 'never'. Got {DEVICE_SEARCH!r} instead.")
    if backend != "torch" or DEVICE_SEARCH == "never":
        return False
    return DEVICE_SEARCH == "always" or x.device.type != "cpu"


def _iter_device_blocks(
    query: torch.Tensor, reference: torch.Tensor, k: int, exclude_self: bool, metric: str, query_block: int | None,
) -> Iterator[tuple[int, int, torch.Tensor, torch.Tensor]]:
    """:func:`iter_knn_blocks` on the query's device: the same float32 operands, float64 keys and certificate,
    with the shortlists from float32 score tiles sized to the device's free memory
    (:func:`~dmlkit.evaluation.knn_device.topm_scores`). Blocks are the float32 CPU path's, so per-block
    consumers (the retrieval metrics' tie shuffling) see the same blocks on either path."""
    from dmlkit.evaluation.knn_device import topm_scores

    prep = _prepare(query, reference, metric, exclude_self, device=query.device)

    def shortlist(rows: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
        return topm_scores(prep.query_op, prep.reference_op, m, rows=rows, exclude_self=prep.exclude_self)

    m = min(k + SHORTLIST_SLACK, prep.num_candidates)
    n_q, device = prep.query_op.shape[0], prep.query_op.device
    if query_block is None:
        query_block = max(1, min(1024, RESCORE_BYTES // (8 * m * max(prep.query64.shape[1], 1))))
    everything = torch.arange(n_q, device=device)
    shared = shortlist(everything, m) if m < prep.num_candidates else None
    keys = torch.empty(n_q, k, dtype=torch.float64, device=device)
    idx = torch.empty(n_q, k, dtype=torch.int64, device=device)
    ok = torch.empty(n_q, dtype=torch.bool, device=device)
    for start in range(0, n_q, query_block):
        end = min(n_q, start + query_block)
        rows = everything[start:end]
        v, i = (shared[0][start:end], shared[1][start:end]) if shared else _candidates(prep, rows, m, shortlist)
        keys[start:end], idx[start:end], ok[start:end] = _rank_shortlist(prep, rows, v, i, k, m, prep.bound)
    _retry_uncertified(prep, everything, keys, idx, ok, k, m, shortlist)
    for start in range(0, n_q, query_block):
        end = min(n_q, start + query_block)
        yield start, end, keys[start:end], idx[start:end]


def drop_own_neighbours(indices: torch.Tensor, own: torch.Tensor,
                        *values: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``k + 1`` neighbours per row to ``k``: row ``i`` loses reference ``own[i]`` (the query itself), or its last
    neighbour when the query is not among them (PML's rule); each of ``values`` (``[N, k + 1]``, e.g. the
    distances) loses the same entries. Returns ``(indices, *values)``."""
    dropped = indices == own[:, None]
    dropped &= dropped.cumsum(1) == 1  # a row holding its own index twice drops it once
    dropped[~dropped.any(1), -1] = True
    keep = ~dropped
    width = indices.shape[1] - 1
    return tuple(t[keep].reshape(len(t), width) for t in (indices, *values))


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
    (blocked matrix products) and ``"faiss"`` (exact flat index) return identical results. Embeddings
    on a GPU are searched there with the torch backend and the results stay on it.
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
