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
from dmlkit.losses.logsumexp import softmax_with_one
from dmlkit.losses.pair._thresholded import ThresholdedPairLoss
from dmlkit.losses.pair.batch import PairBatch
from dmlkit.losses.pair.terms import Pairwise


@LOSSES.register("multi_similarity")
class MultiSimilarityLoss(ThresholdedPairLoss):
    """Soft positive and negative log-sum-exp terms per anchor, with thresholds at ``base``.

    Wang et al. (2019) Eq. (13); all sums are masked log-sum-exps.
    """

    reductions = ("mean", "sum")

    def compute_pair_loss(self, batch: PairBatch) -> torch.Tensor:
        not_pos, not_neg = batch.excluded_masks()
        pairs = Pairwise(self.distance, batch.embeddings, batch.references, batch.same_set)
        # excess = sign (mat - base) > 0: the pair is farther than the threshold.
        sign = -1.0 if self.distance.is_inverted else 1.0
        pos_logits = (pairs.mat - self.base).mul_(sign * self.alpha).masked_fill_(not_pos, float("-inf"))
        neg_logits = (pairs.mat - self.base).mul_(-sign * self.beta).masked_fill_(not_neg, float("-inf"))
        pos_lse, pos_soft = softmax_with_one(pos_logits)
        neg_lse, neg_soft = softmax_with_one(neg_logits)
        scale = 1.0 / self.reducer.divisor(pos_lse.shape[0], pos_lse.shape[0])  # mean over anchors, or sum
        value = (pos_lse.sum() / self.alpha + neg_lse.sum() / self.beta) * scale
        # d(pos_lse / alpha)/d(excess) = pos_soft; d(neg_lse / beta)/d(excess) = -neg_soft.
        return pairs.attach(value, pos_soft.sub_(neg_soft).mul_(sign * scale))
