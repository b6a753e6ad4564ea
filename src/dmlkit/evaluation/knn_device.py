"""The shortlist of the exact k-NN on the embeddings' own device (a GPU): score tiles and a running top-m.

:mod:`dmlkit.evaluation.knn` searches embeddings that live off the CPU where they are. Its
operands (``[Nq, D']`` float32 query and reference operands whose products are the search scores,
the float64 copies for the re-rank, the per-query rounding bound) are built on that device; this
module gives every query its top-``m`` search scores:

* the queries are cut into strips of ``R`` rows and the references into chunks of ``C`` columns,
  so a score tile ``[R, C]`` (float32 products, TF32 and reduced-precision modes off,
  :func:`ieee_float32_products`: the rounding bound of the re-rank assumes IEEE float32 sums) never exceeds the tile budget
  (:func:`tile_budget`: a share of the device's free memory, at most :data:`TILE_BYTES_CAP`);
* each tile's ``topk`` is merged into the strip's running top-``m`` (concatenate, ``topk`` again),
  with a query's own reference set to ``-inf`` in leave-one-out.

Everything stays on the device: no score tile and no embedding goes to the host. The float64
re-rank that certifies the result and resolves ties (equal keys: the smaller reference index)
is :mod:`~dmlkit.evaluation.knn`'s own, so both paths return the same neighbours; the only
difference is where the work runs. Called with CPU tensors the same code runs on the CPU (how
the tests check it against the CPU path and a float64 brute force).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

#: Score tiles never exceed this many bytes, however much memory is free.
TILE_BYTES_CAP = 1 << 30
#: Share of the device's free memory one score tile (and its top-k temporaries) may take.
FREE_MEMORY_SHARE = 0.25
#: Tile budget off CUDA (the CPU running this path in tests and benchmarks).
HOST_TILE_BYTES = 64 * 2**20
#: Query rows per score tile at most (rows beyond this buy nothing: the product is already large).
MAX_TILE_ROWS = 8192
#: Bytes of device memory per score-tile entry: the float32 score, ``topk``'s temporaries, the merge.
BYTES_PER_ENTRY = 12


def tile_budget(device: torch.device) -> int:
    """Bytes one score tile may take on ``device``: :data:`FREE_MEMORY_SHARE` of the free memory
    (``torch.cuda.mem_get_info``), at most :data:`TILE_BYTES_CAP`; :data:`HOST_TILE_BYTES` off CUDA."""
    if device.type != "cuda":
        return HOST_TILE_BYTES
    free, _total = torch.cuda.mem_get_info(device)
    return max(1 << 20, min(TILE_BYTES_CAP, int(FREE_MEMORY_SHARE * free)))


def tile_shape(num_queries: int, num_references: int, m: int, budget: int) -> tuple[int, int]:
    """Rows and columns ``(R, C)`` of a score tile: ``R * C * BYTES_PER_ENTRY <= budget`` (but ``C >= m``).

    The columns cover every reference when that leaves at least 256 rows (one top-k per strip, no
    merging); otherwise the strips keep 256 rows and the references come in chunks.
    """
    entries = max(budget // BYTES_PER_ENTRY, 1)
    rows = min(num_queries, MAX_TILE_ROWS, max(1, entries // max(num_references, 1)))
    if rows < min(num_queries, 256):
        rows = min(num_queries, 256)
    cols = min(num_references, max(m, entries // max(rows, 1)))
    return max(rows, 1), max(cols, 1)


@contextlib.contextmanager
def ieee_float32_products(device: torch.device) -> Iterator[None]:
    """Float32 products on ``device`` as IEEE float32 sums while inside: no TF32, no bf16 passes (the certified
    bound needs them), whatever the user set; their setting is restored after.

    Through the backend's ``fp32_precision`` (cuBLAS for CUDA, oneDNN for the CPU), which reads and
    restores a setting made with either of PyTorch's APIs (the legacy ``set_float32_matmul_precision``
    cannot be read once the newer one was used); without it, the legacy switch.
    """
    backend = {"cuda": getattr(torch.backends.cuda, "matmul", None),
               "cpu": getattr(torch.backends.mkldnn, "matmul", None)}.get(device.type)
    if backend is not None and hasattr(backend, "fp32_precision"):
        previous = backend.fp32_precision
        backend.fp32_precision = "ieee"
        try:
            yield
        finally:
            backend.fp32_precision = previous
        return
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


def _mask_own(scores: torch.Tensor, rows: torch.Tensor, c0: int) -> None:
    """Set the score of each query row against itself (reference ``rows[j]``, when in ``c0..``) to ``-inf``."""
    cols = scores.shape[1]
    own = rows - c0
    inside = (own >= 0) & (own < cols)
    col = own.clamp(0, cols - 1).unsqueeze(1)
    kept = scores.gather(1, col)
    scores.scatter_(1, col, torch.where(inside.unsqueeze(1), torch.full_like(kept, float("-inf")), kept))


def topm_scores(
    query_op: torch.Tensor, reference_op: torch.Tensor, m: int, *, rows: torch.Tensor | None = None,
    exclude_self: bool = False, budget: int | None = None, shape: tuple[int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``m`` search scores and reference indices ``[b, m]`` (unordered) of the query ``rows``.

    ``query_op [Nq, D']`` and ``reference_op [Nr, D']`` are the float32 operands (search score =
    their product); ``rows`` (default: every query) selects the queries, on the operands' device;
    ``exclude_self`` leaves out reference ``rows[j]`` for query ``rows[j]``. ``shape`` ``(R, C)``
    fixes the tile (tests); by default :func:`tile_shape` of ``budget`` (:func:`tile_budget`).
    """
    device = query_op.device
    if rows is None:
        rows = torch.arange(query_op.shape[0], device=device)
    n_rows, n_refs = rows.shape[0], reference_op.shape[0]
    m = min(m, n_refs)
    if shape is None:
        shape = tile_shape(n_rows, n_refs, m, tile_budget(device) if budget is None else budget)
    tile_rows, tile_cols = shape
    values = torch.empty(n_rows, m, dtype=torch.float32, device=device)
    indices = torch.empty(n_rows, m, dtype=torch.int64, device=device)
    with ieee_float32_products(device):
        for r0 in range(0, n_rows, tile_rows):
            strip = rows[r0 : r0 + tile_rows]
            q = query_op.index_select(0, strip)
            best_v = best_i = None
            for c0 in range(0, n_refs, tile_cols):
                scores = q @ reference_op[c0 : c0 + tile_cols].T
                if exclude_self:
                    _mask_own(scores, strip, c0)
                v, i = scores.topk(min(m, scores.shape[1]), dim=1, sorted=False)
                i += c0
                if best_v is not None:
                    v, i = torch.cat([best_v, v], 1), torch.cat([best_i, i], 1)
                    v, pos = v.topk(min(m, v.shape[1]), dim=1, sorted=False)
                    i = i.gather(1, pos)
                best_v, best_i = v, i
            values[r0 : r0 + len(strip)], indices[r0 : r0 + len(strip)] = best_v, best_i
    return values, indices
