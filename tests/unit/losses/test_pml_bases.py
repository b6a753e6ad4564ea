"""PML's base and wrapper names: subclassing them PML's way works, and isinstance sees dmlkit's classes."""

import pytest
import torch

import dmlkit.losses as dl
from dmlkit.losses.reducers import SumReducer
from dmlkit.losses.regularizers import LpRegularizer
from dmlkit.memory import CrossBatchMemory

X = torch.randn(12, 4, generator=torch.Generator().manual_seed(1))
Y = torch.arange(12) // 3


class MeanNorm(dl.BaseMetricLossFunction):
    """A PML-style custom loss: per-element terms handed to the reducer."""

    def compute_loss(self, embeddings, labels, indices_tuple, ref_emb, ref_labels):
        return {"loss": {"losses": embeddings.norm(dim=1), "indices": None, "reduction_type": "element"}}


class PositiveDistance(dl.GenericPairLoss):
    def __init__(self, **kwargs):
        super().__init__(mat_based_loss=False, **kwargs)

    def _compute_loss(self, pos_pairs, neg_pairs, indices_tuple):
        return {"loss": {"losses": pos_pairs, "indices": indices_tuple[:2], "reduction_type": "pos_pair"}}


class MaskedDistance(dl.GenericPairLoss):
    def __init__(self, **kwargs):
        super().__init__(mat_based_loss=True, **kwargs)

    def _compute_loss(self, mat, pos_mask, neg_mask):
        return {"loss": {"losses": (mat * pos_mask).sum() / pos_mask.sum(), "indices": None,
                         "reduction_type": "already_reduced"}}


def test_pml_style_subclass_reduces_and_regularizes():
    assert torch.allclose(MeanNorm()(X, Y), X.norm(dim=1).mean())
    assert torch.allclose(MeanNorm(reducer=SumReducer())(X, Y), X.norm(dim=1).sum())
    assert torch.allclose(MeanNorm(embedding_regularizer=LpRegularizer())(X, Y), 2 * X.norm(dim=1).mean())


def test_generic_pair_loss_hands_over_pairs_and_masks():
    x = torch.nn.functional.normalize(X)
    d = torch.cdist(x, x)
    same = (Y[:, None] == Y[None, :]) & ~torch.eye(12, dtype=torch.bool)
    assert torch.allclose(PositiveDistance()(X, Y), d[same].mean(), atol=1e-5)
    assert torch.allclose(MaskedDistance()(X, Y), d[same].mean(), atol=1e-5)
    triplets = (torch.tensor([0, 3]), torch.tensor([1, 4]), torch.tensor([5, 9]))
    assert torch.allclose(PositiveDistance()(X, Y, triplets), (d[0, 1] + d[3, 4]) / 2, atol=1e-5)
    assert float(PositiveDistance()(X, torch.arange(12))) == 0.0  # no pairs: PML's zero losses


def test_isinstance_sees_dmlkit_classes_by_role():
    contrastive, proxy_anchor = dl.ContrastiveLoss(), dl.ProxyAnchorLoss(3, 4)
    assert isinstance(contrastive, dl.BaseMetricLossFunction) and isinstance(proxy_anchor, dl.BaseMetricLossFunction)
    assert isinstance(contrastive, dl.GenericPairLoss) and not isinstance(proxy_anchor, dl.GenericPairLoss)
    assert isinstance(contrastive, dl.EmbeddingRegularizerMixin)
    assert isinstance(proxy_anchor, dl.WeightRegularizerMixin) and not isinstance(contrastive, dl.WeightRegularizerMixin)
    assert issubclass(dl.ContrastiveLoss, dl.GenericPairLoss)
    assert isinstance(CrossBatchMemory(dl.ContrastiveLoss(), 4, memory_size=8), dl.BaseLossWrapper)
    # a user's own subclass is an ordinary class: dmlkit's losses are not instances of it
    assert not isinstance(contrastive, MeanNorm) and not isinstance(contrastive, PositiveDistance)
    assert isinstance(MeanNorm(), dl.BaseMetricLossFunction) and isinstance(PositiveDistance(), dl.GenericPairLoss)


def test_mixins_work_as_pml_mixins():
    class WithWeights(dl.WeightRegularizerMixin, torch.nn.Module):
        pass

    module = WithWeights(weight_regularizer=lambda w: w.abs().sum(), weight_reg_weight=0.5)
    loss_dict = {}
    module.add_weight_regularization_to_loss_dict(loss_dict, torch.ones(2, 3))
    assert loss_dict["weight_reg_loss"]["losses"] == pytest.approx(3.0)
    assert module.regularization_loss_names() == ["weight_reg_loss"]


def test_base_loss_wrapper_is_abstract():
    class Wrapper(dl.BaseLossWrapper):
        @staticmethod
        def supported_losses():
            return ["ContrastiveLoss"]

        @classmethod
        def check_loss_support(cls, loss_name):
            assert loss_name in cls.supported_losses()

    Wrapper(dl.ContrastiveLoss())
    with pytest.raises(AssertionError):
        Wrapper(dl.NCALoss())
