"""SoftTripleLoss against a float64 loop transcription and PML."""

import math

import pytest
import torch

from dmlkit.exceptions import InvalidParameterError
from dmlkit.losses.proxy import SoftTripleLoss


def reference(x, y, proxies, C, K, la, gamma, margin, tau=0.0):
    xn = torch.nn.functional.normalize(x.double(), dim=1)
    pn = torch.nn.functional.normalize(proxies.double(), dim=1)
    total = 0.0
    for i in range(len(xn)):
        logits = []
        for c in range(C):
            s = [float(xn[i] @ pn[c * K + k]) for k in range(K)]
            z = sum(math.exp(v / gamma) for v in s)
            S = sum(math.exp(v / gamma) / z * v for v in s)
            logits.append(la * (S - (margin if c == y[i] else 0.0)))
        top = max(logits)
        total += -(logits[y[i]] - top - math.log(sum(math.exp(v - top) for v in logits)))
    loss = total / len(xn)
    if tau > 0:
        reg = 0.0
        for c in range(C):
            for a in range(K):
                for b in range(a + 1, K):
                    reg += math.sqrt(2 + 1e-5 - 2 * float(pn[c * K + a] @ pn[c * K + b]))
        loss += tau * reg / (C * K * (K - 1))
    return loss


@pytest.mark.parametrize("K,tau", [(1, 0.0), (4, 0.0), (4, 0.2)])
def test_matches_reference(K, tau):
    g = torch.Generator().manual_seed(K)
    x = torch.randn(9, 5, generator=g, dtype=torch.float64)
    y = torch.randint(0, 6, (9,), generator=g)
    loss = SoftTripleLoss(6, 5, centers_per_class=K, la=20, gamma=0.1, margin=0.01, tau=tau).double()
    ref = reference(x, y, loss.proxies.detach(), 6, K, 20.0, 0.1, 0.01, tau)
    assert loss(x, y).item() == pytest.approx(ref, rel=1e-10)


@pytest.mark.parametrize("gamma,la", [(0.5, 3.0), (1 / 350, 350.0)])
def test_gradcheck(gamma, la):
    """gradcheck of the fused function w.r.t. embeddings and proxies (gamma=1/350, la=350: max-shift paths)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 4, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 3, (5,), generator=g)
    loss = SoftTripleLoss(3, 4, centers_per_class=2, la=la, gamma=gamma, tau=0.1).double()
    assert torch.autograd.gradcheck(lambda e: loss(e, y), (x,))
    q = loss.proxies.detach().clone().requires_grad_(True)
    assert loss.loss_with_proxies(x, y, q).item() == pytest.approx(loss(x, y).item(), rel=1e-12)
    assert torch.autograd.gradcheck(lambda e, p: loss.loss_with_proxies(e, y, p), (x, q))
    ref = reference(x.detach(), y, q.detach(), 3, 2, la, gamma, 0.01, 0.1)
    assert loss(x, y).item() == pytest.approx(ref, rel=1e-10)


@pytest.mark.parametrize("K", [1, 3])
def test_matches_pml(K):
    from pytorch_metric_learning.losses import SoftTripleLoss as PMLSoftTriple

    g = torch.Generator().manual_seed(2)
    x = torch.randn(40, 12, generator=g, requires_grad=True)
    y = torch.randint(0, 10, (40,), generator=g)
    ours = SoftTripleLoss(10, 12, centers_per_class=K)
    theirs = PMLSoftTriple(10, 12, centers_per_class=K)
    theirs.fc.data.copy_(ours.proxies.data.T)  # PML keeps [D, C*K], same class-major column order
    a, b = ours(x, y), theirs(x, y)
    assert a.item() == pytest.approx(b.item(), rel=1e-5)
    ga = torch.autograd.grad(a, (x, ours.proxies))
    gb = torch.autograd.grad(b, (x, theirs.fc))
    torch.testing.assert_close(ga[0], gb[0], rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(ga[1], gb[1].T, rtol=1e-4, atol=1e-6)


def test_layout_and_validation():
    loss = SoftTripleLoss(3, 4, centers_per_class=2)
    assert loss.proxies.shape == (6, 4) and loss.proxy_labels.tolist() == [0, 0, 1, 1, 2, 2]
    with pytest.raises(InvalidParameterError, match="The 'gamma' parameter of SoftTripleLoss must be a float > 0"):
        SoftTripleLoss(3, 4, gamma=0)
