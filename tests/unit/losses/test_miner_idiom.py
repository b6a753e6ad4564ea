"""PML's idiom with dmlkit's own miners: ``loss(emb, labels, miner(emb, labels))`` for every registered
loss that takes pairs, with every registered miner; the selection passed positionally as indices_tuple
gives the same value as ``pairs=``, and where a combination is refused, the message points to pairs."""

from __future__ import annotations

import inspect

import pytest
import torch

from dmlkit.exceptions import DmlkitError
from dmlkit.losses import LOSSES, create_loss
from dmlkit.mining import MINERS, create_miner, list_miners

#: Constructor arguments of the registered losses that have required ones (PML: no defaults).
REQUIRED_ARGS = {"ranked_list": dict(margin=0.4, Tn=10.0), "manifold": dict(l=6, K=4)}


def pair_losses() -> list[str]:
    """Registered losses that take pairs (a ``pairs=`` keyword)."""
    names = []
    for name in LOSSES.names():
        cls = LOSSES.get(name)
        if isinstance(cls, type) and "pairs" in inspect.signature(cls.forward).parameters:
            names.append(name)
    return names


def anchor_weighted_losses() -> list[str]:
    """Registered ranking losses that read PML's ``indices_tuple`` as per-anchor weights (FastAP, Smooth-AP, ...)."""
    return [n for n in LOSSES.names() if getattr(LOSSES.get(n), "takes_anchor_weights", False)]


def build(name: str):
    """A fresh loss (stateful losses such as the dynamic soft margin's histogram start the same each time)."""
    return create_loss(name, **REQUIRED_ARGS.get(name, {}))


def batch():
    g = torch.Generator().manual_seed(0)
    labels = torch.arange(18) % 4  # several of each class: every miner finds something; 18 rows = 6 triplets
    return torch.randn(18, 6, generator=g, dtype=torch.float64), labels


def test_there_are_pair_losses_and_miners_to_check():
    assert {"contrastive", "triplet_margin", "multi_similarity"} <= set(pair_losses())
    assert len(list_miners()) >= 10


@pytest.mark.parametrize("miner_name", sorted(MINERS.names()))
@pytest.mark.parametrize("loss_name", pair_losses())
def test_selection_as_indices_tuple_equals_pairs_keyword(loss_name, miner_name):
    x, labels = batch()
    selection = create_miner(miner_name)(x, labels)
    try:
        expected = build(loss_name)(x, labels, pairs=selection)
    except DmlkitError as err:  # a combination the loss cannot take: the same refusal both ways
        with pytest.raises(type(err)) as positional:
            build(loss_name)(x, labels, selection)
        assert "pairs" in str(positional.value)
        return
    got = build(loss_name)(x, labels, selection)
    assert torch.equal(got, expected)
    assert torch.isfinite(got)


@pytest.mark.parametrize("miner_name", sorted(MINERS.names()))
@pytest.mark.parametrize("loss_name", anchor_weighted_losses())
def test_ranking_losses_take_a_selection_as_its_pml_tuple(loss_name, miner_name):
    """FastAP and Smooth-AP weight anchors by PML's tuple: a dmlkit miner's selection counts as that tuple."""
    x, labels = batch()
    selection = create_miner(miner_name)(x, labels)
    got = build(loss_name)(x, labels, selection)
    expected = build(loss_name)(x, labels, selection.to_indices_tuple())
    assert torch.equal(got, expected) and torch.isfinite(got)


def test_there_are_anchor_weighted_losses_to_check():
    assert {"fastap", "smooth_ap"} <= set(anchor_weighted_losses())
