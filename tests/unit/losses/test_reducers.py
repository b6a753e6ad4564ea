"""Reducers: both calls (dmlkit's ``reducer(terms, mask, ...)`` and PML's ``reducer(loss_dict,
embeddings, labels)``) against plain loops, against PML's reducers, and inside the losses."""

from __future__ import annotations

import pytest
import torch
from pytorch_metric_learning import losses as pml_losses
from pytorch_metric_learning import reducers as pml_reducers

import dmlkit.losses as dml_losses
from dmlkit.exceptions import DataError, InvalidParameterError
from dmlkit.losses.reducers import (
    AvgNonZeroReducer,
    ClassWeightedReducer,
    DivisorReducer,
    DoNothingReducer,
    MeanReducer,
    MultipleReducers,
    PerAnchorReducer,
    PMLReducer,
    SumReducer,
    ThresholdReducer,
)

B = 12
KINDS = ("element", "pos_pair", "neg_pair", "triplet")


def _case(kind: str, seed: int = 0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 4, (B,), generator=g)
    embeddings = torch.randn(B, 5, generator=g, dtype=dtype, requires_grad=True)
    n = 30
    losses = torch.randn(n, generator=g, dtype=dtype).requires_grad_()
    if kind == "element":
        indices = torch.randint(0, B, (n,), generator=g)
    else:
        indices = tuple(torch.randint(0, B, (n,), generator=g) for _ in range(2 if kind != "triplet" else 3))
    return {"loss": {"losses": losses, "indices": indices, "reduction_type": kind}}, embeddings, labels


def _anchor(indices, kind):
    return indices if kind == "element" else indices[0]


def _ours_and_pml():
    weights = torch.tensor([1.0, 0.5, 0.0, 2.0])
    return [
        (MeanReducer(), pml_reducers.MeanReducer()),
        (SumReducer(), pml_reducers.SumReducer()),
        (AvgNonZeroReducer(), pml_reducers.AvgNonZeroReducer()),
        (ThresholdReducer(low=-0.5, high=0.8), pml_reducers.ThresholdReducer(low=-0.5, high=0.8)),
        (ClassWeightedReducer(weights), pml_reducers.ClassWeightedReducer(weights)),
    ]


@pytest.mark.parametrize("kind", KINDS)
def test_loss_dict_call_matches_pml(kind):
    loss_dict, emb, labels = _case(kind)
    for ours, pml in _ours_and_pml():
        torch.testing.assert_close(ours(loss_dict, emb, labels), pml(loss_dict, emb, labels))


@pytest.mark.parametrize("kind", KINDS)
def test_each_rule_matches_its_loop(kind):
    loss_dict, emb, labels = _case(kind, seed=3)
    info = loss_dict["loss"]
    values = info["losses"].tolist()
    anchors = _anchor(info["indices"], kind).tolist()
    weights = [1.0, 0.5, 0.0, 2.0]
    kept = [v for v in values if -0.5 < v < 0.8]
    positive = [v for v in values if v > 0]
    expected = {
        "mean": sum(values) / len(values),
        "sum": sum(values),
        "mean_nonzero": sum(positive) / len(positive),
        "threshold": sum(kept) / len(kept),
        "class_weighted": sum(v * weights[int(labels[a])] for v, a in zip(values, anchors)) / len(values),
    }
    for ours, _ in _ours_and_pml():
        assert ours(loss_dict, emb, labels).item() == pytest.approx(expected[ours.name], rel=1e-12)


def test_per_anchor_reducer_matches_its_loop_and_pml():
    loss_dict, emb, labels = _case("pos_pair", seed=5)
    info = loss_dict["loss"]
    a, o = info["indices"]
    last = {}
    for i, (ai, oi) in enumerate(zip(a.tolist(), o.tolist())):
        last[(ai, oi)] = info["losses"][i].item()  # a repeated pair keeps its last term
    per_anchor = []
    for row in range(B):
        terms = [v for (ai, _), v in last.items() if ai == row]
        per_anchor.append(sum(terms) / len(terms) if terms else 0.0)
    ours = PerAnchorReducer()(loss_dict, emb, labels)
    assert ours.item() == pytest.approx(sum(per_anchor) / B, rel=1e-12)
    torch.testing.assert_close(ours, pml_reducers.PerAnchorReducer()(loss_dict, emb, labels))
    nonzero = PerAnchorReducer(AvgNonZeroReducer())(loss_dict, emb, labels)
    positive = [v for v in per_anchor if v > 0]
    assert nonzero.item() == pytest.approx(sum(positive) / len(positive), rel=1e-12)
    with pytest.raises(NotImplementedError):
        PerAnchorReducer()(_case("triplet")[0], emb, labels)


