"""Regularizers: each against a plain loop of its equation, a float64 gradcheck, PML on the same
weights, and as a proxy loss's weight regularizer."""

from __future__ import annotations

import math

import pytest
import torch
from pytorch_metric_learning import regularizers as pml_regularizers

from dmlkit.distances import CosineSimilarity, LpDistance
from dmlkit.exceptions import InvalidParameterError
from dmlkit.losses import ContrastiveLoss, ProxyAnchorLoss
from dmlkit.losses.reducers import SumReducer
from dmlkit.losses.regularizers import (
    CenterInvariantRegularizer,
    LpRegularizer,
    RegularFaceRegularizer,
    SparseCentersRegularizer,
    ZeroMeanRegularizer,
)


def _weights(n=6, d=5, seed=0):
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _rows(w):
    return [[float(t) for t in row] for row in w]


def center_invariant_loop(w):
    """Wu et al. (2017) Eq. (3): mean_i (|w_i|^2 - mean_j |w_j|^2)^2 / 4."""
    sq = [sum(t * t for t in row) for row in _rows(w)]
    mean = sum(sq) / len(sq)
    return sum((s - mean) ** 2 / 4 for s in sq) / len(sq)


def _cos(u, v):
    return sum(a * b for a, b in zip(u, v)) / math.sqrt(sum(a * a for a in u) * sum(b * b for b in v))


def regular_face_loop(w):
    """RegularFace Eq. (4): mean_i max_{j != i} cos(w_i, w_j)."""
    rows = _rows(w)
    return sum(max(_cos(rows[i], rows[j]) for j in range(len(rows)) if j != i) for i in range(len(rows))) / len(rows)


def sparse_centers_loop(w, num_classes, k):
    """SoftTriple's R(w): sum over each class's centre pairs of sqrt(2 - 2 cos), over 2 * (number of pairs)."""
    rows = _rows(w)
    terms = [math.sqrt(2 - 2 * _cos(rows[c * k + a], rows[c * k + b]))
             for c in range(num_classes) for a in range(k) for b in range(a + 1, k)]
    return sum(terms) / (2 * len(terms))


def zero_mean_loop(w):
    return sum(abs(sum(row)) for row in _rows(w)) / len(w)


def lp_loop(w, p, power):
    return sum(sum(abs(t) ** p for t in row) ** (power / p) for row in _rows(w)) / len(w)


CASES = [
    (lambda: CenterInvariantRegularizer(), center_invariant_loop, lambda: pml_regularizers.CenterInvariantRegularizer()),
    (lambda: RegularFaceRegularizer(), regular_face_loop, lambda: pml_regularizers.RegularFaceRegularizer()),
    (lambda: SparseCentersRegularizer(3, 2), lambda w: sparse_centers_loop(w, 3, 2),
     lambda: pml_regularizers.SparseCentersRegularizer(3, 2)),
    (lambda: ZeroMeanRegularizer(), zero_mean_loop, lambda: pml_regularizers.ZeroMeanRegularizer()),
    (lambda: LpRegularizer(p=3, power=2), lambda w: lp_loop(w, 3, 2), lambda: pml_regularizers.LpRegularizer(p=3, power=2)),
]


@pytest.mark.parametrize("make, loop, make_pml", CASES)
def test_regularizer_matches_loop_pml_and_gradcheck(make, loop, make_pml):
    w = _weights()
    reg = make()
    assert reg(w).item() == pytest.approx(loop(w), rel=1e-10)
    torch.testing.assert_close(reg(w), make_pml()(w))
    assert torch.autograd.gradcheck(reg, (w.clone().requires_grad_(),))


def test_regularizers_take_pml_constructor_arguments():
    w = _weights(seed=1)
    summed = ZeroMeanRegularizer(reducer=SumReducer())(w)
    assert summed.item() == pytest.approx(zero_mean_loop(w) * len(w), rel=1e-10)
    with pytest.raises(InvalidParameterError, match="'distance' parameter of CenterInvariantRegularizer"):
        CenterInvariantRegularizer(distance=LpDistance())
    with pytest.raises(InvalidParameterError, match="'distance' parameter of RegularFaceRegularizer"):
        RegularFaceRegularizer(distance=LpDistance())
    with pytest.raises(InvalidParameterError, match="'centers_per_class' parameter of SparseCentersRegularizer"):
        SparseCentersRegularizer(3, 1)
    stats = SparseCentersRegularizer(3, 2, collect_stats=True)
    stats(w)
    cos = CosineSimilarity()(w)
    assert stats.same_class_center_sim == pytest.approx(float((cos[0, 1] + cos[2, 3] + cos[4, 5]) / 3))


def test_weight_regularizer_sees_the_proxies_of_a_proxy_loss():
    x = torch.randn(8, 5, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    y = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    plain = ProxyAnchorLoss(4, 5).double()
    reg = ProxyAnchorLoss(4, 5, weight_regularizer=RegularFaceRegularizer(), weight_reg_weight=0.3).double()
    reg.load_state_dict(plain.state_dict())
    expected = plain(x, y) + 0.3 * regular_face_loop(plain.regularized_weights().detach())
    torch.testing.assert_close(reg(x, y), expected)
    reg(x, y).backward()
    plain(x, y).backward()
    proxies = plain.regularized_weights().detach().clone().requires_grad_()
    (0.3 * RegularFaceRegularizer()(proxies)).backward()
    torch.testing.assert_close(reg.bank.proxies.grad, plain.bank.proxies.grad + proxies.grad.reshape(plain.bank.proxies.shape))


def test_embedding_regularizer_on_a_pair_loss():
    x = torch.randn(8, 5, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    y = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    with_reg = ContrastiveLoss(embedding_regularizer=ZeroMeanRegularizer(), embedding_reg_weight=0.5)(x, y)
    torch.testing.assert_close(with_reg, ContrastiveLoss()(x, y) + 0.5 * zero_mean_loop(x))
