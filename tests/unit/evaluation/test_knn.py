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


def test_blocked_search_uses_several_reference_chunks(monkeypatch):
    monkeypatch.setattr(knn_module, "TILE_BYTES", 4 * 16 * 10)  # tiny tiles: many chunks and merges
    g = torch.Generator().manual_seed(2)
    x = torch.randn(64, 5, generator=g)
    _, idx = knn(x, x, 9, exclude_self=True)
    _, want = brute_force(x, x, 9, "euclidean", True)
    np.testing.assert_array_equal(idx.numpy(), want)


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
@pytest.mark.parametrize("normalise", [False, True])
def test_symmetric_leave_one_out_tiles(monkeypatch, metric, normalise):
    # several tiles above the diagonal, with and without a foldable Euclidean bias
    monkeypatch.setattr(knn_module, "SYMMETRIC_TILE", 16)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(100, 6, generator=g) * torch.rand(100, 1, generator=g).add(0.5)
    if normalise:
        x = torch.nn.functional.normalize(x, dim=1)
    vals, idx = knn(x, x, 5, exclude_self=True, metric=metric)
    want_vals, want_idx = brute_force(x, x, 5, metric, True)
    np.testing.assert_array_equal(idx.numpy(), want_idx)
    np.testing.assert_allclose(vals.numpy(), want_vals, rtol=1e-12, atol=1e-12)
    # the same search through the non-symmetric path (a copy is not the same tensor)
    _, idx_copy = knn(x, x.clone(), 5, exclude_self=True, metric=metric)
    assert torch.equal(idx, idx_copy)
