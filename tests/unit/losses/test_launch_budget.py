"""On a launch-bound card a loss call costs its dispatched operators, so the losses that were slower
than PML there now dispatch fewer; and the closed-form routes that made them so agree with their autograd twins.

Operators are counted on the CPU (``_host_syncs.OperatorCounter``: every ATen operator of a forward + backward,
the backward's included) with every tensor treated as device memory, as on a card.
``benchmarks/bench_launches.py`` prints the same counts with the host time per call.
"""

import pytest
import torch
from pytorch_metric_learning import losses as pml

import dmlkit.core.validation as validation
import dmlkit.losses as L
from dmlkit.distances import l2_normalize
from dmlkit.losses.logsumexp import log1p_sum_exp
from dmlkit.losses.proxy._math import normalize_rows, unit_rows, unit_vectors
from dmlkit.losses.proxy.proxy_anchor import proxy_anchor_terms

from ._host_syncs import OperatorCounter

B, D, C = 32, 16, 100

#: The rows of the GPU benchmark that were slower than PML: ``name: (dmlkit factory, PML factory)``.
SLOWER_ON_THE_CARD = {
    "NormalizedSoftmaxLoss": (lambda: L.NormalizedSoftmaxLoss(C, D), lambda: pml.NormalizedSoftmaxLoss(C, D)),
    "SoftTripleLoss": (lambda: L.SoftTripleLoss(C, D), lambda: pml.SoftTripleLoss(C, D)),
    "TripletMarginLoss": (lambda: L.TripletMarginLoss(), lambda: pml.TripletMarginLoss()),
    "ProxyAnchorLoss": (lambda: L.ProxyAnchorLoss(C, D), lambda: pml.ProxyAnchorLoss(C, D)),
    "LiftedStructureLoss": (lambda: L.LiftedStructureLoss(), lambda: pml.LiftedStructureLoss()),
    "CosFaceLoss": (lambda: L.CosFaceLoss(C, D), lambda: pml.CosFaceLoss(C, D)),
    "SubCenterArcFaceLoss": (lambda: L.SubCenterArcFaceLoss(num_classes=C, embedding_size=D),
                             lambda: pml.SubCenterArcFaceLoss(num_classes=C, embedding_size=D)),
    "ArcFaceLoss": (lambda: L.ArcFaceLoss(C, D), lambda: pml.ArcFaceLoss(C, D)),
}


def operators(loss, x, y) -> int:
    loss(x.detach().requires_grad_(True), y).backward()  # first call: lazy buffers
    with OperatorCounter() as counter:
        loss(x.detach().requires_grad_(True), y).backward()
    return sum(counter.counts.values())


@pytest.mark.parametrize("name", list(SLOWER_ON_THE_CARD))
def test_forward_and_backward_dispatch_fewer_operators_than_pml(name, monkeypatch):
    monkeypatch.setattr(validation, "reads_on_host", lambda tensor: False)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(B, D, generator=g), torch.randperm(C, generator=g)[: B // 4].repeat_interleave(4)
    ours, theirs = SLOWER_ON_THE_CARD[name]
    assert operators(ours(), x, y) < operators(theirs(), x, y)


# ----------------------------------------------------------------------------- one-node normalisations
def awkward_rows(dtype=torch.float64):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 5, generator=g, dtype=dtype)
    x[1] = 0.0  # a zero row: 0 out, F.normalize's gradient
    x[2] *= 1e30  # would overflow a plain float32 norm
    x[3] *= 1e-30  # would underflow it
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_unit_rows_has_unit_vectors_values_and_gradient(dtype):
    x = awkward_rows(dtype)
    a, b = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    weights = torch.randn(x.shape, generator=torch.Generator().manual_seed(2), dtype=dtype)
    (unit_rows(a) * weights).sum().backward()
    (unit_vectors(b, 1) * weights).sum().backward()
    assert torch.equal(unit_rows(x), unit_vectors(x, 1))
    rtol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(a.grad, b.grad, rtol=rtol, atol=0)


def test_normalize_rows_has_l2_normalize_values_and_gradient():
    x = awkward_rows()[[0, 1, 4, 5]]
    a, b = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    weights = torch.randn(x.shape, generator=torch.Generator().manual_seed(3), dtype=x.dtype)
    (normalize_rows(a) * weights).sum().backward()
    (l2_normalize(b) * weights).sum().backward()
    assert torch.equal(normalize_rows(x), l2_normalize(x))
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-12, atol=0)


@pytest.mark.parametrize("normalise", [unit_rows, normalize_rows])
def test_one_node_normalisations_pass_gradcheck(normalise):
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(4), dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(normalise, (x,))


# ----------------------------------------------------------------------------- closed forms against autograd
def test_proxy_anchor_present_terms_match_autograd_of_eq_4():
    """Value and ``dl/dz`` of the present proxies against autograd through a float64 transcription of Eq. (4)."""
    g = torch.Generator().manual_seed(5)
    z = (torch.rand(7, 12, generator=g, dtype=torch.float64) * 2 - 1) * 32
    positive = torch.rand(7, 12, generator=g) < 0.3
    positive[3] = False  # a proxy without positives: not in |P+|
    negative = ~positive
    negative[5, :4] = False  # "nearest": some pairs are neither
    offset, num_proxies = 32 * 0.1, 40
    value, grad = proxy_anchor_terms(z, positive, negative, offset, num_proxies)
    leaf = z.clone().requires_grad_(True)
    pos = log1p_sum_exp(offset - leaf, positive, dim=1).sum() / positive.any(1).sum()
    reference = pos + log1p_sum_exp(leaf + offset, negative, dim=1).sum() / num_proxies
    reference.backward()
    torch.testing.assert_close(value, reference.detach(), rtol=1e-12, atol=0)
    torch.testing.assert_close(grad, leaf.grad, rtol=1e-10, atol=1e-15)


def labelled(seed, classes=5, per_class=3):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(classes * per_class, 6, generator=g, dtype=torch.float64), \
        torch.arange(classes).repeat_interleave(per_class)


def value_and_gradient(loss, x, y):
    leaf = x.clone().requires_grad_(True)
    value = loss(leaf, y)
    value.backward()
    return value.detach(), leaf.grad


@pytest.mark.parametrize("factory", [
    lambda: L.LiftedStructureLoss(neg_margin=1.2, pos_margin=0.1),
    lambda: L.LiftedStructureLoss(reduction="mean_nonzero"),
    lambda: L.LiftedStructureLoss(reduction="sum"),
    lambda: L.TripletMarginLoss(margin=0.3),
    lambda: L.TripletMarginLoss(margin=0.3, reduction="mean_nonzero"),
    lambda: L.TripletMarginLoss(margin=0.3, smooth_loss=True),
])
@pytest.mark.parametrize("labels", ["classes", "one class and singletons"])
def test_closed_form_pair_routes_equal_their_autograd_twin(factory, labels, monkeypatch):
    x, y = labelled(6)
    if labels != "classes":
        y = torch.tensor([0] * 6 + list(range(1, 10)))  # samples without positives, and many negatives
    closed = value_and_gradient(factory(), x, y)
    twin = factory()
    monkeypatch.setattr(twin, "reduces_from_counts", lambda: False)  # the terms through autograd and the reducer
    reference = value_and_gradient(twin, x, y)
    assert closed[0] > 0
    torch.testing.assert_close(closed[0], reference[0], rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(closed[1], reference[1], rtol=1e-9, atol=1e-12)
