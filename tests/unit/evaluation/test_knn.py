"""Exact k-NN: both backends against a float64 brute-force ranking with index tie-breaking."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dmlkit.evaluation import knn
from dmlkit.exceptions import DataError, InvalidParameterError

knn_module = importlib.import_module("dmlkit.evaluation.knn")

BACKENDS = ("torch", "faiss")
METRICS = ("euclidean", "cosine", "dot")


def brute_force(query, reference, k, metric, exclude_self):
    """Float64 reference: every pair's key, then sort by (key desc, index asc) with np.lexsort."""
    q, r = query.double().numpy(), reference.double().numpy()
    if metric == "cosine":
        q = q / np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-300)
        r = r / np.maximum(np.linalg.norm(r, axis=1, keepdims=True), 1e-300)
    if metric == "euclidean":
        keys = -np.sum((q[:, None, :] - r[None, :, :]) ** 2, axis=-1)
    else:
        keys = np.sum(q[:, None, :] * r[None, :, :], axis=-1)
    if exclude_self:
        np.fill_diagonal(keys, -np.inf)
    cols = np.arange(len(r))
    indices = np.stack([np.lexsort((cols, -row))[:k] for row in keys])
    top = np.take_along_axis(keys, indices, 1)
    values = np.sqrt(np.maximum(-top, 0.0)) if metric == "euclidean" else top
    return values, indices


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("exclude_self", [True, False])
def test_knn_matches_brute_force(backend, metric, exclude_self):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(120, 6, generator=g)
    ref = x if exclude_self else torch.randn(90, 6, generator=g)
    vals, idx = knn(x, ref, 7, exclude_self=exclude_self, metric=metric, backend=backend)
    want_vals, want_idx = brute_force(x, ref, 7, metric, exclude_self)
    assert idx.dtype == torch.int64 and idx.shape == (120, 7)
    np.testing.assert_array_equal(idx.numpy(), want_idx)
    np.testing.assert_allclose(vals.numpy(), want_vals, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ties_are_broken_by_smaller_index(backend):
    # references 1, 2, 3 are all at distance 1 from query 0; duplicates 4 and 5 coincide.
    x = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [5.0, 5.0], [5.0, 5.0]])
    _, idx = knn(x, x, 3, exclude_self=True, backend=backend)
    assert idx[0].tolist() == [1, 2, 3]
    assert idx[4].tolist()[0] == 5 and idx[5].tolist()[0] == 4


@pytest.mark.parametrize("backend", BACKENDS)
def test_many_duplicates_force_the_certification_fallback(backend):
    # 60 copies of one point: every shortlist ends in a tie, so the search must widen to be exact.
    x = torch.cat([torch.ones(60, 3), torch.zeros(5, 3)])
    vals, idx = knn(x, x, 50, exclude_self=True, backend=backend)
    want_vals, want_idx = brute_force(x, x, 50, "euclidean", True)
    np.testing.assert_array_equal(idx.numpy(), want_idx)
    np.testing.assert_allclose(vals.numpy(), want_vals, atol=0)


def test_retry_search_uses_several_reference_chunks(monkeypatch):
    # duplicates defeat certification, so the retry search runs over many tiny reference chunks
    monkeypatch.setattr(knn_module, "TILE_BYTES", 4 * 16 * 10)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(64, 5, generator=g)
    x[10:30] = x[5]
    _, idx = knn(x, x, 9, exclude_self=True)
    _, want = brute_force(x, x, 9, "euclidean", True)
    np.testing.assert_array_equal(idx.numpy(), want)


def use_tiles(monkeypatch, rows, cols, group, precision="auto", scan="native", sub_rows=3):
    monkeypatch.setattr(knn_module, "NATIVE_SCAN", scan == "native")
    monkeypatch.setattr(knn_module, "NATIVE_SUB_ROWS", sub_rows)
    monkeypatch.setattr(knn_module, "TILE_PRECISION", precision)
    monkeypatch.setattr(knn_module, "TILE_ROWS", rows)
    monkeypatch.setattr(knn_module, "TILE_COLS", cols)
    monkeypatch.setattr(knn_module, "FILTER_GROUP", group)


# (rows, cols, group): ragged last strips and blocks, both branches of the group filter
TINY_TILES = [(4, 8, 4), (3, 16, 8), (8, 8, 2), (5, 10, 5)]


PRECISIONS = ("float32", "bfloat16")  # the shared tiles in fp32, or in bf16 with the wider bound
SCANS = ("native", "torch")  # tiles scanned by the C extension, or by PyTorch operations


def test_the_c_scan_is_built():
    # setup.py builds it at install time; without it the search is correct but slower
    assert knn_module._knn_scan is not None


