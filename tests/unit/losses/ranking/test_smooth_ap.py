"""SmoothAPLoss: Brown et al. Eqs. (6)-(9) as loops (paper form and PML's), gradients, PML agreement."""

import math

import pytest
import torch
from pytorch_metric_learning import losses as pml_losses
from pytorch_metric_learning import miners as pml_miners

from dmlkit.exceptions import InvalidParameterError
from dmlkit.losses import LOSSES, SmoothAPLoss


def smooth_ap_reference(x, y, tau, query_in_ranking):
    """Mean over queries of 1 - AP, ranks smoothed by sigmoid(x / tau); the query counts itself or not."""
    u = [x[i] / x[i].norm() for i in range(len(x))]

    def g(v):
        return 1 / (1 + math.exp(-v / tau))

    losses = []
    for q in range(len(x)):
        ranked = [k for k in range(len(x)) if query_in_ranking or k != q]
        positives = [k for k in ranked if y[k] == y[q]]
        if not positives:
            continue
        s = {k: float(u[q] @ u[k]) for k in ranked}
        ap = 0.0
        for j in positives:
            pos_rank = 1 + sum(g(s[k] - s[j]) for k in positives if k != j)
            all_rank = 1 + sum(g(s[k] - s[j]) for k in ranked if k != j)
            ap += pos_rank / all_rank
        losses.append(1 - ap / len(positives))
    return sum(losses) / len(losses)


def grouped_batch(seed=0, classes=4, per_class=3, d=5, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(classes * per_class, d, generator=g, dtype=dtype), torch.arange(classes).repeat_interleave(per_class)


@pytest.mark.parametrize("query_in_ranking", [True, False])
def test_equals_the_equation(query_in_ranking):
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(11, 5, generator=g, dtype=torch.float64), torch.randint(0, 4, (11,), generator=g)
    loss = SmoothAPLoss(0.1, query_in_ranking=query_in_ranking)(x, y)
    assert loss.item() == pytest.approx(smooth_ap_reference(x, y, 0.1, query_in_ranking), rel=1e-10)


@pytest.mark.parametrize("query_in_ranking", [True, False])
def test_gradcheck(query_in_ranking):
    x, y = grouped_batch(2, classes=3, per_class=3, d=4)
    x.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda e: SmoothAPLoss(0.2, query_in_ranking=query_in_ranking)(e, y), (x,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_pml_on_grouped_batches(dtype):
    """PML's blocks of positives are its classes when there are as many classes as samples per class."""
    x, y = grouped_batch(3, classes=6, per_class=6, d=8, dtype=dtype)
    tol = dict(rtol=1e-6, atol=1e-7)  # PML accumulates AP in float32 whatever the input
    for t in (0.01, 0.1):
        torch.testing.assert_close(SmoothAPLoss(t)(x, y), pml_losses.SmoothAPLoss(t)(x, y).to(dtype), **tol)
    triplets = pml_miners.TripletMarginMiner(margin=0.1)(x, y)  # per-query weights: count / max count
    torch.testing.assert_close(SmoothAPLoss()(x, y, triplets), pml_losses.SmoothAPLoss()(x, y, triplets).to(dtype), **tol)


def test_defined_from_labels_on_any_batch_order():
    x, y = grouped_batch(4, classes=5, per_class=3)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(SmoothAPLoss(0.05)(x[order], y[order]), SmoothAPLoss(0.05)(x, y))


def test_parameters():
    assert LOSSES.get("smooth_ap") is SmoothAPLoss
    loss = SmoothAPLoss()
    assert loss.temperature == 0.01 and loss.query_in_ranking is True
    with pytest.raises(InvalidParameterError, match="The 'temperature' parameter of SmoothAPLoss must be a float > 0"):
        SmoothAPLoss(temperature=-1)
