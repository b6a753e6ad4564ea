"""MultipleLosses: weighted sums with miners per loss, in PML's list and dict forms."""

import pytest
import pytorch_metric_learning.losses as pml
import pytorch_metric_learning.miners as pml_miners
import torch

from dmlkit.exceptions import AssertedParameterError
from dmlkit.losses import ContrastiveLoss, MultipleLosses, NCALoss, TripletMarginLoss
from dmlkit.mining import create_miner

G = torch.Generator().manual_seed(0)
X = torch.randn(24, 8, generator=G)
Y = torch.arange(24) // 4


def test_list_and_dict_forms_are_weighted_sums():
    a, b = ContrastiveLoss(), NCALoss()
    expected = a(X, Y) + 0.3 * b(X, Y)
    assert torch.allclose(MultipleLosses([a, b], weights=[1, 0.3])(X, Y), expected)
    assert torch.allclose(MultipleLosses({"a": a, "b": b}, weights={"a": 1, "b": 0.3})(X, Y), expected)
    assert torch.allclose(MultipleLosses([a, b])(X, Y), a(X, Y) + b(X, Y))


def test_each_loss_uses_its_own_miner_dmlkit_or_pml():
    a, b = ContrastiveLoss(), TripletMarginLoss(0.1)
    ours_miner, pml_miner = create_miner("multi_similarity"), pml_miners.MultiSimilarityMiner()
    for miner in (ours_miner, pml_miner):
        combined = MultipleLosses({"a": a, "b": b}, miners={"b": miner}, weights={"a": 1, "b": 0.5})
        mined = miner(X, Y)
        expected = a(X, Y) + 0.5 * (b(X, Y, mined) if isinstance(mined, tuple) else b(X, Y, pairs=mined))
        assert torch.allclose(combined(X, Y), expected)


def test_agrees_with_pml():
    ours = MultipleLosses([ContrastiveLoss(), TripletMarginLoss(0.1)], weights=[1, 0.23])
    theirs = pml.MultipleLosses([pml.ContrastiveLoss(), pml.TripletMarginLoss(0.1)], weights=[1, 0.23])
    assert torch.allclose(ours(X, Y), theirs(X, Y), rtol=1e-4)


@pytest.mark.parametrize("build", [
    lambda a, b: MultipleLosses({"a": a, "b": b}, weights={"x": 1, "b": 1}),
    lambda a, b: MultipleLosses({"a": a, "b": b}, miners={"x": create_miner("multi_similarity")}),
    lambda a, b: MultipleLosses([a, b], weights=[1]),
    lambda a, b: MultipleLosses([a, b], miners=[None]),
])
def test_mismatched_forms_raise_an_assertion_error(build):
    with pytest.raises(AssertedParameterError, match="parameter of MultipleLosses must be"):
        build(ContrastiveLoss(), NCALoss())


def test_indices_tuple_with_own_miners_is_refused():
    combined = MultipleLosses([ContrastiveLoss()], miners=[create_miner("multi_similarity")])
    with pytest.raises(AssertionError, match="takes no indices_tuple"):
        combined(X, Y, (torch.tensor([0]), torch.tensor([1]), torch.tensor([5])))
