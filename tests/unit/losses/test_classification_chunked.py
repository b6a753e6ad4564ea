"""The chunked margin-softmax (online log-sum-exp, recomputing backward) against its dense autograd twin,
and partial-FC sampling of the classes."""

import copy
import math

import pytest
import torch

from dmlkit.losses import ArcFaceLoss, CosFaceLoss, NormalizedSoftmaxLoss, SubCenterArcFaceLoss
from dmlkit.losses.proxy._margin_softmax import TargetMargin, chunked_margin_softmax, dense_margin_softmax

C, D, B = 7, 5, 9

MAKERS = {
    "arcface": lambda **kw: ArcFaceLoss(C, D, margin=40, scale=8, **kw),
    "subcenter": lambda **kw: SubCenterArcFaceLoss(C, D, margin=20, scale=8, sub_centers=3, **kw),
    "cosface": lambda **kw: CosFaceLoss(C, D, margin=0.3, scale=16, **kw),
    "normalized_softmax": lambda **kw: NormalizedSoftmaxLoss(C, D, temperature=0.1, **kw),
}


def batch(seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, D, generator=g, dtype=dtype, requires_grad=True), torch.randint(0, C, (B,), generator=g)


def value_and_grads(loss, x, y, chunked):
    terms = loss.per_sample_loss(x, y, chunked=chunked)
    grads = torch.autograd.grad(terms.mean(), (x, loss.W))
    return terms.detach(), grads


@pytest.mark.parametrize("name", list(MAKERS))
@pytest.mark.parametrize("chunk_size", [1, 3, 100])
def test_chunked_equals_dense(name, chunk_size):
    loss = MAKERS[name](chunk_size=chunk_size).double()
    x, y = batch(1)
    terms, grads = value_and_grads(loss, x, y, chunked=True)
    dense_terms, dense_grads = value_and_grads(loss, x, y, chunked=False)
    torch.testing.assert_close(terms, dense_terms, rtol=1e-12, atol=1e-12)
    for a, b in zip(grads, dense_grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_float32_chunked_equals_dense():
    loss = MAKERS["subcenter"](chunk_size=2)
    x, y = batch(2, torch.float32)
    terms, grads = value_and_grads(loss, x, y, chunked=True)
    dense_terms, dense_grads = value_and_grads(loss, x, y, chunked=False)
    torch.testing.assert_close(terms, dense_terms, rtol=1e-5, atol=1e-5)
    for a, b in zip(grads, dense_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("margin,k,columns", [
    (TargetMargin("additive_angular", 0.5), 1, None),
    (TargetMargin("additive_angular", 0.9, monotonic=True), 2, torch.tensor([0, 2, 3, 5, 6])),
    (TargetMargin("additive_cosine", 0.35), 1, torch.tensor([1, 2, 3, 4, 6])),
])
def test_gradcheck_of_the_chunked_function(margin, k, columns):
    g = torch.Generator().manual_seed(3)
    xn = torch.nn.functional.normalize(torch.randn(6, 4, generator=g, dtype=torch.float64), dim=1).requires_grad_(True)
    w = torch.randn(4, C * k, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.tensor([0, 2, 3, 3, 6, 2]) if columns is None or 0 in columns.tolist() else torch.tensor([1, 2, 3, 3, 6, 2])

    def f(a, b):
        return chunked_margin_softmax(a, b, y, margin, 3.0, k, 2, columns)

    assert torch.autograd.gradcheck(f, (xn, w))
    torch.testing.assert_close(f(xn, w), dense_margin_softmax(xn, w, y, margin, 3.0, k, columns), rtol=1e-12, atol=0)


def test_weight_gradient_keeps_pml_layout():
    """The gradient of ``W [D, C*K]`` is written in place of its transposed view: contiguous, no copy."""
    loss = MAKERS["subcenter"](chunk_size=2)
    x, y = batch(4, torch.float32)
    loss(x, y).backward()
    assert loss.W.grad.shape == (D, 3 * C) and loss.W.grad.is_contiguous()


# ----------------------------------------------------------------------------- partial FC
@pytest.mark.parametrize("name", list(MAKERS))
def test_partial_fc_with_every_class_sampled_is_the_full_loss(name):
    full = MAKERS[name](chunk_size=2).double()
    sampled = MAKERS[name](chunk_size=2, sample_rate=0.99).double()  # ceil(0.99 * 7) = 7: all, through the sampled path
    x, y = batch(5)
    assert sampled.sample_classes(y).tolist() == list(range(C))
    a, b = full(x, y), sampled(x, y)
    torch.testing.assert_close(a, b, rtol=1e-12, atol=0)
    ga, gb = torch.autograd.grad(a, (x, full.W)), torch.autograd.grad(b, (x, sampled.W))
    for u, v in zip(ga, gb):
        torch.testing.assert_close(u, v, rtol=1e-12, atol=1e-14)


def test_partial_fc_samples_the_batch_classes_and_others():
    loss = ArcFaceLoss(1000, D, sample_rate=0.05, chunk_size=16, seed=3).double()
    x, y = batch(6)
    state = copy.deepcopy(loss.state_dict())
    columns = loss.sample_classes(y)
    assert columns.numel() == math.ceil(0.05 * 1000) and bool((columns[1:] > columns[:-1]).all())
    assert set(y.tolist()) <= set(columns.tolist())
    loss.load_state_dict(state)  # the sampler's generator is part of the state: the same draw again
    assert loss.sample_classes(y).tolist() == columns.tolist()
    assert loss.sample_classes(y).tolist() != columns.tolist()  # and the next draw differs
    loss.load_state_dict(state)
    value = loss(x, y)
    value.backward()
    touched = loss.W.grad.abs().sum(dim=0) > 0
    assert touched.nonzero()[:, 0].tolist() == columns.tolist()
    loss.load_state_dict(state)
    dense = loss.per_sample_loss(x.detach(), y, chunked=False).mean()  # same draw, every logit at once
    torch.testing.assert_close(value.detach(), dense, rtol=1e-12, atol=0)


def test_tied_sub_centres_share_the_gradient_as_the_dense_twin():
    """Identical sub-centres (init from a class with fewer samples than K) split the gradient evenly."""
    loss = MAKERS["subcenter"](chunk_size=2).double()
    with torch.no_grad():
        loss.W[:, 1::3] = loss.W[:, 0::3]  # sub-centre 1 = sub-centre 0 in every class
    x, y = batch(7)
    (_, grads), (_, dense) = value_and_grads(loss, x, y, True), value_and_grads(loss, x, y, False)
    for a, b in zip(grads, dense):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grads[1][:, 0::3], grads[1][:, 1::3])
