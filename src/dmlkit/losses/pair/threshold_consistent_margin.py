"""Threshold-consistent margin loss (Zhang et al., "Threshold-Consistent Margin Loss for Open-World
Deep Metric Learning", ICLR 2024, arXiv:2307.04047).

Eq. (5): ``L_TCM = lambda+ * sum_{s_ap <= m+} (m+ - s_ap) / #{s_ap <= m+}
+ lambda- * sum_{s_an >= m-} (s_an - m-) / #{s_an >= m-}`` on cosine similarities; a regulariser
meant to be added to a base loss (``MultipleLosses``). Each half is the hinge averaged over its
active pairs, i.e. ``reduction="mean_nonzero"`` (the default; a pair exactly at its margin is
left out of the count, where the paper counts it with a zero term). PML indexes ``ref_emb`` pairs
into the batch itself; dmlkit compares the batch with ``ref_emb``.
"""

from __future__ import annotations

import torch

from dmlkit.core.validation import Interval
from dmlkit.distances import BaseDistance, CosineSimilarity
from dmlkit.losses.base import LOSSES
from dmlkit.losses.pair._fixed_distance import require_distance
from dmlkit.losses.pair.base import PairLoss
from dmlkit.losses.pair.batch import PairBatch


@LOSSES.register("threshold_consistent_margin")
class ThresholdConsistentMarginLoss(PairLoss):
    """``lambda_plus * mean[m+ - s_ap]_+ + lambda_minus * mean[s_an - m-]_+`` (Zhang et al. Eq. (5))."""

    _repr_keys = ("lambda_plus", "lambda_minus", "margin_plus", "margin_minus", "reduction")
    _parameter_constraints = {
        "lambda_plus": [Interval(float, 0, None)],
        "lambda_minus": [Interval(float, 0, None)],
        "margin_plus": [Interval(float)],
        "margin_minus": [Interval(float)],
    }

    def __init__(
        self,
        lambda_plus: float = 1.0,
        lambda_minus: float = 1.0,
        margin_plus: float = 0.9,
        margin_minus: float = 0.5,
        *,
        distance: BaseDistance | None = None,
        miner: object | None = None,
        reduction: str = "mean_nonzero",
        reducer: object | None = None,
        embedding_regularizer: object | None = None,
        embedding_reg_weight: float = 1.0,
    ):
        super().__init__(
            distance=distance, miner=miner, reduction=reduction, reducer=reducer,
            embedding_regularizer=embedding_regularizer, embedding_reg_weight=embedding_reg_weight,
        )
        require_distance("ThresholdConsistentMarginLoss", self.distance, CosineSimilarity)
        self.lambda_plus, self.lambda_minus = float(lambda_plus), float(lambda_minus)
        self.margin_plus, self.margin_minus = float(margin_plus), float(margin_minus)

    def default_distance(self) -> BaseDistance:
        return CosineSimilarity()

    def compute_pair_loss(self, batch: PairBatch) -> torch.Tensor:
        masks = batch.pair_masks()
        sim = self.distance.matrix(batch.embeddings, batch.references)
        positive = self.reducer((self.margin_plus - sim).clamp_min(0.0), masks.positive)
        negative = self.reducer((sim - self.margin_minus).clamp_min(0.0), masks.negative)
        return self.lambda_plus * positive + self.lambda_minus * negative


LOSSES.register("tcm")(ThresholdConsistentMarginLoss)