@pytest.mark.parametrize("tiles", TINY_TILES)
@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("normalise", [False, True])
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("scan", SCANS)
def test_tiled_leave_one_out_exact_with_ties_and_duplicates(monkeypatch, tiles, metric, normalise, precision, scan):
    use_tiles(monkeypatch, *tiles, precision, scan)
    g = torch.Generator().manual_seed(7)
    x = torch.randint(-2, 3, (90, 4), generator=g).float()  # integer grid: many exact ties
    x[40:52] = x[3]  # duplicates across several blocks
    x[70] = x[89]
    if normalise:
        x = torch.nn.functional.normalize(x, dim=1)
    vals, idx = knn(x, x, 6, exclude_self=True, metric=metric)
    want_vals, want_idx = brute_force(x, x, 6, metric, True)
    np.testing.assert_array_equal(idx.numpy(), want_idx)
    np.testing.assert_allclose(vals.numpy(), want_vals, rtol=1e-12, atol=1e-12)
    # the non-symmetric tiled path (a copy is not the same tensor) gives the same answer
    _, idx_copy = knn(x, x.clone(), 6, exclude_self=True, metric=metric)
    assert torch.equal(idx, idx_copy)


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("same_tensor", [True, False])
@pytest.mark.parametrize("scan", SCANS)
def test_tiled_search_same_for_any_number_of_workers(monkeypatch, threads, same_tensor, scan):
    use_tiles(monkeypatch, 4, 8, 4, scan=scan)
    g = torch.Generator().manual_seed(12)
    x = torch.nn.functional.normalize(torch.randn(70, 5, generator=g), dim=1)
    x[20:30] = x[0]  # duplicates seeded in one tile and met again by several workers
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        _, idx = knn(x, x if same_tensor else x.clone(), 8, exclude_self=True)
    finally:
        torch.set_num_threads(before)
    assert torch.get_num_threads() == before
    np.testing.assert_array_equal(idx.numpy(), brute_force(x, x, 8, "euclidean", True)[1])


def test_union_of_running_tops_counts_shared_pairs_once():
    seeded = knn_module._RunningTop(2, 3)
    seeded.start(0, 0, torch.tensor([[5.0, 4.0, 1.0, 0.0], [1.0, 2.0, 3.0, 4.0]]))
    tops = [seeded, seeded.copy()]
    tops[1].merge(torch.tensor([0, 1]), torch.tensor([7, 9]), torch.tensor([4.5, 0.5]))
    values, indices = knn_module._union_tops([t.values for t in tops], [t.indices for t in tops], 3)
    order = values.argsort(1, descending=True)
    assert values.gather(1, order).tolist() == [[5.0, 4.5, 4.0], [4.0, 3.0, 2.0]]
    assert indices.gather(1, order).tolist() == [[0, 7, 1], [3, 2, 1]]


