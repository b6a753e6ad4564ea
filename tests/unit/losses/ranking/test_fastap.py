"""FastAPLoss: Cakir et al. Eqs. (9)-(13) as loops over anchors and bins, gradients, PML agreement."""

import pytest
import torch
from pytorch_metric_learning import losses as pml_losses
from pytorch_metric_learning import miners as pml_miners

from dmlkit.distances import CosineSimilarity
from dmlkit.exceptions import InvalidParameterError
from dmlkit.losses import LOSSES, FastAPLoss


def fastap_reference(x, y, num_bins):
    """Mean over anchors with positives of 1 - 1/N+ sum_l h+_l H+_l / H_l, triangular bins over [0, 4]."""
    u = [x[i] / x[i].norm() for i in range(len(x))]
    delta = 4.0 / num_bins
    centres = [delta * b for b in range(num_bins + 1)]
    losses = []
    for a in range(len(x)):
        h_pos, h_all = [0.0] * len(centres), [0.0] * len(centres)
        n_pos = 0
        for k in range(len(x)):
            if k == a:
                continue
            d = float(((u[a] - u[k]) ** 2).sum())
            n_pos += int(y[k] == y[a])
            for b, c in enumerate(centres):
                pulse = max(0.0, 1 - abs(d - c) / delta)
                h_all[b] += pulse
                h_pos[b] += pulse if y[k] == y[a] else 0.0
        if n_pos == 0:
            continue
        ap, cum_pos, cum_all = 0.0, 0.0, 0.0
        for b in range(len(centres)):
            cum_pos, cum_all = cum_pos + h_pos[b], cum_all + h_all[b]
            if h_pos[b] * cum_pos > 0 and cum_all > 0:
                ap += h_pos[b] * cum_pos / cum_all
        losses.append(1 - ap / n_pos)
    return sum(losses) / len(losses)


@pytest.mark.parametrize("num_bins", [10, 3])
def test_equals_the_equation(num_bins, make_batch):
    x, y = make_batch(0, n=12, d=5, classes=4)
    assert FastAPLoss(num_bins)(x, y).item() == pytest.approx(fastap_reference(x, y, num_bins), rel=1e-10)


def test_gradcheck(make_batch):
    x, y = make_batch(1, n=8, d=4, classes=3)
    x.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda e: FastAPLoss(7)(e, y), (x,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_pml_with_and_without_miner_weights(dtype, make_batch):
    x, y = make_batch(2, n=32, d=8, classes=6, dtype=dtype)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(FastAPLoss()(x, y), pml_losses.FastAPLoss()(x, y), **tol)
    triplets = pml_miners.TripletMarginMiner(margin=0.2)(x, y)
    torch.testing.assert_close(FastAPLoss(5)(x, y, triplets), pml_losses.FastAPLoss(5)(x, y, triplets), **tol)


def test_inputs_and_parameters(make_batch):
    x, y = make_batch(3, n=12, d=5, classes=4)
    assert LOSSES.get("fastap") is FastAPLoss and FastAPLoss().num_bins == 10 and FastAPLoss().num_edges == 11
    with pytest.raises(ValueError, match="does not support ref_emb"):
        FastAPLoss()(x, y, ref_emb=x, ref_labels=y)
    with pytest.raises(ValueError, match="needs class labels"):
        FastAPLoss()(x)
    with pytest.raises(InvalidParameterError, match="LpDistance with normalize_embeddings=True"):
        FastAPLoss(distance=CosineSimilarity())
    with pytest.raises(InvalidParameterError, match="The 'num_bins' parameter of FastAPLoss must be an int >= 1. Got 0"):
        FastAPLoss(0)
    lone = torch.randn(4, 3, requires_grad=True)
    value = FastAPLoss()(lone, torch.arange(4))
    value.backward()
    assert value.item() == 0.0 and torch.equal(lone.grad, torch.zeros_like(lone))
