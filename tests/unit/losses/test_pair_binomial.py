"""BinomialDevianceLoss against Yi et al. / DRO L_B in float64, weights rule, gradcheck."""

import pytest
import torch

from dmlkit.losses.pair import BinomialDevianceLoss
from dmlkit.mining.selection import PairSelection


def batch(n=12, d=6, classes=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=torch.float64), torch.randint(0, classes, (n,), generator=g)


def loop_reference(x, y, alpha, beta, base, reduction):
    xn = x / x.norm(dim=1, keepdim=True)
    s = xn @ xn.T
    pos, neg = [], []
    for i in range(len(x)):
        for j in range(len(x)):
            if i == j:
                continue
            if y[i] == y[j]:
                pos.append(torch.log(1 + torch.exp(-alpha * (s[i, j] - base))))
            else:
                neg.append(torch.log(1 + torch.exp(beta * (s[i, j] - base))))
    p, n = torch.stack(pos), torch.stack(neg)
    return (p.sum() + n.sum()) if reduction == "sum" else (p.mean() + n.mean())


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_value_and_gradient_match_equation(reduction):
    x, y = batch()
    x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ours = BinomialDevianceLoss(2.0, 50.0, 0.5, reduction=reduction)(x1, y)
    ref = loop_reference(x2, y, 2.0, 50.0, 0.5, reduction)
    ours.backward()
    ref.backward()
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(x1.grad, x2.grad)


def test_weights_rule_and_gradcheck():
    x, y = batch(8, 3, 3, seed=1)
    pos = (y[:, None] == y[None, :]) & ~torch.eye(8, dtype=torch.bool)
    neg = y[:, None] != y[None, :]
    w = torch.rand(8, 8, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    xn = x / x.norm(dim=1, keepdim=True)
    s = xn @ xn.T
    expected = (w * pos * torch.nn.functional.softplus(-2 * (s - 0.5))).sum() + (
        w * neg * torch.nn.functional.softplus(50 * (s - 0.5))
    ).sum()
    loss = BinomialDevianceLoss()
    torch.testing.assert_close(loss(x, y, pairs=PairSelection(pos, neg, w, w)), expected)
    assert torch.autograd.gradcheck(lambda e: loss(e, y, weights=w), (x.requires_grad_(True),))
