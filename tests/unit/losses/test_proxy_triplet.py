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
