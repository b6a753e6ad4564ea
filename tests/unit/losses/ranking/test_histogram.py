"""HistogramLoss: Ustinova & Lempitsky Eqs. (1)-(4) as loops, gradients, PML agreement."""

import math

import pytest
import torch
from pytorch_metric_learning import losses as pml_losses
from pytorch_metric_learning import miners as pml_miners

from dmlkit.exceptions import InvalidParameterError
from dmlkit.losses import LOSSES, HistogramLoss


def histogram(values, delta):
    """Eq. (2): each value's weight to the nodes t_r = -1 + r delta within delta of it, normalised."""
    nodes = round(2 / delta) + 1
    h = [0.0] * nodes
    for s in values:
        for r in range(nodes):
            t = -1 + r * delta
            if t - delta <= s <= t + delta:
                h[r] += 1 - abs(s - t) / delta
    return [v / len(values) for v in h]


def histogram_reference(x, y, n_bins):
    """Eq. (4): sum_r h-_r sum_{q <= r} h+_q over the unordered positive and negative pairs."""
    delta = 2 / n_bins
    u = [x[i] / x[i].norm() for i in range(len(x))]
    pos, neg = [], []
    for i in range(len(x)):
        for j in range(i + 1, len(x)):
            (pos if y[i] == y[j] else neg).append(float(u[i] @ u[j]))
    h_pos, h_neg = histogram(pos, delta), histogram(neg, delta)
    return sum(h_neg[r] * sum(h_pos[: r + 1]) for r in range(len(h_pos)))


@pytest.mark.parametrize("n_bins", [100, 7])
def test_equals_the_equation(n_bins, make_batch):
    x, y = make_batch(0, n=12, d=5, classes=4)
    assert HistogramLoss(n_bins=n_bins)(x, y).item() == pytest.approx(histogram_reference(x, y, n_bins), rel=1e-10)


def test_gradcheck(make_batch):
    x, y = make_batch(1, n=8, d=4, classes=3)
    x.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda e: HistogramLoss(n_bins=9)(e, y), (x,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_pml(dtype, make_batch):
    x, y = make_batch(2, n=32, d=8, classes=6, dtype=dtype)
    tol = dict(rtol=1e-6, atol=1e-7)  # PML finds the bins in float32 whatever the input (the loop above: 1e-10)
    for kwargs in ({}, dict(n_bins=10), dict(delta=0.5)):
        torch.testing.assert_close(HistogramLoss(**kwargs)(x, y), pml_losses.HistogramLoss(**kwargs)(x, y), **tol)
    triplets = pml_miners.TripletMarginMiner(margin=0.1)(x, y)
    torch.testing.assert_close(HistogramLoss()(x, y, triplets), pml_losses.HistogramLoss()(x, y, triplets), **tol)


def test_a_similarity_of_one_lands_on_the_last_node():
    x = torch.tensor([[1.0, 0.0], [2.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    assert HistogramLoss(n_bins=4)(x, torch.tensor([0, 0, 1])).item() == 0.0  # the positive (1) above both negatives (0)
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 0.0]], dtype=torch.float64)
    loss = HistogramLoss(n_bins=4)(x, torch.tensor([0, 0, 1]))  # negatives at 1 and 0, the positive at 0
    assert loss.item() == pytest.approx(1.0) and math.isfinite(loss.item())


def test_parameters():
    assert LOSSES.get("histogram") is HistogramLoss and HistogramLoss().delta == 0.02
    assert HistogramLoss(n_bins=10).delta == 0.2 and HistogramLoss(delta=0.5).num_nodes == 5
    with pytest.raises(AssertionError, match="'delta' parameter of HistogramLoss must equal 2 / n_bins"):
        HistogramLoss(n_bins=10, delta=0.4)
    with pytest.raises(InvalidParameterError, match="The 'n_bins' parameter of HistogramLoss must be an int >= 1"):
        HistogramLoss(n_bins=0)
