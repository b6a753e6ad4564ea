"""Contracts shared by every pair loss: registry, validation, pair sources, degenerate batches."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import dmlkit.losses.pair as pair
from dmlkit.exceptions import DataError, InvalidParameterError
from dmlkit.losses.base import LOSSES, MetricLoss
from dmlkit.mining.selection import PairSelection

REGISTERED = {
    "contrastive": pair.ContrastiveLoss,
    "triplet_margin": pair.TripletMarginLoss,
    "margin": pair.MarginLoss,
    "multi_similarity": pair.MultiSimilarityLoss,
    "lifted_structure": pair.LiftedStructureLoss,
    "generalized_lifted_structure": pair.GeneralizedLiftedStructureLoss,
    "binomial_deviance": pair.BinomialDevianceLoss,
    "npairs": pair.NPairsLoss,
}
ALL_NAMES = sorted(REGISTERED)
WITH_REFERENCES = [n for n in ALL_NAMES if n != "npairs"]


def test_registry_and_exports():
    for name, cls in REGISTERED.items():
        assert LOSSES.get(name) is cls
        assert isinstance(LOSSES.create(name), MetricLoss)
        assert cls.__name__ in pair.__all__
    assert set(pair.__all__) <= set(dir(pair))


def test_pml_defaults():
    assert pair.ContrastiveLoss().pos_margin == 0 and pair.ContrastiveLoss().neg_margin == 1
    t = pair.TripletMarginLoss()
    assert (t.margin, t.swap, t.smooth_loss, t.triplets_per_anchor) == (0.05, False, False, "all")
    m = pair.MarginLoss()
    assert (m.margin, m.nu, m.learn_beta, m.num_classes) == (0.2, 0, False, None) and abs(float(m.beta) - 1.2) < 1e-6
    ms = pair.MultiSimilarityLoss()
    assert (ms.alpha, ms.beta, ms.base) == (2, 50, 0.5)
    assert pair.LiftedStructureLoss().neg_margin == 1 and pair.GeneralizedLiftedStructureLoss().pos_margin == 0


def test_parameter_errors_use_the_template():
    with pytest.raises(InvalidParameterError, match=r"The 'alpha' parameter of MultiSimilarityLoss must be a float > 0. Got -1 instead."):
        pair.MultiSimilarityLoss(alpha=-1)
    with pytest.raises(ValueError, match="'reduction' parameter of ContrastiveLoss"):
        pair.ContrastiveLoss(reduction="avg")
    with pytest.raises(ValueError, match="'triplets_per_anchor' parameter of TripletMarginLoss"):
        pair.TripletMarginLoss(triplets_per_anchor=0)
    with pytest.raises(TypeError, match="'distance' parameter"):
        pair.ContrastiveLoss(distance="cosine")


def test_data_errors_quote_both_operands():
    x = torch.randn(8, 4)
    with pytest.raises(DataError, match="embeddings has 8 rows but labels has 7"):
        pair.ContrastiveLoss()(x, torch.zeros(7, dtype=torch.long))
    with pytest.raises(DataError, match="embeddings has 4 columns but ref_emb has 5"):
        pair.ContrastiveLoss()(x, torch.zeros(8, dtype=torch.long), ref_emb=torch.randn(3, 5), ref_labels=torch.zeros(3, dtype=torch.long))
    with pytest.raises(DataError, match="ref_emb has 3 rows but ref_labels has 2"):
        pair.ContrastiveLoss()(x, torch.zeros(8, dtype=torch.long), ref_emb=torch.randn(3, 4), ref_labels=torch.zeros(2, dtype=torch.long))
    with pytest.raises(DataError, match=r"pos_mask has shape \(8, 7\)"):
        pair.ContrastiveLoss()(x, pos_mask=torch.zeros(8, 7, dtype=torch.bool))
    with pytest.raises(InvalidParameterError, match="does not take per-pair weights"):
        pair.MultiSimilarityLoss()(x, torch.zeros(8, dtype=torch.long), weights=torch.ones(8, 8))
    with pytest.raises(DataError, match="must hold integer class ids"):
        pair.ContrastiveLoss()(x, torch.zeros(8))


@pytest.mark.parametrize("name", WITH_REFERENCES)
def test_pos_mask_and_multilabel_targets_equal_class_labels(name):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(12, 5, generator=g, dtype=torch.float64)
    y = torch.arange(12) % 4
    loss = LOSSES.create(name)
    expected = loss(x, y)
    pos = (y[:, None] == y[None, :])
    torch.testing.assert_close(loss(x, pos_mask=pos), expected)
    torch.testing.assert_close(loss(x, torch.nn.functional.one_hot(y, 4)), expected)
    pos_sel = pos & ~torch.eye(12, dtype=torch.bool)
    torch.testing.assert_close(loss(x, y, pairs=PairSelection(pos_sel, ~pos)), expected)


class RecordingMiner(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, embeddings, labels, ref_emb, ref_labels):
        self.calls += 1
        pos = labels[:, None] == (labels if ref_labels is None else ref_labels)[None, :]
        if ref_emb is None:
            pos = pos & ~torch.eye(len(labels), dtype=torch.bool)
        return PairSelection(pos, torch.zeros_like(pos))  # positives only


def test_miner_at_construction_supplies_pairs():
    miner = RecordingMiner()
    x, y = torch.randn(10, 4, dtype=torch.float64), torch.arange(10) % 3
    with_miner = pair.ContrastiveLoss(0.0, 1.0, miner=miner)(x, y)
    xn = x / x.norm(dim=1, keepdim=True)
    d = torch.cdist(xn, xn)
    pos = (y[:, None] == y[None, :]) & ~torch.eye(10, dtype=torch.bool)
    assert miner.calls == 1
    torch.testing.assert_close(with_miner, d[pos].mean())


@pytest.mark.parametrize("name", ALL_NAMES)
def test_loss_is_invariant_to_batch_order_and_relabelling(name):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(16, 6, generator=g, dtype=torch.float64)
    y = torch.arange(16) % 4
    loss = LOSSES.create(name)
    base = loss(x, y)
    if name != "npairs":  # N-pairs picks the first sample of each class, which depends on order
        perm = torch.randperm(16, generator=g)
        torch.testing.assert_close(loss(x[perm], y[perm]), base)
    torch.testing.assert_close(loss(x, y * 7 + 1000), base)


@pytest.mark.parametrize("name", ALL_NAMES)
def test_half_precision_input_gives_a_loss_of_its_dtype(name):
    x = torch.randn(16, 8).half().requires_grad_(True)
    loss = LOSSES.create(name)(x, torch.arange(16) % 4)
    loss.backward()
    assert loss.dtype == torch.float16 and torch.isfinite(loss)
    assert x.grad.dtype == torch.float16


@pytest.mark.parametrize("name", ALL_NAMES)
def test_no_usable_pair_returns_connected_zero(name):
    x = torch.randn(6, 4, requires_grad=True)
    loss = LOSSES.create(name)(x, torch.zeros(6, dtype=torch.long), pos_mask=torch.zeros(6, 6, dtype=torch.bool)) if name != "npairs" else LOSSES.create(name)(x, torch.arange(6))
    if name in ("contrastive", "binomial_deviance", "multi_similarity", "generalized_lifted_structure"):
        # Every pair is a negative here, so only check the loss stays finite and differentiable.
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(x.grad).all()
        return
    assert loss.requires_grad and float(loss.detach()) == 0.0
    loss.backward()
    assert torch.equal(x.grad, torch.zeros_like(x))


@st.composite
def degenerate_batches(draw):
    n = draw(st.integers(1, 9))
    d = draw(st.integers(1, 4))
    kind = draw(st.sampled_from(["random", "zeros", "duplicates"]))
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    if kind == "zeros":
        x = torch.zeros(n, d, dtype=torch.float64)
    elif kind == "duplicates":
        x = x[:1].repeat(n, 1)
    labels = draw(st.sampled_from(["one_class", "singletons", "mixed"]))
    if labels == "one_class":
        y = torch.zeros(n, dtype=torch.long)
    elif labels == "singletons":
        y = torch.arange(n)
    else:
        y = torch.randint(0, 3, (n,), generator=g)
    return x, y


@settings(deadline=None, max_examples=25)
@given(batch=degenerate_batches(), name=st.sampled_from(ALL_NAMES))
def test_degenerate_batches_give_finite_nonnegative_loss_and_grads(batch, name):
    x, y = batch
    x = x.clone().requires_grad_(True)
    loss = LOSSES.create(name)(x, y)
    loss.backward()
    assert torch.isfinite(loss) and float(loss.detach()) >= 0
    assert torch.isfinite(x.grad).all()


@settings(deadline=None, max_examples=15)
@given(batch=degenerate_batches(), name=st.sampled_from(WITH_REFERENCES), rows=st.integers(1, 6))
def test_degenerate_reference_sets_give_finite_loss(batch, name, rows):
    x, y = batch
    x = x.clone().requires_grad_(True)
    ref = torch.zeros(rows, x.shape[1], dtype=x.dtype)
    loss = LOSSES.create(name)(x, y, ref_emb=ref, ref_labels=torch.zeros(rows, dtype=torch.long))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(x.grad).all()


def test_parameter_constraints_are_declared_per_class_and_checked_once_before_init():
    from dmlkit.losses import ProxyAnchorLoss, ProxyNCAPlusPlusLoss, TripletMarginLoss
    from dmlkit.losses.base import MetricLoss

    assert set(ProxyAnchorLoss.parameter_constraints()) >= {"margin", "alpha", "assignment", "matmul_precision"}
    # a subclass inherits its bases' constraints and adds its own
    assert {"temperature", "softmax_scale", "matmul_precision"} <= set(ProxyNCAPlusPlusLoss.parameter_constraints())
    with pytest.raises(InvalidParameterError, match="The 'margin' parameter of TripletMarginLoss must be a float. Got 'x'"):
        TripletMarginLoss(margin="x")
    with pytest.raises(InvalidParameterError, match="The 'temperature' parameter of ProxyNCAPlusPlusLoss must be a float > 0"):
        ProxyNCAPlusPlusLoss(4, 8, temperature=0)
    calls = []

    from dmlkit.core.validation import Interval

    class Probe(MetricLoss):
        _parameter_constraints = {"width": [Interval(int, 1, None)]}

        def __init__(self, width: int = 2):
            calls.append(width)
            super().__init__()

    Probe(3)
    with pytest.raises(InvalidParameterError, match="'width' parameter of Probe must be an int >= 1. Got 0"):
        Probe(0)
    assert calls == [3]  # the bad call never reached __init__