@pytest.mark.parametrize("tiles", TINY_TILES)
@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("scan", SCANS)
def test_tiled_query_to_gallery_exact(monkeypatch, tiles, metric, precision, scan):
    use_tiles(monkeypatch, *tiles, precision, scan)
    g = torch.Generator().manual_seed(8)
    q = torch.randn(37, 5, generator=g) * torch.rand(37, 1, generator=g).add(0.5)
    ref = torch.cat([torch.randn(50, 5, generator=g), q[:9]])  # some queries sit on a reference
    vals, idx = knn(q, ref, 7, metric=metric)
    want_vals, want_idx = brute_force(q, ref, 7, metric, False)
    np.testing.assert_array_equal(idx.numpy(), want_idx)
    np.testing.assert_allclose(vals.numpy(), want_vals, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("columns", [True, False])
@pytest.mark.parametrize(("shape", "group"), [((6, 9), 3), ((8, 12), 4), ((5, 7), 3), ((4, 4), 4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_above_returns_exactly_the_entries_over_the_thresholds(columns, shape, group, dtype):
    g = torch.Generator().manual_seed(9)
    s = torch.randn(*shape, generator=g).round(decimals=1).to(dtype)  # ties with the thresholds
    t_rows = torch.randn(shape[0], generator=g).round(decimals=1).to(dtype)
    t_cols = torch.randn(shape[1], generator=g).round(decimals=1).to(dtype)
    t_rows[0] = t_cols[1] = float("-inf")
    by_row, by_column = knn_module._above(s, t_rows, t_cols if columns else None, group)
    for (i, j, v), want in [(by_row, s > t_rows.unsqueeze(1))] + ([(by_column, s > t_cols)] if columns else []):
        got = torch.zeros_like(want)
        got[i, j] = True
        assert torch.equal(got, want) and len(i) == int(want.sum())  # each entry once
        assert torch.equal(v, s[i, j])
    assert by_column is None or columns


def test_bf16_tile_scores_stay_within_their_bound(monkeypatch):
    monkeypatch.setattr(knn_module, "TILE_PRECISION", "bfloat16")
    g = torch.Generator().manual_seed(4)
    x = torch.nn.functional.normalize(torch.randn(300, 64, generator=g), dim=1)
    prep = knn_module._prepare(x, x, "euclidean", True)
    assert prep.tile_query.dtype == torch.bfloat16 and prep.tile_slack == knn_module.BF16_SHORTLIST_SLACK
    tile = (prep.tile_query @ prep.tile_query.T).double()  # bf16 products, bf16 output
    h = 0.5 * (prep.query64**2).sum(1)
    exact = prep.query64 @ prep.query64.T - h.unsqueeze(1) - h.unsqueeze(0)  # -|q - r|^2 / 2
    error = (tile + prep.shift.unsqueeze(1) - exact).abs()
    allowed = prep.tile_bound.unsqueeze(1) + prep.tile_output_rounding * tile.abs()
    assert bool((error <= allowed).all()) and float(error.max()) > 0
    assert float(prep.tile_bound.max()) < 2.5 * knn_module.BF16_UNIT_ROUNDOFF  # ~1.7u for unit vectors
    # un-normalised Euclidean operands carry bias columns: those tiles stay in float32
    assert knn_module._prepare(3 * x[:, :2].abs() + x[:, 2:4], x[:, :2], "euclidean", False).tile_query.dtype == \
        torch.float32


def test_running_top_merges_batches_like_a_full_topk():
    g = torch.Generator().manual_seed(10)
    scores = torch.randn(12, 40, generator=g).round(decimals=1)
    top = knn_module._RunningTop(12, 5)
    top.start(0, 0, scores[:6, :3])  # rows 0-5 seeded with fewer than m entries, rows 6-11 empty
    (i, j, v), _ = knn_module._above(scores[6:, :3], top.threshold[6:], None, 3)
    top.merge(i + 6, j, v)
    for c0 in range(3, 40, 9):  # later columns arrive as sparse candidates above the thresholds
        block = scores[:, c0 : c0 + 9]
        (i, j, v), _ = knn_module._above(block, top.threshold, None, 1)
        top.merge(i, j + c0, v)
    want = scores.topk(5, dim=1).values
    assert torch.equal(top.values.sort(1, descending=True).values, want)
    assert torch.equal(scores.gather(1, top.indices), top.values)
    assert torch.equal(top.threshold, want[:, -1])


def test_float32_overflow_falls_back_to_exact_search():
    # float32 products overflow to inf / nan; the float64 re-ranking must still be exact
    g = torch.Generator().manual_seed(11)
    x = torch.randn(30, 4, generator=g) * 1e19
    vals, idx = knn(x, x, 3, exclude_self=True)
    want_vals, want_idx = brute_force(x, x, 3, "euclidean", True)
    np.testing.assert_array_equal(idx.numpy(), want_idx)
    np.testing.assert_allclose(vals.numpy(), want_vals, rtol=1e-12)


@settings(max_examples=25, deadline=None)
@given(
    data=st.lists(st.lists(st.integers(-2, 2), min_size=3, max_size=3), min_size=4, max_size=30),
    k=st.integers(1, 3),
    backend=st.sampled_from(BACKENDS),
    metric=st.sampled_from(METRICS),
)
def test_knn_exact_on_tie_heavy_integer_grids(data, k, backend, metric):
    x = torch.tensor(data, dtype=torch.float32)
    _, idx = knn(x, x, k, exclude_self=True, backend=backend, metric=metric)
    _, want = brute_force(x, x, k, metric, True)
    np.testing.assert_array_equal(idx.numpy(), want)


def test_knn_rejects_bad_input():
    x = torch.randn(5, 3)
    with pytest.raises(InvalidParameterError, match="'backend' parameter of knn"):
        knn(x, x, 2, backend="annoy")
    with pytest.raises(InvalidParameterError, match="only 4 references"):
        knn(x, x, 5, exclude_self=True)
    with pytest.raises(DataError, match="query has 3 columns but reference has 2"):
        knn(x, torch.randn(5, 2), 1)
    bad = x.clone()
    bad[1, 1] = float("nan")
    with pytest.raises(DataError, match="NaN or infinite"):
        knn(bad, x, 1)


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("scan", SCANS)
def test_tiles_wider_than_the_c_scans_chunks_exact(monkeypatch, metric, precision, scan):
    # 64 + 64 + 41 columns per block: full 32-entry chunks, a ragged one, seeding from chunk maxima
    use_tiles(monkeypatch, 16, 64, 8, precision, scan, sub_rows=5)
    g = torch.Generator().manual_seed(13)
    x = torch.randint(-3, 4, (169, 6), generator=g).float()  # exact float64 keys: ties are real ties
    if metric == "cosine":  # normalising makes tied cosines differ in the last bit: continuous data instead
        x = torch.randn(169, 6, generator=g)
    x[100:120] = x[7]
    vals, idx = knn(x, x, 4, exclude_self=True, metric=metric)
    want_vals, want_idx = brute_force(x, x, 4, metric, True)
    np.testing.assert_array_equal(idx.numpy(), want_idx)
    np.testing.assert_allclose(vals.numpy(), want_vals, rtol=1e-12, atol=1e-12)


def scan_tile(tile, r0, c0, symmetric, values, indices, floor):
    knn_module._knn_scan.scan_tile(tile.data_ptr(), tile.dtype == torch.bfloat16, *tile.shape, r0, c0, symmetric,
                                   values.data_ptr(), indices.data_ptr(), values.shape[1], floor.data_ptr())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("symmetric", [True, False])
def test_c_scan_keeps_the_top_m_of_everything_offered(dtype, symmetric):
    g = torch.Generator().manual_seed(14)
    n, m = 200, 5
    values, indices = torch.full((n, m), float("-inf")), torch.full((n, m), -1, dtype=torch.int64)
    floor = torch.full((n,), float("-inf"))
    floor[3] = 0.5  # another worker's threshold: nothing at or below it enters query 3
    offered = [[] for _ in range(n)]  # (value, reference) pairs each query was offered, in float64
    for r0, r1, c0, c1 in [(0, 50, 100, 170), (50, 100, 100, 170), (0, 100, 170, 200), (0, 7, 100, 133)]:
        tile = torch.randn(r1 - r0, c1 - c0, generator=g).round(decimals=1).to(dtype)  # many ties
        tile[0, 0] = float("-inf")
        scan_tile(tile, r0, c0, symmetric, values, indices, floor)
        for i in range(r1 - r0):
            for j in range(c1 - c0):
                v = float(tile[i, j])
                offered[r0 + i].append((v, c0 + j))
                if symmetric:
                    offered[c0 + j].append((v, r0 + i))
    for q in range(n):
        allowed = [(v, ref) for v, ref in offered[q] if v > floor[q]]
        want = sorted((v for v, _ in allowed), reverse=True)[:m]
        want += [float("-inf")] * (m - len(want))
        assert sorted(values[q].tolist(), reverse=True) == want, q
        assert float(values[q, 0]) == min(values[q].tolist())  # heap root: the m-th best
        pairs = set(allowed)
        assert all((float(v), int(i)) in pairs for v, i in zip(values[q], indices[q]) if i >= 0)
        assert len(set(indices[q].tolist()) - {-1}) == int((indices[q] >= 0).sum())  # no pair twice


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_c_seed_floor_is_the_value_just_below_the_mth_largest_chunk_maximum(dtype):
    g = torch.Generator().manual_seed(15)
    m, cols = 6, 32 * 9 + 5  # the last 5 entries are no chunk
    tile = torch.randn(40, cols, generator=g).round(decimals=1).to(dtype)
    tile[1] = 0.0  # +0 everywhere: the floor must lie below +0 (-0 compares equal to it)
    tile[2, :] = float("-inf")
    tile[2, :32 * (m - 1)] = 1.0  # only m - 1 finite chunks: no floor
    floor = torch.zeros(50)
    knn_module._knn_scan.seed_floor(tile.data_ptr(), dtype == torch.bfloat16, 40, cols, 10, m, floor.data_ptr())
    if dtype == torch.bfloat16:  # every finite bf16 value, from its bit patterns
        grid = torch.arange(2**16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).double()
        grid = grid[torch.isfinite(grid)].unique()
    for i in range(40):
        maxima = tile[i, : 32 * 9].double().view(9, 32).amax(1)
        kth = float(maxima.sort(descending=True).values[m - 1])
        if kth == float("-inf"):
            assert floor[10 + i] == float("-inf")
            continue
        if dtype == torch.bfloat16:
            want = float(grid[grid < kth].max())
        else:
            want = float(np.nextafter(np.float32(kth), np.float32(-np.inf)))
        assert float(floor[10 + i]) == want and want < kth
        assert int((tile[i].double() > floor[10 + i]).sum()) >= m
