"""MarginLoss (Wu et al.): loop references for the triplet and pair forms, PML, learnable beta."""

import pytest
import torch
from pytorch_metric_learning import losses as pml_losses

from dmlkit.distances import LpDistance
from dmlkit.losses.pair import MarginLoss
from dmlkit.mining.selection import PairSelection, TripletSelection


def batch(n=12, d=6, classes=4, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=dtype), torch.randint(0, classes, (n,), generator=g)


def normalised_distances(x):
    xn = x / x.norm(dim=1, keepdim=True)
    return torch.cdist(xn, xn)


def loop_triplet_form(x, y, margin, beta):
    """PML's reading: every triplet contributes its positive and its negative term."""
    d = normalised_distances(x)
    total, nonzero = 0.0, 0
    for a in range(len(x)):
        for p in range(len(x)):
            if p == a or y[p] != y[a]:
                continue
            for n in range(len(x)):
                if y[n] == y[a]:
                    continue
                b = beta[y[a]] if beta.numel() > 1 else beta[0]
                pos = torch.relu(margin + d[a, p] - b)
                neg = torch.relu(margin + b - d[a, n])
                total = total + pos + neg
                nonzero += int(pos > 0) + int(neg > 0)
    return total / nonzero


def loop_pair_form(x, y, margin, beta, pos_mask, neg_mask):
    """Wu et al.: each selected pair once, divided by the number of active pairs."""
    d = normalised_distances(x)
    total, nonzero = 0.0, 0
    for a in range(len(x)):
        for j in range(len(x)):
            if pos_mask[a, j]:
                t = torch.relu(margin + d[a, j] - beta)
            elif neg_mask[a, j]:
                t = torch.relu(margin + beta - d[a, j])
            else:
                continue
            total = total + t
            nonzero += int(t > 0)
    return total / nonzero


def test_triplet_form_value_and_gradient_match_loop():
    x, y = batch()
    x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ours = MarginLoss(0.2, beta=0.9)(x1, y)
    ref = loop_triplet_form(x2, y, 0.2, torch.tensor([0.9], dtype=torch.float64))
    ours.backward()
    ref.backward()
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(x1.grad, x2.grad)


def test_pair_form_uses_each_pair_once():
    x, y = batch(seed=1)
    pos = (y[:, None] == y[None, :]) & ~torch.eye(len(y), dtype=torch.bool)
    neg = (y[:, None] != y[None, :]) & (torch.rand(len(y), len(y), generator=torch.Generator().manual_seed(0)) < 0.5)
    ours = MarginLoss(0.2, beta=1.0, form="pair")(x, y, pairs=PairSelection(pos, neg))
    torch.testing.assert_close(ours, loop_pair_form(x, y, 0.2, 1.0, pos, neg))
    torch.testing.assert_close(MarginLoss(0.2, beta=1.0, form="pair")(x, y), loop_pair_form(x, y, 0.2, 1.0, pos, (y[:, None] != y[None, :])))


def test_dro_weights_give_unnormalised_weighted_sum():
    x, y = batch(seed=2)
    pos = (y[:, None] == y[None, :]) & ~torch.eye(len(y), dtype=torch.bool)
    neg = y[:, None] != y[None, :]
    w = torch.rand(len(y), len(y), generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    d = normalised_distances(x)
    expected = (w * pos * torch.relu(0.2 + d - 1.2)).sum() + (w * neg * torch.relu(0.2 + 1.2 - d)).sum()
    torch.testing.assert_close(MarginLoss()(x, y, pairs=PairSelection(pos, neg, w, w)), expected)


@pytest.mark.parametrize(
    "kwargs",
    [dict(), dict(margin=0.1, beta=0.8), dict(learn_beta=True, nu=0.1), dict(learn_beta=True, nu=0.05, num_classes=6)],
)
def test_matches_pml_value_and_beta_gradient(kwargs):
    x, y = batch(40, 16, 6, seed=3, dtype=torch.float32)
    ours, pml = MarginLoss(**kwargs), pml_losses.MarginLoss(**kwargs)
    a, b = ours(x, y), pml(x, y)
    torch.testing.assert_close(a.reshape(()), b.reshape(()), rtol=1e-5, atol=1e-5)
    if kwargs.get("learn_beta"):
        a.sum().backward()
        b.sum().backward()
        torch.testing.assert_close(ours.beta.grad, pml.beta.grad, rtol=1e-4, atol=1e-5)


def test_explicit_triplets_match_pml():
    x, y = batch(20, 8, 4, seed=4, dtype=torch.float32)
    a = torch.tensor([0, 1, 2, 3])
    same = [(i, j) for i in range(20) for j in range(20) if i != j and y[i] == y[j]]
    diff = [(i, j) for i in range(20) for j in range(20) if y[i] != y[j]]
    a = torch.tensor([s[0] for s in same[:4]])
    p = torch.tensor([s[1] for s in same[:4]])
    n = torch.tensor([next(j for (i, j) in diff if i == int(k)) for k in a])
    ours = MarginLoss(learn_beta=True, nu=0.1)(x, y, pairs=TripletSelection(a, p, n))
    pml = pml_losses.MarginLoss(learn_beta=True, nu=0.1)(x, y, indices_tuple=(a, p, n))
    torch.testing.assert_close(ours.reshape(()), pml.reshape(()), rtol=1e-5, atol=1e-5)


def test_gradcheck_float64_with_learnable_class_beta():
    x, y = batch(8, 3, 3, seed=5)
    loss = MarginLoss(0.3, nu=0.1, beta=0.7, learn_beta=True, num_classes=3, distance=LpDistance(power=1, normalize_embeddings=False)).double()
    assert torch.autograd.gradcheck(lambda e, b: (loss.beta.data.copy_(b), loss(e, y))[1], (x.requires_grad_(True), loss.beta.detach().clone()))
    assert torch.autograd.gradcheck(lambda e: loss(e, y), (x.requires_grad_(True),))


def test_class_beta_needs_class_labels():
    x = torch.randn(4, 3)
    with pytest.raises(ValueError, match="num_classes needs class-id labels"):
        MarginLoss(num_classes=3)(x, pos_mask=torch.eye(4, dtype=torch.bool))
