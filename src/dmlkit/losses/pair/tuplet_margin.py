"""Tuplet margin loss (Yu & Tao, "Deep Metric Learning with Tuplet Margin Loss", ICCV 2019).

Eq. (4): per positive pair ``(a, p)``, ``log(1 + sum_n exp(s (cos theta_an - cos(theta_ap - beta))))``
over the anchor's negative pairs ``(a, n)``, with the slack margin ``beta`` in degrees (PML's
``margin``) and scale ``s``; mean over positive pairs. The paper's intra-pair variance term
(Eq. (5)) is :class:`~dmlkit.losses.pair.intra_pair_variance.IntraPairVarianceLoss`, combined
through ``MultipleLosses``. ``cos(theta - beta)`` is written ``s cos beta + sqrt(1 - s^2) sin beta``
with ``1 - s^2`` kept above ``1e-12`` (a finite gradient at ``s = 1``, where PML's ``acos`` has none).
"""

from __future__ import annotations

import math

import torch

from dmlkit.core.validation import Interval
from dmlkit.distances import BaseDistance, CosineSimilarity
from dmlkit.losses.base import LOSSES, zero_loss
from dmlkit.losses.logsumexp import log1p_sum_exp
from dmlkit.losses.pair._fixed_distance import require_distance
from dmlkit.losses.pair.base import PairLoss
from dmlkit.losses.pair.batch import PairBatch


@LOSSES.register("tuplet_margin")
class TupletMarginLoss(PairLoss):
    """``log(1 + sum_n exp(scale (cos theta_an - cos(theta_ap - margin))))`` per positive pair (Yu & Tao Eq. (4))."""

    reductions = ("mean", "mean_nonzero", "sum")
    _repr_keys = ("margin", "scale", "reduction")
    _parameter_constraints = {"margin": [Interval(float)], "scale": [Interval(float, 0, None, closed="neither")]}

    def __init__(
        self,
        margin: float = 5.73,
        scale: float = 64,
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
        require_distance("TupletMarginLoss", self.distance, CosineSimilarity)
        self.margin = float(margin)
        self.scale = float(scale)

    def default_distance(self) -> BaseDistance:
        return CosineSimilarity()

    def compute_pair_loss(self, batch: PairBatch) -> torch.Tensor:
        masks = batch.pair_masks()
        anchors, positives = masks.positive.nonzero(as_tuple=True)
        if anchors.numel() == 0 or not masks.negative.any():
            return zero_loss(batch.embeddings, batch.references)
        sim = self.distance.matrix(batch.embeddings, batch.references)  # [B, R]
        s_ap = sim[anchors, positives].unsqueeze(1)  # [P, 1]
        beta = math.radians(self.margin)
        shifted = s_ap * math.cos(beta) + (1.0 - s_ap.square()).clamp_min(1e-12).sqrt() * math.sin(beta)
        terms = log1p_sum_exp(self.scale * (sim[anchors] - shifted), masks.negative[anchors], dim=1)
        return self.reducer(terms)
