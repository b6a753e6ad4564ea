"""NTXentLoss and SupConLoss: SimCLR Eq. (1) and Khosla et al. Eq. (2) as loops, gradients, PML agreement."""

import math

import pytest
import torch
from pytorch_metric_learning import distances as pml_distances
from pytorch_metric_learning import losses as pml_losses
from pytorch_metric_learning import miners as pml_miners

from dmlkit.exceptions import InvalidParameterError
from dmlkit.losses import LOSSES, NTXentLoss, SupConLoss


def cosine(u, v):
    return float(u @ v) / (float(u.norm()) * float(v.norm()))


def ntxent_reference(x, y, t):
    """SimCLR Eq. (1) per positive pair, negatives from the labels; mean over positive pairs."""
    total, pairs = 0.0, 0
    for a in range(len(x)):
        negatives = [math.exp(cosine(x[a], x[n]) / t) for n in range(len(x)) if y[n] != y[a]]
        for p in range(len(x)):
            if p == a or y[p] != y[a]:
                continue
            num = math.exp(cosine(x[a], x[p]) / t)
            total += -math.log(num / (num + sum(negatives)))
            pairs += 1
    return total / pairs


def supcon_reference(x, y, t):
    """Khosla et al. Eq. (2) (L^sup_out) per anchor; mean over the anchors with a positive (nonzero)."""
    terms = []
    for a in range(len(x)):
        others = [k for k in range(len(x)) if k != a]
        positives = [p for p in others if y[p] == y[a]]
        if not positives:
            continue
        denominator = sum(math.exp(cosine(x[a], x[k]) / t) for k in others)
        terms.append(-sum(math.log(math.exp(cosine(x[a], x[p]) / t) / denominator) for p in positives) / len(positives))
    return sum(terms) / len(terms)


@pytest.mark.parametrize("t", [0.07, 0.5])
def test_ntxent_equals_the_equation(t, make_batch):
    x, y = make_batch(0, n=10, d=5, classes=4)
    assert NTXentLoss(temperature=t)(x, y).item() == pytest.approx(ntxent_reference(x, y, t), rel=1e-10)


@pytest.mark.parametrize("t", [0.1, 0.5])
def test_supcon_equals_the_equation(t, make_batch):
    x, y = make_batch(1, n=10, d=5, classes=4)
    assert SupConLoss(temperature=t)(x, y).item() == pytest.approx(supcon_reference(x, y, t), rel=1e-10)


@pytest.mark.parametrize("cls", [NTXentLoss, SupConLoss])
def test_gradcheck(cls, make_batch):
    x, y = make_batch(2, n=8, d=4, classes=3)
    x.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda e: cls(temperature=0.3)(e, y), (x,))
    refs = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    ry = torch.tensor([0, 1, 2, 0, 1])
    assert torch.autograd.gradcheck(lambda e, r: cls(temperature=0.3)(e, y, ref_emb=r, ref_labels=ry), (x, refs))


@pytest.mark.parametrize("name", ["NTXentLoss", "SupConLoss"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_pml(name, dtype, make_batch):
    x, y = make_batch(3, n=24, d=8, classes=5, dtype=dtype)
    refs, ry = make_batch(4, n=9, d=8, classes=6, dtype=dtype)
    ours, theirs = getattr(__import__("dmlkit.losses", fromlist=[name]), name), getattr(pml_losses, name)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(ours(temperature=0.2)(x, y), theirs(temperature=0.2)(x, y), **tol)
    torch.testing.assert_close(
        ours(temperature=0.2)(x, y, ref_emb=refs, ref_labels=ry), theirs(temperature=0.2)(x, y, ref_emb=refs, ref_labels=ry), **tol
    )
    lp = pml_distances.LpDistance()
    torch.testing.assert_close(ours(temperature=0.2, distance=lp)(x, y), theirs(temperature=0.2, distance=lp)(x, y), **tol)
    pairs = pml_miners.MultiSimilarityMiner(epsilon=0.5)(x, y)
    torch.testing.assert_close(ours()(x, y, pairs), theirs()(x, y, pairs), **tol)


def test_nothing_to_contrast_is_a_connected_zero():
    x = torch.randn(3, 4, requires_grad=True)
    for loss in (NTXentLoss(), SupConLoss()):
        for labels in (torch.zeros(3, dtype=torch.long), torch.arange(3)):
            value = loss(x, labels)
            value.backward()
            assert value.item() == 0.0 and torch.equal(x.grad, torch.zeros_like(x))


def test_registered_with_pml_defaults_and_validated():
    assert LOSSES.get("ntxent") is NTXentLoss and LOSSES.get("supcon") is SupConLoss
    assert NTXentLoss().temperature == 0.07 and NTXentLoss().reduction == "mean"
    assert SupConLoss().temperature == 0.1 and SupConLoss().reduction == "mean_nonzero"
    with pytest.raises(InvalidParameterError, match=r"The 'temperature' parameter of NTXentLoss must be a float > 0. Got 0 instead."):
        NTXentLoss(temperature=0)


@pytest.mark.parametrize("cls", [NTXentLoss, SupConLoss])
def test_terms_handed_to_a_reducer_equal_the_closed_form_path(cls, make_batch):
    """A reducer that needs the terms (here a threshold below every term: the mean) takes the autograd path."""
    from dmlkit.losses.reducers import MeanReducer, ThresholdReducer

    x, y = make_batch(5, n=16, d=6, classes=4)
    grads = []
    for reducer in (MeanReducer(), ThresholdReducer(low=-1.0)):
        e = x.clone().requires_grad_(True)
        value = cls(temperature=0.3, reducer=reducer)(e, y)
        value.backward()
        grads.append((value.detach(), e.grad))
    torch.testing.assert_close(grads[0], grads[1])
