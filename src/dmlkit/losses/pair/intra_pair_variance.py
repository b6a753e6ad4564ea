"""Intra-pair variance loss (Yu & Tao, "Deep Metric Learning with Tuplet Margin Loss", ICCV 2019, Eq. (5)).

With ``mu+`` / ``mu-`` the mean similarity of the positive / negative pairs:
``L = mean_{ap} [(1 - eps+) mu+ - s_ap]_+^2 + mean_{an} [s_an - (1 + eps-) mu-]_+^2``: pairs far
below (above) their set's mean are pulled towards it. Both means are part of the graph, as in
PML. For a distance instead of a similarity the roles flip (``[d_ap - (1 + eps+) mu+]_+^2`` and
``[(1 - eps-) mu- - d_an]_+^2``), as in PML. Default: cosine similarity, mean over pairs.
"""

from __future__ import annotations

import torch

from dmlkit.core.validation import Interval
from dmlkit.distances import BaseDistance, CosineSimilarity
from dmlkit.losses.base import LOSSES
from dmlkit.losses.pair.base import PairLoss
from dmlkit.losses.pair.batch import PairBatch
from dmlkit.losses.pair.terms import Pairwise


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
        # the two-set product even within the batch: a mined tuple gives bit-identical values with and
        # without ref_emb=embeddings (PML's own test compares them exactly)
        pairs = Pairwise(self.distance, batch.embeddings, batch.references, same_set=False)
        similarity = self.distance.is_inverted
        value_p, coef_p = self._half(pairs.mat, masks.positive, self.pos_eps, pulls_up=similarity)
        value_n, coef_n = self._half(pairs.mat, masks.negative, self.neg_eps, pulls_up=not similarity)
        return pairs.attach(value_p + value_n, coef_p.add_(coef_n))

    def _half(self, mat: torch.Tensor, mask: torch.Tensor, eps: float, pulls_up: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """``sum g^2 / k`` over ``mask`` and its derivative w.r.t. ``mat``, ``g = [(1 - eps) mu - v]_+`` (``pulls_up``)
        or ``[v - (1 + eps) mu]_+``, ``mu`` the mask's mean, ``k`` the reducer's divisor.

        With ``n`` selected pairs and ``G = sum g``: ``d/dv_q = (2 / k) ((1 - eps) G / n - g_q)`` (pulls up) or
        ``(2 / k) (g_q - (1 + eps) G / n)``, on the mask (``mu`` depends on every selected ``v``).
        """
        selected = mask.to(mat.dtype)
        count = selected.sum()
        mean = (mat * selected).sum() / count.clamp_min(1.0)
        gap = (1.0 - eps) * mean - mat if pulls_up else mat - (1.0 + eps) * mean
        g = gap.clamp_min_(0.0).mul_(selected)
        total = g.sum()
        divisor = self.reducer.divisor(count, (g > 0).sum()).to(mat.dtype).clamp_min(1.0)
        value = g.square().sum() / divisor
        shared = total / count.clamp_min(1.0) * ((1.0 - eps) if pulls_up else (1.0 + eps))
        coefficient = (shared - g) if pulls_up else (g - shared)
        return value, coefficient.mul_(selected).mul_(2.0 / divisor)