def test_divisor_do_nothing_and_multiple_reducers():
    loss_dict, emb, labels = _case("element")
    losses = loss_dict["loss"]["losses"]
    with_divisor = {"loss": {**loss_dict["loss"], "divisor": 7}}
    assert DivisorReducer()(with_divisor, emb, labels).item() == pytest.approx(losses.sum().item() / 7)
    zero = DivisorReducer()({"loss": {**loss_dict["loss"], "divisor": 0}}, emb, labels)
    assert zero.item() == 0 and zero.requires_grad
    with pytest.raises(DataError, match="divisor"):
        DivisorReducer()(loss_dict, emb, labels)
    assert DoNothingReducer()(loss_dict, emb, labels) is loss_dict
    both = {"a": loss_dict["loss"], "b": with_divisor["loss"]}
    total = MultipleReducers({"b": DivisorReducer()}, default_reducer=AvgNonZeroReducer())(both, emb, labels)
    expected = losses[losses > 0].mean() + losses.sum() / 7
    torch.testing.assert_close(total, expected)
    pml = pml_reducers.MultipleReducers({"b": pml_reducers.DivisorReducer()}, pml_reducers.AvgNonZeroReducer())
    torch.testing.assert_close(total, pml(both, emb, labels))


def test_zero_loss_and_already_reduced_keep_the_graph():
    emb = torch.randn(4, 3, requires_grad=True)
    labels = torch.arange(4)
    for reducer in (MeanReducer(), AvgNonZeroReducer(), ThresholdReducer(high=1.0), DivisorReducer(),
                    ClassWeightedReducer(torch.ones(4)), PerAnchorReducer()):
        out = reducer({"loss": {"losses": 0, "indices": None, "reduction_type": "already_reduced"}}, emb, labels)
        assert out.item() == 0
        out.backward()
        assert torch.equal(emb.grad, torch.zeros_like(emb))
        emb.grad = None
    value = torch.tensor(2.5, requires_grad=True)
    assert MeanReducer()({"loss": {"losses": value, "indices": None, "reduction_type": "already_reduced"}}, emb, labels) is value
    # Nothing above the threshold: a 0 on the graph, as PML.
    none_kept = ThresholdReducer(low=10.0)({"loss": {"losses": torch.ones(3), "indices": torch.arange(3),
                                                     "reduction_type": "element"}}, emb, labels)
    assert none_kept.item() == 0 and none_kept.requires_grad


def test_loss_dict_with_wrong_indices_is_refused():
    emb, labels = torch.randn(4, 3), torch.arange(4)
    bad = {"loss": {"losses": torch.ones(3), "indices": (torch.arange(3),), "reduction_type": "pos_pair"}}
    with pytest.raises(DataError, match="pos_pair"):
        MeanReducer()(bad, emb, labels)


def test_internal_matrix_call_equals_pml_call_on_the_selected_pairs():
    g = torch.Generator().manual_seed(2)
    terms = torch.randn(6, 6, generator=g, dtype=torch.float64)
    mask = torch.rand(6, 6, generator=g) > 0.4
    labels = torch.tensor([0, 1, 2, 0, 1, 2])
    rows, cols = mask.nonzero(as_tuple=True)
    as_dict = {"loss": {"losses": terms[rows, cols], "indices": (rows, cols), "reduction_type": "pos_pair"}}
    emb = torch.zeros(6, 2, dtype=torch.float64)
    for ours, pml in _ours_and_pml() + [(PerAnchorReducer(), pml_reducers.PerAnchorReducer())]:
        torch.testing.assert_close(ours(terms, mask, kind="pos_pair", labels=labels), pml(as_dict, emb, labels))


def test_class_weighted_reducer_needs_labels():
    with pytest.raises(DataError, match="labels"):
        ClassWeightedReducer(torch.ones(3))(torch.ones(2, 2), torch.ones(2, 2, dtype=torch.bool))


def _pml_value(loss_name, kwargs, pml_reducer, x, y):
    """PML's loss with ``pml_reducer``; for lifted structure, PML's terms (a [P, 1] column there,
    which its PerAnchor and ClassWeighted reducers misread) reduced as the [P] vector they are."""
    if loss_name != "LiftedStructureLoss":
        return getattr(pml_losses, loss_name)(**kwargs, reducer=pml_reducer)(x, y)
    terms = pml_losses.LiftedStructureLoss(**kwargs, reducer=pml_reducers.DoNothingReducer())(x, y)
    terms["loss"]["losses"] = terms["loss"]["losses"].squeeze(1)
    return pml_reducer(terms, x, y)


def _batch(seed=0, n=16, dim=8):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, dim, generator=g), torch.randint(0, 4, (n,), generator=g)


