"""PML's idiom with dmlkit's own miners: ``loss(emb, labels, miner(emb, labels))`` for every registered
loss that takes pairs, with every registered miner; the selection passed positionally as indices_tuple
gives the same value as ``pairs=``, and where a combination is refused, the message points to pairs."""

from __future__ import annotations

import inspect

import pytest
import torch

from dmlkit.exceptions import DmlkitError
from dmlkit.losses import LOSSES, create_loss
from dmlkit.losses.pair.base import PairLoss
from dmlkit.mining import MINERS, create_miner, list_miners


def pair_losses() -> list[str]:
    """Registered losses that take pairs (a ``pairs=`` keyword), built with their defaults."""
    names = []
    for name in LOSSES.names():
        cls = LOSSES.get(name)
        takes_pairs = isinstance(cls, type) and (issubclass(cls, PairLoss)
                                                 or "pairs" in inspect.signature(cls.forward).parameters)
        if takes_pairs:
            names.append(name)
    return names


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
    loss = create_loss(loss_name)
    try:
        expected = loss(x, labels, pairs=selection)
    except DmlkitError as err:  # a combination the loss cannot take: the same refusal both ways
        with pytest.raises(type(err)) as positional:
            loss(x, labels, selection)
        assert "pairs" in str(positional.value)
        return
    got = loss(x, labels, selection)
    assert torch.equal(got, expected)
    assert torch.isfinite(got)
