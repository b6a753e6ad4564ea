"""Intra-pair variance loss (Yu & Tao, "Deep Metric Learning with Tuplet Margin Loss", ICCV 2019, Eq. (5)).

With ``mu+`` / ``mu-`` the mean similarity of the positive / negative pairs:
``L = mean_{ap} [(1 - eps+) mu+ - s_ap]_+^2 + mean_{an} [s_an - (1 + eps-) mu-]_+^2``: pairs far
below (above) their set's mean are pulled towards it. Both means are part of the graph, as in
PML. For a distance instead of a similarity the roles flip (``[d_ap - (1 + eps+) mu+]_+^2`` and
``[(1 - eps-) mu- - d_an]_+^2``), as in PML. Default: cosine similarity, mean over pairs.
"""

from __future__ import annotations

import torch

from dmlkit._validation import Interval
from dmlkit.distances import BaseDistance, CosineSimilarity
from dmlkit.losses.base import LOSSES
from dmlkit.losses.pair.base import PairLoss
from dmlkit.losses.pair.batch import PairBatch


@LOSSES.register("intra_pair_variance")
class IntraPairVarianceLoss(PairLoss):
    """``mean [(1 - pos_eps) mu+ - s_ap]_+^2 + mean [s_an - (1 + neg_eps) mu-]_+^2`` (Yu & Tao Eq. (5))."""

    reductions = ("mean", "mean_nonzero", "sum")
    _repr_keys = ("pos_eps", "neg_eps", "reduction")
    _parameter_constraints = {"pos_eps": [Interval(float)], "neg_eps": [Interval(float)]}

    def __init__(
        self,
        pos_eps: float = 0.01,
        neg_eps: float = 0.01,
        *,
        distance: BaseDistance | None = None,
        miner: object | None = None,
        reduction: str = "mean",
        reducer: object | None = None,
        embedding_regularizer: object | None = None,
        embedding_reg_weight: float = 1.0,
    ):
        super().__init__(
            distance=distance, miner=miner, reduction=reduction, reducer=reducer,
            embedding_regularizer=embedding_regularizer, embedding_reg_weight=embedding_reg_weight,
        )
        self.pos_eps, self.neg_eps = float(pos_eps), float(neg_eps)

    def default_distance(self) -> BaseDistance:
        return CosineSimilarity()

    def compute_pair_loss(self, batch: PairBatch) -> torch.Tensor:
        masks = batch.pair_masks()
        mat = self.distance.matrix(batch.embeddings, batch.references)
        similarity = self.distance.is_inverted
        positive = self._half(mat, masks.positive, self.pos_eps, pulls_up=similarity)
        negative = self._half(mat, masks.negative, self.neg_eps, pulls_up=not similarity)
        return positive + negative

    def _half(self, mat: torch.Tensor, mask: torch.Tensor, eps: float, pulls_up: bool) -> torch.Tensor:
        """``reduce [(1 - eps) mu - v]_+^2`` (``pulls_up``) or ``reduce [v - (1 + eps) mu]_+^2`` over ``mask``."""
        selected = mask.to(mat.dtype)
        mean = (mat * selected).sum() / selected.sum().clamp_min(1.0)
        gap = (1.0 - eps) * mean - mat if pulls_up else mat - (1.0 + eps) * mean
        return self.reducer(gap.clamp_min(0.0).square(), mask)