@pytest.mark.parametrize("loss_name, kwargs", [("ContrastiveLoss", {"pos_margin": 0.2, "neg_margin": 0.9}),
                                               ("TripletMarginLoss", {"margin": 0.3}),
                                               ("LiftedStructureLoss", {})])
@pytest.mark.parametrize("make", [
    lambda m: m.ThresholdReducer(low=0.05, high=0.9),
    lambda m: m.ClassWeightedReducer(torch.tensor([1.0, 0.2, 3.0, 0.5])),
    lambda m: m.PerAnchorReducer(m.AvgNonZeroReducer()),
    lambda m: m.DivisorReducer(),
])
def test_losses_take_any_reducer_as_pml(loss_name, kwargs, make):
    import dmlkit.losses.reducers as dml_reducers

    x, y = _batch()
    pml_reducer = make(pml_reducers)
    if loss_name == "TripletMarginLoss" and isinstance(pml_reducer, pml_reducers.PerAnchorReducer):
        # Neither reduces triplets per anchor.
        for reducers in (dml_reducers, pml_reducers):
            with pytest.raises(NotImplementedError):
                getattr(dml_losses, loss_name)(**kwargs, reducer=make(reducers))(x, y)
        with pytest.raises(NotImplementedError):
            pml_losses.TripletMarginLoss(**kwargs, reducer=pml_reducer)(x, y)
        return
    if isinstance(pml_reducer, pml_reducers.DivisorReducer):
        # PML's pair losses give no divisor (KeyError); dmlkit's default divisor is 1 (the sum).
        ours = getattr(dml_losses, loss_name)(**kwargs, reducer=make(dml_reducers))(x.double(), y)
        sums = getattr(pml_losses, loss_name)(**kwargs, reducer=pml_reducers.SumReducer())(x.double(), y)
        torch.testing.assert_close(ours, sums)
        return
    xo = x.double().requires_grad_()
    xp = x.double().requires_grad_()
    ours = getattr(dml_losses, loss_name)(**kwargs, reducer=make(dml_reducers))(xo, y)
    pml = _pml_value(loss_name, kwargs, pml_reducer, xp, y)
    torch.testing.assert_close(ours, pml)
    ours.backward()
    pml.backward()
    torch.testing.assert_close(xo.grad, xp.grad)
    # PML's own reducer objects work too (converted or wrapped).
    torch.testing.assert_close(getattr(dml_losses, loss_name)(**kwargs, reducer=make(pml_reducers))(x.double(), y), pml)


def test_contrastive_loss_has_one_reducer_per_sub_loss_as_pml():
    x, y = _batch(seed=4)
    loss = dml_losses.ContrastiveLoss(reducer=ThresholdReducer(low=0.1))
    parts = loss.reducer.reducers
    assert set(parts) == {"pos_loss", "neg_loss"} and all(type(r) is ThresholdReducer for r in parts.values())
    assert parts["pos_loss"] is not parts["neg_loss"]
    mixed = {"pos_loss": MeanReducer(), "neg_loss": ThresholdReducer(low=0.2, high=0.7)}
    ours = dml_losses.ContrastiveLoss(0.1, 0.8, reducer=MultipleReducers(mixed))(x.double(), y)
    pml_mixed = {"pos_loss": pml_reducers.MeanReducer(), "neg_loss": pml_reducers.ThresholdReducer(low=0.2, high=0.7)}
    pml = pml_losses.ContrastiveLoss(0.1, 0.8, reducer=pml_reducers.MultipleReducers(pml_mixed))(x.double(), y)
    torch.testing.assert_close(ours, pml)


def test_do_nothing_reducer_returns_the_terms_and_stats_are_collected():
    x, y = _batch(seed=6)
    out = dml_losses.TripletMarginLoss(0.2, reducer=DoNothingReducer())(x, y)
    info = out["loss"]
    assert info["reduction_type"] == "triplet" and len(info["indices"]) == 3
    a, p, n = info["indices"]
    assert bool((y[a] == y[p]).all() and (y[a] != y[n]).all())
    reducer = AvgNonZeroReducer(collect_stats=True)
    dml_losses.TripletMarginLoss(0.2, reducer=reducer)(x, y)
    assert reducer.num_past_filter == int((info["losses"] > 0).sum())
    assert not hasattr(AvgNonZeroReducer(collect_stats=False), "num_past_filter")


def test_losses_that_reduce_from_counts_refuse_reducers_needing_terms():
    with pytest.raises(InvalidParameterError, match="'reduction' parameter of MultiSimilarityLoss"):
        dml_losses.MultiSimilarityLoss(reducer=PerAnchorReducer())
    wrapped = dml_losses.ContrastiveLoss(reducer=pml_reducers.PerAnchorReducer())
    assert isinstance(wrapped.reducer.for_sub_loss("pos_loss"), PMLReducer)
