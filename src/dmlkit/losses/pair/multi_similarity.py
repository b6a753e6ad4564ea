"""Multi-similarity loss (Wang et al., 2019), the loss part without its pair mining.

Per anchor: ``(1/alpha) log(1 + sum_P exp(-alpha (s - base))) + (1/beta) log(1 + sum_N exp(beta (s - base)))``,
averaged over all anchors (DRO paper Eq. (2); PML's default ``MeanReducer``; an anchor with
no positive or negative contributes 0 to that half, but still counts in the mean). The MS
paper also mines pairs; in dmlkit (as in PML) that is ``MultiSimilarityMiner``. The cosine
is computed from raw embeddings; other distances follow PML's sign convention.
"""

from __future__ import annotations

import torch

from dmlkit.losses.base import LOSSES
from dmlkit.losses.pair._common import PairBatch, masked_logsumexp
from dmlkit.losses.pair._thresholded import ThresholdedPairLoss


@LOSSES.register("multi_similarity")
class MultiSimilarityLoss(ThresholdedPairLoss):
    """Soft positive and negative log-sum-exp terms per anchor, with thresholds at ``base``.

    Wang et al. (2019) Eq. (13); all sums are masked log-sum-exps.
    """

    reductions = ("mean", "sum")

    def compute_pair_loss(self, batch: PairBatch) -> torch.Tensor:
        masks = batch.pair_masks()
        # excess > 0: the pair is farther than the threshold.
        excess = self.excess(batch)
        pos_loss = masked_logsumexp(self.alpha * excess, masks.positive, add_one=True) / self.alpha
        neg_loss = masked_logsumexp(-self.beta * excess, masks.negative, add_one=True) / self.beta
        per_anchor = pos_loss + neg_loss
        return per_anchor.sum() if self.reduction == "sum" else per_anchor.mean()
