"""ProxyTripletLoss against a float64 loop transcription of Proxy-NCA Eq. (3) with proxies."""

import pytest
import torch

from dmlkit.losses.proxy import ProxyTripletLoss


def reference(x, y, proxies, proxy_labels, margin, average_nonzero):
    xn = torch.nn.functional.normalize(x.double(), dim=1)
    pn = torch.nn.functional.normalize(proxies.double(), dim=1)
    terms = []
    for i in range(len(xn)):
        d = [float(((xn[i] - pn[p]) ** 2).sum()) for p in range(len(pn))]
        d_pos = min(d[p] for p in range(len(pn)) if proxy_labels[p] == y[i])
        terms += [max(0.0, d_pos + margin - d[p]) for p in range(len(pn)) if proxy_labels[p] != y[i]]
    used = [t for t in terms if t > 0] if average_nonzero else terms
    return sum(used) / len(used) if used else 0.0


@pytest.mark.parametrize("K", [1, 3])
@pytest.mark.parametrize("reduction", ["mean_nonzero", "mean"])
def test_matches_reference(K, reduction):
    g = torch.Generator().manual_seed(K)
    x = torch.randn(8, 5, generator=g, dtype=torch.float64)
    y = torch.randint(0, 4, (8,), generator=g)
    loss = ProxyTripletLoss(4, 5, margin=0.5, proxies_per_class=K, reduction=reduction).double()
    ref = reference(x, y, loss.proxies.detach(), loss.proxy_labels.tolist(), 0.5, reduction == "mean_nonzero")
    assert loss(x, y).item() == pytest.approx(ref, rel=1e-10)


def test_zero_when_separated_and_gradients_flow():
    loss = ProxyTripletLoss(2, 2, margin=0.1).double()
    with torch.no_grad():
        loss.proxies.copy_(torch.tensor([[1.0, 0.0], [-1.0, 0.0]]))
    x = torch.tensor([[2.0, 0.1], [-3.0, 0.2]], dtype=torch.float64, requires_grad=True)
    value = loss(x, torch.tensor([0, 1]))
    value.backward()
    assert value.item() == 0.0 and torch.equal(x.grad, torch.zeros_like(x))
    x2 = torch.tensor([[-2.0, 0.1]], dtype=torch.float64, requires_grad=True)
    value = loss(x2, torch.tensor([0]))
    value.backward()
    assert value.item() > 0 and x2.grad.abs().sum() > 0


def test_dynamic_matches_the_triplet_reference():
    """Proxy-NCA Sec. 3.3 / 4.1 with dynamic assignment: one margin term per (x_a, p(y), p(z)), loops in float64.

    Sample triplets (a, y) share a label (y != a); the negatives' proxies p(z) form a set; p(.) is the
    nearest proxy (Eq. (5)); terms [d(x_a, p(y)) + margin - d(x_a, p(z))]_+ averaged over the positive ones.
    """
    import math

    g = torch.Generator().manual_seed(21)
    x = torch.randn(10, 5, generator=g, dtype=torch.float64)
    y = torch.tensor([0, 0, 1, 1, 1, 2, 2, 3, 3, 3])
    loss = ProxyTripletLoss(4, 5, margin=0.3, proxies_per_class=2, assignment="dynamic").double()
    xn = torch.nn.functional.normalize(x, dim=1).tolist()
    pn = torch.nn.functional.normalize(loss.proxies.detach(), dim=1).tolist()
    d = [[sum((a - b) ** 2 for a, b in zip(u, v)) for v in pn] for u in xn]
    proxy_of = [min(range(len(pn)), key=lambda p: d[v][p]) for v in range(len(xn))]
    terms = []
    for a in range(len(xn)):
        pz = {proxy_of[z] for z in range(len(xn)) if y[z] != y[a]}
        for pos in range(len(xn)):
            if pos != a and y[pos] == y[a]:
                terms += [max(0.0, d[a][proxy_of[pos]] + 0.3 - d[a][q]) for q in pz]
    nonzero = [t for t in terms if t > 0]
    assert loss(x, y).item() == pytest.approx(sum(nonzero) / len(nonzero), rel=1e-10)
    assert not math.isclose(loss(x, y).item(), loss(x, y.flip(0)).item())
