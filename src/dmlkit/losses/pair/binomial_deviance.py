"""Binomial deviance loss (Yi et al., 2014), the pairwise base loss L_B of the DRO paper.

Per pair, with cosine similarity ``s`` and threshold ``base`` (the DRO paper's lambda):

* positive: ``log(1 + exp(-alpha (s - base)))``
* negative: ``log(1 + exp( beta (s - base)))``

Yi et al. write the negative scale as ``alpha * C`` with cost ``C = 25``; with ``alpha = 2``
that is ``beta = 50``, the defaults here (also MS's ``alpha, beta``, DRO Sec. 4.2.1 lambda
= 0.5). Yi et al. weight positives by ``1/n_pos`` and negatives by ``1/n_neg``; dmlkit's
default ``reduction="mean"`` does exactly that (mean over positive pairs + mean over negative
pairs). PML has no binomial deviance loss. With DRO weights (a weighted PairSelection or
``weights=``) the loss is ``sum(weight * term)`` with no further normalisation.
"""

from __future__ import annotations

import torch

from dmlkit.losses.base import LOSSES
from dmlkit.losses.logsumexp import log1p_exp
from dmlkit.losses.pair._thresholded import ThresholdedPairLoss
from dmlkit.losses.pair.batch import PairBatch
from dmlkit.losses.pair.terms import weighted_sum


@LOSSES.register("binomial_deviance")
class BinomialDevianceLoss(ThresholdedPairLoss):
    """``softplus(-alpha (s_ap - base))`` per positive and ``softplus(beta (s_an - base))`` per negative pair.

    Yi et al. (2014) Eq. (5); DRO paper Sec. 4 (L_B with threshold lambda = ``base``). The
    cosine is computed from raw embeddings. For a distance ``d`` the sign flips:
    ``softplus(alpha (d - base))`` and ``softplus(-beta (d - base))``.
    """

    reductions = ("mean", "mean_nonzero", "sum")
    supports_weights = True
    reduces_terms = True

    def compute_pair_loss(self, batch: PairBatch) -> torch.Tensor:
        masks = batch.pair_masks()
        # excess = how far a pair is beyond the threshold in the "farther" direction.
        excess = self.excess(batch)
        pos_terms = log1p_exp(self.alpha * excess)
        neg_terms = log1p_exp(-self.beta * excess)
        if masks.weighted:
            return weighted_sum(pos_terms, masks.positive, masks.positive_weight) + weighted_sum(
                neg_terms, masks.negative, masks.negative_weight
            )
        return self.reduce("loss", pos_terms, masks.positive, batch, "pos_pair") + self.reduce(
            "loss", neg_terms, masks.negative, batch, "neg_pair"
        )

