"""Lifted structure and generalized lifted structure: float64 equations, PML, scale."""

import pytest
import torch
from pytorch_metric_learning import losses as pml_losses

from dmlkit.distances import LpDistance
from dmlkit.losses.pair import GeneralizedLiftedStructureLoss, LiftedStructureLoss


def batch(n=12, d=6, classes=4, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=dtype), torch.randint(0, classes, (n,), generator=g)


def distances(x, r=None):
    xn = x / x.norm(dim=1, keepdim=True)
    rn = xn if r is None else r / r.norm(dim=1, keepdim=True)
    return torch.cdist(xn, rn)


def loop_lifted(x, y, neg_margin, pos_margin):
    """Oh Song et al. Eq. (4): 1/(2|P|) sum over positive pairs of J_ij^2_+."""
    d = distances(x)
    terms = []
    for i in range(len(x)):
        for j in range(len(x)):
            if i == j or y[i] != y[j]:
                continue
            s = sum(torch.exp(neg_margin - d[i, k]) for k in range(len(x)) if y[k] != y[i])
            s = s + sum(torch.exp(neg_margin - d[j, k]) for k in range(len(x)) if y[k] != y[j])
            terms.append(torch.relu(torch.log(s) + d[i, j] - pos_margin) ** 2 / 2)
    return torch.stack(terms).mean()


def loop_generalized(x, y, neg_margin, pos_margin):
    """Hermans et al. p. 4, per anchor, averaged over anchors; an empty half counts 0 (PML's rule)."""
    d = distances(x)
    terms = []
    for i in range(len(x)):
        p = [torch.exp(d[i, k] - pos_margin) for k in range(len(x)) if k != i and y[k] == y[i]]
        n = [torch.exp(neg_margin - d[i, k]) for k in range(len(x)) if y[k] != y[i]]
        pos = torch.log(sum(p)) if p else torch.zeros((), dtype=x.dtype)
        neg = torch.log(sum(n)) if n else torch.zeros((), dtype=x.dtype)
        terms.append(torch.relu(pos + neg))
    return torch.stack(terms).mean()


@pytest.mark.parametrize("cls, loop", [(LiftedStructureLoss, loop_lifted), (GeneralizedLiftedStructureLoss, loop_generalized)])
@pytest.mark.parametrize("margins", [(1.0, 0.0), (0.6, 0.2)])
def test_value_and_gradient_match_equation(cls, loop, margins):
    x, y = batch()
    x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ours = cls(*margins)(x1, y)
    ref = loop(x2, y, *margins)
    ours.backward()
    ref.backward()
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(x1.grad, x2.grad)


@pytest.mark.parametrize("ours_cls, pml_cls", [(LiftedStructureLoss, pml_losses.LiftedStructureLoss), (GeneralizedLiftedStructureLoss, pml_losses.GeneralizedLiftedStructureLoss)])
def test_matches_pml(ours_cls, pml_cls):
    x, _ = batch(40, 16, 8, seed=1, dtype=torch.float32)
    y = torch.arange(40)[torch.randperm(40, generator=torch.Generator().manual_seed(0))] % 8  # every anchor has a positive
    for margins in [(1.0, 0.0), (0.5, 0.1)]:
        torch.testing.assert_close(ours_cls(*margins)(x, y), pml_cls(*margins)(x, y), rtol=1e-5, atol=1e-5)


def test_generalized_matches_pml_with_reference_set():
    x, _ = batch(10, 16, 3, seed=2, dtype=torch.float32)
    r, _ = batch(30, 16, 3, seed=3, dtype=torch.float32)
    y, ry = torch.arange(10) % 3, torch.arange(30) % 3
    torch.testing.assert_close(
        GeneralizedLiftedStructureLoss()(x, y, ref_emb=r, ref_labels=ry),
        pml_losses.GeneralizedLiftedStructureLoss()(x, y, ref_emb=r, ref_labels=ry),
        rtol=1e-5,
        atol=1e-5,
    )


def test_lifted_with_reference_set_pools_the_negatives_of_rows_a_and_p_as_pml():
    """With references, pair (a, p) pools anchor row a's negatives and, as PML does, anchor row
    p's when the batch has a row p (p != a; a pair with p = a counts its row once)."""
    x, y = batch(5, seed=4)
    r, ry = batch(9, seed=5)
    d = distances(x, r)
    terms = []
    for i in range(5):
        for j in range(9):
            if y[i] == ry[j]:
                rows = [i] if j >= 5 or j == i else [i, j]
                s = sum(torch.exp(1.0 - d[a, k]) for a in rows for k in range(9) if ry[k] != y[a])
                terms.append(torch.relu(torch.log(s) + d[i, j]) ** 2 / 2)
    ours = LiftedStructureLoss()(x, y, ref_emb=r, ref_labels=ry)
    torch.testing.assert_close(ours, torch.stack(terms).mean())
    pml = pml_losses.LiftedStructureLoss()(x, y, ref_emb=r, ref_labels=ry)
    torch.testing.assert_close(ours, pml, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("cls", [LiftedStructureLoss, GeneralizedLiftedStructureLoss])
def test_gradcheck_float64(cls):
    x, y = batch(8, 3, 3, seed=6)
    loss = cls(0.8, 0.1, distance=LpDistance(power=2, normalize_embeddings=False))
    assert torch.autograd.gradcheck(lambda e: loss(e, y), (x.requires_grad_(True),))


def test_lifted_at_batch_1024():
    x, y = batch(1024, 32, 128, seed=7, dtype=torch.float32)
    x.requires_grad_(True)
    loss = LiftedStructureLoss()(x, y)
    loss.backward()
    assert torch.isfinite(loss) and loss > 0 and torch.isfinite(x.grad).all()
