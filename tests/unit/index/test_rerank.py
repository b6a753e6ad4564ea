"""Re-ranking against float64 loops transcribed from the papers' definitions."""

import math

import numpy as np
import pytest
import torch

from dmlkit.exceptions import InvalidParameterError
from dmlkit.index.rerank import alpha_query_expansion, database_augmentation, k_reciprocal_distance


def _unit(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _reference_k_reciprocal(everything, n_query, k1, k2, lam):
    """Zhong et al., CVPR 2017, Eqs. 4-12, one item at a time, float64, over M = Q + N items."""
    x = _unit(np.asarray(everything, dtype=np.float64))
    m = len(x)
    d = np.array([[float(np.sum((x[i] - x[j]) ** 2)) for j in range(m)] for i in range(m)])
    order = [sorted(range(m), key=lambda j, i=i: (d[i][j] if j != i else -1.0, j)) for i in range(m)]

    def nn(p, k):  # N(p, k): p and its k nearest
        return set(order[p][: k + 1])

    def r(p, k):  # Eq. (4)
        return {g for g in nn(p, k) if p in nn(g, k)}

    half = max(1, int(round(k1 / 2)))
    v = np.zeros((m, m))
    for p in range(m):
        star = set(r(p, k1))
        for q in r(p, k1):  # Eq. (6)
            rq = r(q, half)
            if len(r(p, k1) & rq) >= 2 / 3 * len(rq):
                star |= rq
        for g in star:  # Eq. (7)
            v[p, g] = math.exp(-d[p][g])
    if k2 > 1:  # Eq. (10)
        v = np.array([np.mean([v[g] for g in order[p][:k2]], axis=0) for p in range(m)])
    rows = m if n_query == 0 else n_query
    out = np.zeros((rows, m))
    for p in range(rows):
        for g in range(m):
            num = sum(min(v[p, j], v[g, j]) for j in range(m))
            den = sum(max(v[p, j], v[g, j]) for j in range(m))
            out[p, g] = (1 - lam) * (1 - num / den) + lam * d[p][g]  # Eqs. (11), (12)
    return out if n_query == 0 else out[:, n_query:]


@pytest.mark.parametrize("k1,k2,lam", [(4, 3, 0.3), (6, 1, 0.0), (3, 2, 1.0)])
def test_k_reciprocal_matches_the_paper_loop_with_separate_queries(k1, k2, lam):
    rng = np.random.default_rng(k1)
    centres = rng.normal(size=(4, 8))
    gallery = np.repeat(centres, 5, axis=0) + 0.4 * rng.normal(size=(20, 8))
    query = centres[:3] + 0.4 * rng.normal(size=(3, 8))
    got = k_reciprocal_distance(torch.tensor(query, dtype=torch.float32), torch.tensor(gallery, dtype=torch.float32),
                                k1, k2, lam)
    ref = _reference_k_reciprocal(np.concatenate([query, gallery]), 3, k1, k2, lam)
    assert got.shape == (3, 20)
    np.testing.assert_allclose(got.numpy(), ref, atol=2e-5)


def test_k_reciprocal_leave_one_out_matches_the_paper_loop():
    rng = np.random.default_rng(5)
    x = np.repeat(rng.normal(size=(3, 6)), 4, axis=0) + 0.5 * rng.normal(size=(12, 6))
    got = k_reciprocal_distance(None, torch.tensor(x, dtype=torch.float32), 4, 3, 0.3)
    np.testing.assert_allclose(got.numpy(), _reference_k_reciprocal(x, 0, 4, 3, 0.3), atol=2e-5)


def test_alpha_query_expansion_and_dba_match_their_definitions():
    rng = np.random.default_rng(1)
    g = _unit(rng.normal(size=(10, 5)))
    q = _unit(rng.normal(size=(3, 5)))
    got = alpha_query_expansion(torch.tensor(q), torch.tensor(g), n=3, alpha=2.0).double().numpy()
    for i in range(3):
        sims = g @ q[i]
        top = np.argsort(-sims, kind="stable")[:3]
        new = q[i] + sum(max(sims[j], 0) ** 2 * g[j] for j in top)
        np.testing.assert_allclose(got[i], new / np.linalg.norm(new), atol=1e-6)
    dba = database_augmentation(torch.tensor(g), n=3, alpha=2.0).double().numpy()
    for i in range(10):
        sims = g @ g[i]
        top = np.argsort(-sims, kind="stable")[:3]
        assert top[0] == i
        new = sum(max(sims[j], 0) ** 2 * g[j] for j in top)
        np.testing.assert_allclose(dba[i], new / np.linalg.norm(new), atol=1e-6)


def test_bad_parameters_are_named():
    x = torch.randn(4, 3)
    with pytest.raises(InvalidParameterError, match="'k1'"):
        k_reciprocal_distance(x, x, k1=0)
    with pytest.raises(InvalidParameterError, match="'lambda_value'"):
        k_reciprocal_distance(x, x, lambda_value=2)
    with pytest.raises(InvalidParameterError, match="'n'"):
        alpha_query_expansion(x, x, n=-1)
