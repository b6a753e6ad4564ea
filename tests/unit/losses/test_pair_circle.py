"""CircleLoss: Sun et al. Eq. (4) with Eq. (5)'s weights as a loop, gradients, PML agreement."""

import math

import pytest
import torch
from pytorch_metric_learning import losses as pml_losses

from dmlkit.distances import LpDistance
from dmlkit.exceptions import InvalidParameterError
from dmlkit.losses import LOSSES, CircleLoss


def cos(x, a, k):
    return float(x[a] @ x[k]) / float(x[a].norm() * x[k].norm())


def circle_reference(x, y, m, gamma, weights_from=None):
    """Per anchor: log(1 + sum_n exp(gamma a_n (s_n - m)) sum_p exp(-gamma a_p (s_p - 1 + m))); mean over nonzero.

    ``weights_from``: the embeddings the weights a_p, a_n are computed from (default ``x``).
    """
    w = x if weights_from is None else weights_from
    terms = []
    for a in range(len(x)):
        others = [k for k in range(len(x)) if k != a]
        pos = [(cos(x, a, k), cos(w, a, k)) for k in others if y[k] == y[a]]
        neg = [(cos(x, a, k), cos(w, a, k)) for k in others if y[k] != y[a]]
        if not pos or not neg:
            continue
        sum_n = sum(math.exp(gamma * max(c + m, 0) * (s - m)) for s, c in neg)
        sum_p = sum(math.exp(-gamma * max(1 + m - c, 0) * (s - 1 + m)) for s, c in pos)
        terms.append(math.log(1 + sum_n * sum_p))
    terms = [t for t in terms if t > 0]
    return sum(terms) / len(terms)


@pytest.mark.parametrize("m,gamma", [(0.25, 4.0), (0.4, 8.0)])
def test_equals_the_equation(m, gamma, make_batch):
    x, y = make_batch(0, n=10, d=5, classes=3)
    assert CircleLoss(m=m, gamma=gamma)(x, y).item() == pytest.approx(circle_reference(x, y, m, gamma), rel=1e-10)


def test_gradient_with_the_weights_held_constant(make_batch):
    """Central differences of the equation with a_p, a_n frozen at x (the paper's Sec. 3.2) equal autograd's."""
    x, y = make_batch(1, n=8, d=4, classes=3)
    x.requires_grad_(True)
    CircleLoss(m=0.3, gamma=4)(x, y).backward()
    x0, h = x.detach(), 1e-6
    numeric = torch.zeros_like(x0)
    for i in range(x0.shape[0]):
        for j in range(x0.shape[1]):
            step = torch.zeros_like(x0)
            step[i, j] = h
            up = circle_reference(x0 + step, y, 0.3, 4, weights_from=x0)
            down = circle_reference(x0 - step, y, 0.3, 4, weights_from=x0)
            numeric[i, j] = (up - down) / (2 * h)
    torch.testing.assert_close(x.grad, numeric, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_pml(dtype, make_batch):
    x, y = make_batch(2, n=32, d=8, classes=6, dtype=dtype)
    refs, ry = make_batch(3, n=12, d=8, classes=6, dtype=dtype)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-10)
    for kwargs in ({}, dict(m=0.25, gamma=256)):
        torch.testing.assert_close(CircleLoss(**kwargs)(x, y), pml_losses.CircleLoss(**kwargs)(x, y), **tol)
        torch.testing.assert_close(
            CircleLoss(**kwargs)(x, y, ref_emb=refs, ref_labels=ry),
            pml_losses.CircleLoss(**kwargs)(x, y, ref_emb=refs, ref_labels=ry), **tol,
        )


def test_pml_attributes_and_distance_check():
    loss = LOSSES.create("circle")
    assert (loss.m, loss.gamma, loss.op, loss.on, loss.delta_p, loss.delta_n) == (0.4, 80, 1.4, -0.4, 0.6, 0.4)
    assert loss.reduction == "mean_nonzero"
    with pytest.raises(InvalidParameterError, match="'distance' parameter of CircleLoss must be a similarity"):
        CircleLoss(distance=LpDistance())
    with pytest.raises(InvalidParameterError, match="'gamma' parameter of CircleLoss must be a float > 0"):
        CircleLoss(gamma=0)


def test_terms_handed_to_a_reducer_equal_the_closed_form_path(make_batch):
    """A reducer that needs the terms (a threshold below every term: the mean) takes the autograd path."""
    from dmlkit.losses.reducers import MeanReducer, ThresholdReducer

    x, y = make_batch(5, n=16, d=6, classes=4)
    results = []
    for reducer in (MeanReducer(), ThresholdReducer(low=-1.0)):
        e = x.clone().requires_grad_(True)
        value = CircleLoss(m=0.3, gamma=6, reducer=reducer)(e, y)
        value.backward()
        results.append((value.detach(), e.grad))
    torch.testing.assert_close(results[0], results[1])


@pytest.mark.parametrize("labels", [[0, 0, 1, 1, 2, 3], [0, 1, 2, 3, 4, 5], [0, 0, 0, 0, 0, 0]])
def test_anchors_without_positives_or_negatives_keep_the_gradient_finite(labels):
    """A singleton class (an anchor without positives) gave NaN gradients through the closed form (0 / 0 where a
    float32 clamp at 1e-300 is 0); no anchor with both kinds of pairs gives PML's 0, read nowhere on the host."""
    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(6, 4, generator=g, dtype=torch.float64), torch.tensor(labels)
    for dtype in (torch.float32, torch.float64):
        ours, theirs = x.to(dtype).requires_grad_(True), x.to(dtype).requires_grad_(True)
        a, b = CircleLoss()(ours, y), pml_losses.CircleLoss()(theirs, y)
        a.backward()
        if b.requires_grad:
            b.backward()
        expected = torch.zeros_like(theirs) if theirs.grad is None else theirs.grad
        assert torch.isfinite(ours.grad).all()
        torch.testing.assert_close(a, b.to(a.dtype), rtol=1e-5, atol=0.0)
        torch.testing.assert_close(ours.grad, expected, rtol=1e-4, atol=1e-6)
