"""Multi-similarity loss (Wang et al., 2019), the loss part without its pair mining.

Per anchor: ``(1/alpha) log(1 + sum_P exp(-alpha (s - base))) + (1/beta) log(1 + sum_N exp(beta (s - base)))``,
averaged over all anchors (DRO paper Eq. (2); PML's default ``MeanReducer``; an anchor with
no positive or negative contributes 0 to that half, but still counts in the mean). The MS
paper also mines pairs; in dmlkit (as in PML) that is ``MultiSimilarityMiner``. The cosine
is computed from raw embeddings; other distances follow PML's sign convention.
"""

from __future__ import annotations

import torch

from dmlkit._validation import Interval, validate_params
from dmlkit.distances import BaseDistance, CosineSimilarity
from dmlkit.losses.base import LOSSES
from dmlkit.losses.pair._common import pairwise, PairBatch, PairLoss, dissimilarity, masked_logsumexp, oriented


@LOSSES.register("multi_similarity")
class MultiSimilarityLoss(PairLoss):
    """Soft positive and negative log-sum-exp terms per anchor, with thresholds at ``base``.

    Wang et al. (2019) Eq. (13); all sums are masked log-sum-exps.
    """

    reductions = ("mean", "sum")
    _repr_keys = ("alpha", "beta", "base", "reduction")

    def __init__(
        self,
        alpha: float = 2.0,
        beta: float = 50.0,
        base: float = 0.5,
        *,
        distance: BaseDistance | None = None,
        miner: object | None = None,
        reduction: str = "mean",
    ):
        super().__init__(distance=distance, miner=miner, reduction=reduction)
        validate_params(
            type(self).__name__,
            {"alpha": alpha, "beta": beta, "base": base},
            {
                "alpha": [Interval(float, 0, None, closed="neither")],
                "beta": [Interval(float, 0, None, closed="neither")],
                "base": [Interval(float)],
            },
        )
        self.alpha = float(alpha)
        self.beta = float(beta)
        self.base = float(base)

    def default_distance(self) -> BaseDistance:
        return CosineSimilarity()

    def compute_pair_loss(self, batch: PairBatch) -> torch.Tensor:
        masks = batch.pair_masks()
        # excess > 0: the pair is farther than the threshold.
        excess = dissimilarity(pairwise(self.distance, batch.embeddings, batch.references), self.distance) - oriented(
            self.base, self.distance
        )
        pos_loss = masked_logsumexp(self.alpha * excess, masks.positive, add_one=True) / self.alpha
        neg_loss = masked_logsumexp(-self.beta * excess, masks.negative, add_one=True) / self.beta
        per_anchor = pos_loss + neg_loss
        return per_anchor.sum() if self.reduction == "sum" else per_anchor.mean()
