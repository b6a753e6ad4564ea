"""PNPLoss: Li et al. Eqs. (5)-(9) for each variant as loops, gradients, PML agreement."""

import math

import pytest
import torch
from pytorch_metric_learning import losses as pml_losses

from dmlkit.exceptions import InvalidParameterError
from dmlkit.losses import LOSSES, PNPLoss

VARIANTS = ["O", "Ds", "Dq", "Iu", "Ib"]


def pnp_reference(x, y, b, alpha, anneal, variant, query_in_ranking):
    """Mean over queries of 1/|P| sum_j f(R(q, j)), R the sigmoid count of negatives before positive j."""
    u = [x[i] / x[i].norm() for i in range(len(x))]

    def sig(v):
        v = max(-50.0, min(50.0, v / anneal))
        return 1 / (1 + math.exp(-v))

    def f(r):
        return {
            "O": r, "Ds": math.log(1 + r), "Dq": (1 + r) ** -alpha,
            "Iu": (1 + r) * math.log(1 + r), "Ib": (b * r - math.log(1 + b * r)) / b**2,
        }[variant]

    values = []
    for q in range(len(x)):
        others = [k for k in range(len(x)) if k != q and y[k] == y[q]]
        if not others:
            continue
        positives = others + [q] if query_in_ranking else others
        negatives = [k for k in range(len(x)) if y[k] != y[q]]
        s = [float(u[q] @ u[k]) for k in range(len(x))]
        values.append(sum(f(sum(sig(s[k] - s[j]) for k in negatives)) for j in positives) / len(positives))
    mean = sum(values) / len(values)
    return 1 - mean if variant == "Dq" else mean


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("query_in_ranking", [True, False])
def test_equals_the_equation(variant, query_in_ranking, make_batch):
    x, y = make_batch(0, n=12, d=5, classes=4)
    loss = PNPLoss(3, 2, 0.05, variant, query_in_ranking=query_in_ranking)(x, y)
    assert loss.item() == pytest.approx(pnp_reference(x, y, 3, 2, 0.05, variant, query_in_ranking), rel=1e-10)


@pytest.mark.parametrize("variant", VARIANTS)
def test_gradcheck(variant, make_batch):
    x, y = make_batch(1, n=8, d=4, classes=3)
    x.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda e: PNPLoss(2, 1, 0.2, variant)(e, y), (x,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_pml(dtype, make_batch):
    x, y = make_batch(2, n=32, d=8, classes=6, dtype=dtype)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-12)
    for variant in VARIANTS:
        for anneal in (0.01, 0.1):
            torch.testing.assert_close(
                PNPLoss(2, 1, anneal, variant)(x, y), pml_losses.PNPLoss(2, 1, anneal, variant)(x, y), **tol
            )


def test_parameters_and_empty_batches():
    assert LOSSES.get("pnp") is PNPLoss
    loss = PNPLoss()
    assert (loss.b, loss.alpha, loss.anneal, loss.variant, loss.query_in_ranking) == (2, 1, 0.01, "O", True)
    with pytest.raises(ValueError, match="The 'variant' parameter of PNPLoss must be one of"):
        PNPLoss(variant="PNP")
    with pytest.raises(InvalidParameterError, match="takes no indices_tuple"):
        loss(torch.randn(4, 3), torch.arange(4) % 2, (torch.tensor([0]), torch.tensor([2]), torch.tensor([1])))
    lone = torch.randn(4, 3, requires_grad=True)
    value = loss(lone, torch.arange(4))
    value.backward()
    assert value.item() == 0.0 and torch.equal(lone.grad, torch.zeros_like(lone))
