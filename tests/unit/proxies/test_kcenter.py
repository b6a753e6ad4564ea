"""Greedy k-center (ASAP Alg. 2) against a brute-force per-class loop; covering radius."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dmlkit.exceptions import DataError, InvalidParameterError
from dmlkit.proxies import (
    ProxyBank,
    average_covering_radius,
    covering_radius,
    gather_centers,
    greedy_k_center,
    refresh_proxies_k_center,
)


def brute_force(pool, k, existing=None, mask=None):
    """Alg. 2 literally, one class at a time, Euclidean distances, first maximum on ties."""
    C, b, _ = pool.shape
    out = []
    for c in range(C):
        valid = [i for i in range(b) if mask is None or mask[c, i]]
        centers = [] if existing is None else [existing[c, j] for j in range(existing.shape[1])]
        picks = []
        for _ in range(k):
            remaining = [i for i in valid if i not in picks] or valid

            def score(i):
                return min((float(torch.dist(pool[c, i], v)) for v in centers), default=math.inf)

            best = max(remaining, key=lambda i: (score(i), -i))
            picks.append(best)
            centers.append(pool[c, best])
        out.append(picks)
    return torch.tensor(out)


@settings(max_examples=25, deadline=None)
@given(
    C=st.integers(1, 4), b=st.integers(1, 6), k=st.integers(1, 4), K0=st.integers(0, 3),
    D=st.integers(1, 4), seed=st.integers(0, 10_000), masked=st.booleans(),
)
def test_matches_brute_force(C, b, k, K0, D, seed, masked):
    g = torch.Generator().manual_seed(seed)
    pool = torch.randn(C, b, D, generator=g, dtype=torch.float64)
    existing = torch.randn(C, K0, D, generator=g, dtype=torch.float64) if K0 else None
    mask = None
    if masked:
        mask = torch.rand(C, b, generator=g) < 0.7
        mask[:, 0] = True
    k = min(k, b) if not masked else min(k, int(mask.sum(1).min()))
    got = greedy_k_center(pool, k, existing, pool_mask=mask)
    assert torch.equal(got, brute_force(pool, k, existing, mask))


def test_picks_farthest_points_and_radii_decrease():
    pool = torch.tensor([[[0.0, 0.0], [10.0, 0.0], [1.0, 0.0], [5.0, 5.0]]], dtype=torch.float64)
    picks, radii = greedy_k_center(pool, 3, existing_centers=torch.zeros(1, 1, 2, dtype=torch.float64), return_radii=True)
    assert picks.tolist() == [[1, 3, 2]]
    assert radii[0].tolist() == pytest.approx([math.sqrt(50.0), 1.0, 0.0])
    assert torch.all(radii[:, 1:] <= radii[:, :-1])


def test_padding_is_never_picked_and_empty_classes_get_minus_one():
    pool = torch.randn(2, 3, 2)
    mask = torch.tensor([[True, False, True], [False, False, False]])
    picks = greedy_k_center(pool, 3, pool_mask=mask)
    assert set(picks[0].tolist()) <= {0, 2} and picks[1].tolist() == [-1, -1, -1]
    fallback = torch.full((2, 3, 2), 7.0)
    centers = gather_centers(pool, picks, fallback)
    assert torch.equal(centers[1], fallback[1]) and torch.equal(centers[0, 0], pool[0, picks[0, 0]])


def test_covering_radius_matches_brute_force():
    g = torch.Generator().manual_seed(3)
    pts, ctr = torch.randn(3, 5, 4, generator=g, dtype=torch.float64), torch.randn(3, 2, 4, generator=g, dtype=torch.float64)
    pmask = torch.tensor([[True] * 5, [True, False, True, False, True], [False] * 5])
    got = covering_radius(pts, ctr, points_mask=pmask)
    for c in range(3):
        valid = [i for i in range(5) if pmask[c, i]]
        ref = max((min(float(torch.dist(pts[c, i], ctr[c, j])) for j in range(2)) for i in valid), default=0.0)
        assert got[c].item() == pytest.approx(ref, rel=1e-9, abs=1e-12)
    assert covering_radius(pts[0], ctr[0]).item() == pytest.approx(got[0].item())
    cmask = torch.tensor([[True, False], [False, False], [True, True]])
    assert math.isinf(covering_radius(pts, ctr, centers_mask=cmask)[1].item())


def test_average_covering_radius_over_k():
    pool = torch.tensor([[[0.0], [4.0], [1.0]], [[0.0], [2.0], [0.0]]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    got = average_covering_radius(pool, mask)
    # class 0: picks 0 (r=4), then 1 (r=1), then 2 (r=0) -> mean 5/3; class 1: picks 0 (r=2), 1 (r=0) -> 1
    assert got.tolist() == pytest.approx([5 / 3, 1.0])


def test_refresh_proxies_uses_existing_proxies_as_centres():
    bank = ProxyBank(2, 2, proxies_per_class=1)
    with torch.no_grad():
        bank.proxies.copy_(torch.tensor([[0.0, 0.0], [0.0, 0.0]]))
    pool = torch.tensor([[[1.0, 0.0], [3.0, 0.0]], [[0.0, -2.0], [0.0, 1.0]]])
    picks = refresh_proxies_k_center(bank, pool, pool_mask=torch.tensor([[True, True], [False, False]]))
    assert picks.tolist() == [[1], [-1]]
    assert bank.proxies.tolist() == [[3.0, 0.0], [0.0, 0.0]]


def test_validation():
    with pytest.raises(InvalidParameterError, match="The 'k' parameter of greedy_k_center must be an int >= 1"):
        greedy_k_center(torch.randn(2, 3, 4), 0)
    with pytest.raises(DataError, match="pool_embeddings must be 3-D"):
        greedy_k_center(torch.randn(3, 4), 1)
    with pytest.raises(DataError, match="existing_centers has shape"):
        greedy_k_center(torch.randn(2, 3, 4), 1, existing_centers=torch.randn(3, 1, 4))
