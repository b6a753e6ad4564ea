"""MultiSimilarityLoss against DRO Eq. (2) in float64, PML, and gradcheck."""

import math

import pytest
import torch
from pytorch_metric_learning import losses as pml_losses
from pytorch_metric_learning.distances import LpDistance as PmlLp

from dmlkit.distances import LpDistance
from dmlkit.losses.pair import MultiSimilarityLoss


def batch(n=14, d=6, classes=4, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=dtype), torch.randint(0, classes, (n,), generator=g)


def loop_reference(x, y, alpha, beta, base):
    """DRO paper Eq. (2) term by term (cosine similarity of raw embeddings)."""
    xn = x / x.norm(dim=1, keepdim=True)
    s = xn @ xn.T
    per_anchor = []
    for i in range(len(x)):
        pos = sum((torch.exp(-alpha * (s[i, k] - base)) for k in range(len(x)) if k != i and y[k] == y[i]), torch.zeros((), dtype=x.dtype))
        neg = sum((torch.exp(beta * (s[i, k] - base)) for k in range(len(x)) if y[k] != y[i]), torch.zeros((), dtype=x.dtype))
        per_anchor.append(torch.log(1 + pos) / alpha + torch.log(1 + neg) / beta)
    return torch.stack(per_anchor).mean()


@pytest.mark.parametrize("params", [(2.0, 50.0, 0.5), (1.0, 10.0, 0.2)])
def test_value_and_gradient_match_equation(params):
    x, y = batch()
    x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ours = MultiSimilarityLoss(*params)(x1, y)
    ref = loop_reference(x2, y, *params)
    ours.backward()
    ref.backward()
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(x1.grad, x2.grad)


def test_matches_pml_default_and_with_distance():
    x, y = batch(48, 16, 8, seed=1, dtype=torch.float32)
    torch.testing.assert_close(MultiSimilarityLoss()(x, y), pml_losses.MultiSimilarityLoss()(x, y), rtol=1e-5, atol=1e-5)
    ours = MultiSimilarityLoss(2, 10, 0.8, distance=LpDistance(power=1, normalize_embeddings=True))(x, y)
    pml = pml_losses.MultiSimilarityLoss(2, 10, 0.8, distance=PmlLp())(x, y)
    torch.testing.assert_close(ours, pml, rtol=1e-5, atol=1e-5)


def test_matches_pml_with_reference_set():
    x, y = batch(16, 16, 4, seed=2, dtype=torch.float32)
    r, ry = batch(64, 16, 4, seed=3, dtype=torch.float32)
    torch.testing.assert_close(
        MultiSimilarityLoss()(x, y, ref_emb=r, ref_labels=ry),
        pml_losses.MultiSimilarityLoss()(x, y, ref_emb=r, ref_labels=ry),
        rtol=1e-5,
        atol=1e-5,
    )


def test_gradcheck_float64():
    x, y = batch(8, 4, 3, seed=4)
    loss = MultiSimilarityLoss(2.0, 8.0, 0.3)
    assert torch.autograd.gradcheck(lambda e: loss(e, y), (x.requires_grad_(True),))


def test_large_beta_does_not_overflow():
    x = torch.tensor([[1.0, 0.0], [1.0, 1e-3], [1.0, 2e-3]], dtype=torch.float32, requires_grad=True)
    y = torch.tensor([0, 1, 2])
    loss = MultiSimilarityLoss(2, 5000, 0.0)(x, y)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(x.grad).all()
    # Every pair is a negative at s ~ 1: (1/beta) log(1 + 2 e^{beta}) ~ 1.
    assert math.isclose(loss.item(), 1.0, rel_tol=1e-3)
