"""SelfSupervisedLoss (PML's wrapper) and VICRegLoss (Bardes et al. Eqs. (1)-(6) as loops)."""

import math

import pytest
import torch
from pytorch_metric_learning import losses as pml_losses

from dmlkit.exceptions import DataError, InvalidParameterError
from dmlkit.losses import LOSSES, ContrastiveLoss, NPairsLoss, NTXentLoss, SelfSupervisedLoss, SupConLoss, VICRegLoss


def views(seed=0, n=10, d=6, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=dtype)
    return x, x + 0.3 * torch.randn(n, d, generator=g, dtype=dtype)


def vicreg_reference(z, zr, lam, mu, nu, eps, variance_average=True):
    """lambda s + mu (v(Z) + v(Z')) [/ 2] + nu (c(Z) + c(Z')), each term a plain loop."""
    n, d = z.shape
    invariance = sum(float((z[i, j] - zr[i, j]) ** 2) for i in range(n) for j in range(d)) / (n * d)

    def variance(v):
        total = 0.0
        for j in range(d):
            mean = sum(float(v[i, j]) for i in range(n)) / n
            var = sum((float(v[i, j]) - mean) ** 2 for i in range(n)) / (n - 1)
            total += max(0.0, 1 - math.sqrt(var + eps))
        return total / d

    def covariance(v):
        means = [sum(float(v[i, j]) for i in range(n)) / n for j in range(d)]
        total = 0.0
        for a in range(d):
            for b in range(d):
                if a != b:
                    c = sum((float(v[i, a]) - means[a]) * (float(v[i, b]) - means[b]) for i in range(n)) / (n - 1)
                    total += c * c
        return total / d

    half = 0.5 if variance_average else 1.0
    return lam * invariance + mu * half * (variance(z) + variance(zr)) + nu * (covariance(z) + covariance(zr))


@pytest.mark.parametrize("variance_average", [True, False])
def test_vicreg_equals_the_equation(variance_average):
    z, zr = views()
    loss = VICRegLoss(10, 5, 2, 1e-4, variance_average=variance_average)(z, ref_emb=zr)
    assert loss.item() == pytest.approx(vicreg_reference(z, zr, 10, 5, 2, 1e-4, variance_average), rel=1e-10)


def test_vicreg_gradcheck():
    z, zr = views(1, n=6, d=4)
    z.requires_grad_(True)
    zr.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a, b: VICRegLoss()(a, ref_emb=b), (z, zr))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_vicreg_matches_pml(dtype):
    z, zr = views(2, n=32, d=16, dtype=dtype)
    for args in ((), (10, 10, 2, 1e-5)):
        torch.testing.assert_close(VICRegLoss(*args)(z, ref_emb=zr), pml_losses.VICRegLoss(*args)(z, ref_emb=zr))


def test_vicreg_refuses_what_it_cannot_use():
    z, zr = views()
    with pytest.raises(InvalidParameterError, match="takes no labels"):
        VICRegLoss()(z, torch.arange(10), ref_emb=zr)
    with pytest.raises(InvalidParameterError, match="needs ref_emb"):
        VICRegLoss()(z)
    with pytest.raises(DataError, match=r"embeddings has shape \(10, 6\) but ref_emb has \(9, 6\)"):
        VICRegLoss()(z, ref_emb=zr[:9])
    with pytest.raises(InvalidParameterError, match="takes no distance"):
        VICRegLoss(distance=object())
    assert "vicreg" not in LOSSES.names() and "VICRegLoss" not in [c.__name__ for c in map(LOSSES.get, LOSSES.names())]


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("loss", [NTXentLoss(0.2), SupConLoss(), ContrastiveLoss(), pml_losses.NTXentLoss(0.2)])
def test_wrapper_equals_the_loss_with_each_row_its_own_class(loss, symmetric):
    z, zr = views(3)
    labels = torch.arange(len(z))
    if symmetric:
        expected = loss(torch.cat([z, zr]), torch.cat([labels, labels]))
    else:
        expected = loss(z, labels, ref_emb=zr, ref_labels=labels.clone())
    torch.testing.assert_close(SelfSupervisedLoss(loss, symmetric=symmetric)(z, zr), expected)


def test_wrapper_ntxent_is_simclr():
    """Symmetric NT-Xent over the 2N views is SimCLR Eq. (1): each view's positive is its other view."""
    z, zr = views(4, n=5)
    both = torch.nn.functional.normalize(torch.cat([z, zr]), dim=1)
    t, n, total = 0.5, 5, 0.0
    for i in range(2 * n):
        j = (i + n) % (2 * n)
        den = sum(math.exp(float(both[i] @ both[k]) / t) for k in range(2 * n) if k != i)
        total += -math.log(math.exp(float(both[i] @ both[j]) / t) / den)
    assert SelfSupervisedLoss(NTXentLoss(t))(z, zr).item() == pytest.approx(total / (2 * n), rel=1e-10)


def test_wrapper_refuses_unsupported_losses_and_mismatched_views():
    assert SelfSupervisedLoss.supported_losses() == pml_losses.SelfSupervisedLoss.supported_losses()
    with pytest.raises(InvalidParameterError, match="The 'loss' parameter of SelfSupervisedLoss"):
        SelfSupervisedLoss(NPairsLoss())
    z, zr = views()
    with pytest.raises(DataError, match="ref_emb must be a view of the same inputs"):
        SelfSupervisedLoss(NTXentLoss())(z, zr[:, :3])
