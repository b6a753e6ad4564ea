"""RankedListLoss: Wang et al. Eqs. (5)-(9) (with PML's Tp and guard) as a loop, gradients, PML agreement."""

import math

import pytest
import torch
from pytorch_metric_learning import losses as pml_losses

from dmlkit.distances import CosineSimilarity
from dmlkit.exceptions import InvalidParameterError
from dmlkit.losses import LOSSES, RankedListLoss


def rll_reference(x, y, margin, Tn, imbalance=0.5, alpha=None, Tp=0.0):
    """Per anchor (1 - lambda) L_P + lambda L_N, each a weighted mean of its hinges; mean over anchors."""
    alpha = 1 + margin / 2 if alpha is None else alpha
    u = [x[i] / x[i].norm() for i in range(len(x))]
    total = 0.0
    for a in range(len(x)):
        wp = sp = wn = sn = 0.0
        for k in range(len(x)):
            if k == a:
                continue
            d = float((u[a] - u[k]).norm())
            if y[k] == y[a] and d > alpha - margin:
                w = math.exp(Tp * (d - (alpha - margin)))
                wp, sp = wp + w, sp + w * (d - (alpha - margin))
            if y[k] != y[a] and d < alpha:
                w = math.exp(Tn * (alpha - d))
                wn, sn = wn + w, sn + w * (alpha - d)
        guard = 1e-5 * len(x)  # PML's 1e-5 per reference in each weight sum
        total += (1 - imbalance) * sp / (wp + guard) + imbalance * sn / (wn + guard)
    return total / len(x)


@pytest.mark.parametrize("kwargs", [dict(margin=0.4, Tn=10), dict(margin=0.2, Tn=3, imbalance=0.3, alpha=1.3, Tp=2)])
def test_equals_the_equation(kwargs, make_batch):
    x, y = make_batch(0, n=10, d=5, classes=3)
    assert RankedListLoss(**kwargs)(x, y).item() == pytest.approx(rll_reference(x, y, **kwargs), rel=1e-10)


def test_gradcheck(make_batch):
    x, y = make_batch(1, n=8, d=4, classes=3)
    x.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda e: RankedListLoss(margin=0.4, Tn=2, Tp=1)(e, y), (x,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_pml(dtype, make_batch):
    x, y = make_batch(2, n=32, d=8, classes=6, dtype=dtype)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-12)
    for kwargs in (dict(margin=0.4, Tn=10), dict(margin=0.3, Tn=2, imbalance=0.8, alpha=1.1, Tp=3)):
        torch.testing.assert_close(RankedListLoss(**kwargs)(x, y), pml_losses.RankedListLoss(**kwargs)(x, y), **tol)


def test_parameters():
    loss = LOSSES.create("ranked_list", margin=0.4, Tn=10)
    assert (loss.alpha, loss.imbalance, loss.Tp) == (1.2, 0.5, 0.0)
    with pytest.raises(AssertionError, match="'imbalance' parameter of RankedListLoss must be a float in the range"):
        RankedListLoss(margin=1, Tn=0, imbalance=2)
    with pytest.raises(InvalidParameterError, match="must be a distance"):
        RankedListLoss(margin=1, Tn=0, distance=CosineSimilarity())


def test_terms_handed_to_a_reducer_equal_the_closed_form_path(make_batch):
    """A reducer that needs the terms (a threshold below every term: the mean) takes the autograd path."""
    from dmlkit.losses.reducers import MeanReducer, ThresholdReducer

    x, y = make_batch(5, n=16, d=6, classes=4)
    results = []
    for reducer in (MeanReducer(), ThresholdReducer(low=-1.0)):
        e = x.clone().requires_grad_(True)
        value = RankedListLoss(margin=0.4, Tn=3, Tp=2, reducer=reducer)(e, y)
        value.backward()
        results.append((value.detach(), e.grad))
    torch.testing.assert_close(results[0], results[1])
