"""Proxy-NCA's Eq. (4) as the paper trains it: raw embeddings and proxies, the positive out of the denominator."""

from __future__ import annotations

import math

import pytest
import torch
from pytorch_metric_learning.losses import ProxyNCALoss as PMLProxyNCALoss

from dmlkit.distances import LpDistance
from dmlkit.losses import ProxyNCALoss

RAW = LpDistance(power=2, normalize_embeddings=False)


def eq4_loop(x: torch.Tensor, proxies: torch.Tensor, labels: torch.Tensor, scale: float, exclude_positive: bool) -> float:
    """Proxy-NCA Eq. (4): -log( exp(-d(x, p(y))) / sum_{z in Z} exp(-d(x, p(z))) ), d = s ||x - p||^2, mean over x."""
    total = 0.0
    for i in range(x.shape[0]):
        xi = [float(v) for v in x[i]]
        dist = [scale * sum((a - float(b)) ** 2 for a, b in zip(xi, p)) for p in proxies]
        y = int(labels[i])
        others = [d for j, d in enumerate(dist) if j != y or not exclude_positive]
        total += dist[y] + math.log(sum(math.exp(-d) for d in others))
    return total / x.shape[0]


def raw_loss(num_classes=5, dim=4, **kwargs) -> ProxyNCALoss:
    loss = ProxyNCALoss(num_classes, dim, distance=RAW, **kwargs).double()
    with torch.no_grad():
        loss.proxies.copy_(torch.randn(num_classes, dim, generator=torch.Generator().manual_seed(1), dtype=torch.float64))
    return loss


@pytest.mark.parametrize("exclude_positive", [True, False])
@pytest.mark.parametrize("scale", [1.0, 0.3])
def test_raw_eq4_matches_the_paper_on_unnormalised_vectors(exclude_positive, scale):
    g = torch.Generator().manual_seed(0)
    x = 3.0 * torch.randn(9, 4, generator=g, dtype=torch.float64)  # norms well above 1, as the paper's
    labels = torch.randint(0, 5, (9,), generator=g)
    loss = raw_loss(softmax_scale=scale, exclude_positive=exclude_positive)
    expected = eq4_loop(x, loss.proxies.detach(), labels, scale, exclude_positive)
    assert float(loss(x, labels).detach()) == pytest.approx(expected, rel=1e-10, abs=1e-10)


def test_raw_eq4_gradients_pass_gradcheck():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(6, 4, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([0, 1, 1, 2, 3, 4])
    loss = raw_loss(exclude_positive=True)
    assert torch.autograd.gradcheck(lambda e, p: loss.raw_loss(loss.logits(e, p), loss.bank.candidate_columns(labels)),
                                    (x, loss.proxies.detach().clone().requires_grad_()))


def test_dynamic_assignment_uses_the_raw_distance_too():
    x = torch.tensor([[2.0, 0.0], [2.1, 0.0], [-3.0, 1.0]], dtype=torch.float64)
    labels = torch.tensor([0, 0, 1])
    loss = ProxyNCALoss(2, 2, distance=RAW, assignment="dynamic", exclude_positive=True).double()
    with torch.no_grad():
        loss.proxies.copy_(torch.tensor([[2.0, 0.5], [-3.0, 0.0]], dtype=torch.float64))
    # triplets (0, 1, {2}) and (1, 0, {2}): p(y) = proxy 0, p(Z) = {proxy 1}; Eq. (4) on raw squared distances
    d = lambda a, p: float(((x[a] - loss.proxies[p]) ** 2).sum())  # noqa: E731
    expected = sum(d(a, 0) + math.log(math.exp(-d(a, 1))) for a in (0, 1)) / 2  # -log(e^{-d+} / e^{-d-})
    assert float(loss(x, labels)) == pytest.approx(expected, rel=1e-12)


def test_a_refused_distance_is_named_with_its_settings():
    with pytest.raises(ValueError) as err:
        ProxyNCALoss(3, 2, distance=LpDistance(power=1, normalize_embeddings=True))
    message = str(err.value)
    assert "LpDistance(power=2, normalize_embeddings=True) or LpDistance(power=2, normalize_embeddings=False)" in message
    assert "Got LpDistance(power=1, normalize_embeddings=True)" in message


def test_get_logits_are_pmls_own_squared_distances_in_float32():
    """Near-coincident pairs included: PML's test compares them with rtol=1e-2 and no absolute tolerance."""
    angles = torch.arange(0, 180, dtype=torch.float64) * math.pi / 180
    x = torch.stack([angles.cos(), angles.sin()], 1).float()
    ours, theirs = ProxyNCALoss(10, 2), PMLProxyNCALoss(num_classes=10, embedding_size=2)
    with torch.no_grad():
        theirs.proxies.copy_(ours.proxies)
    assert torch.equal(ours.get_logits(x), theirs.get_logits(x))
    raw = ProxyNCALoss(10, 2, distance=RAW)
    with torch.no_grad():
        raw.proxies.copy_(ours.proxies)
    expected = ((x.double()[:, None] - ours.proxies.double()[None]) ** 2).sum(-1)
    torch.testing.assert_close(raw.get_logits(x).double(), expected, atol=1e-5, rtol=1e-5)
