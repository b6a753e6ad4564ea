"""Contrastive loss: positives pulled within ``pos_margin``, negatives pushed past ``neg_margin``.

Hadsell et al. (2006); with a positive margin, the generalized contrastive loss of Wu et al.
(2017) / ASAP Sec. 3 (``(iota_{y,y'} (d - beta) + alpha)_+``). ASAP's two variants are both
settings of this class:

* **C1** (Hadsell): ``ContrastiveLoss(pos_margin=0, neg_margin=m)``;
* **C2** (Wu et al.): ``ContrastiveLoss(pos_margin=m_pos, neg_margin=m_neg)``.

Paper vs PML: Hadsell squares both hinges and sums over pairs; PML (and ASAP, which ran on
PML) uses the plain hinges, averaged over the non-zero positive terms plus the average over
the non-zero negative terms. dmlkit follows PML by default (``reduction="mean_nonzero"``);
``"mean"`` averages over all selected pairs and ``"sum"`` sums. Distance default as in PML:
Euclidean between L2-normalised embeddings.
"""

from __future__ import annotations

import torch

from dmlkit._validation import Interval
from dmlkit.distances import BaseDistance, LpDistance
from dmlkit.losses.base import LOSSES
from dmlkit.losses.pair.base import PairLoss
from dmlkit.losses.pair.batch import PairBatch
from dmlkit.losses.pair.terms import Pairwise


@LOSSES.register("contrastive")
class ContrastiveLoss(PairLoss):
    """``[d_ap - pos_margin]_+`` per positive pair plus ``[neg_margin - d_an]_+`` per negative pair.

    Hadsell et al. (2006) Eq. (4) without the squares (PML's form); Wu et al. (2017) Eq. (4)
    when ``pos_margin > 0``. For a similarity (``distance=CosineSimilarity()``) the roles
    flip: ``[pos_margin - s_ap]_+`` and ``[s_an - neg_margin]_+``.
    """

    supports_weights = True
    _repr_keys = ("pos_margin", "neg_margin", "reduction")

    _parameter_constraints = {"pos_margin": [Interval(float)], "neg_margin": [Interval(float)]}

    def __init__(
        self,
        pos_margin: float = 0.0,
        neg_margin: float = 1.0,
        *,
        distance: BaseDistance | None = None,
        miner: object | None = None,
        reduction: str = "mean_nonzero",
        reducer: object | None = None,
        embedding_regularizer: object | None = None,
        embedding_reg_weight: float = 1.0,
    ):
        super().__init__(
            distance=distance, miner=miner, reduction=reduction,
            reducer=reducer,
            embedding_regularizer=embedding_regularizer,
            embedding_reg_weight=embedding_reg_weight,
        )
        self.pos_margin = float(pos_margin)
        self.neg_margin = float(neg_margin)

    def default_distance(self) -> BaseDistance:
        return LpDistance(power=1, normalize_embeddings=True)

    def compute_pair_loss(self, batch: PairBatch) -> torch.Tensor:
        masks = batch.float_masks()
        pairs = Pairwise(self.distance, batch.embeddings, batch.references, batch.same_set)
        mat = pairs.mat
        # Hinges in the measure's own orientation: [d - pos_margin]_+ and [neg_margin - d]_+
        # for a distance, [pos_margin - s]_+ and [s - neg_margin]_+ for a similarity.
        sign = -1.0 if self.distance.is_inverted else 1.0
        if sign > 0 and self.pos_margin <= 0 and self.distance.is_nonnegative:
            # d >= 0, so d - pos_margin needs no hinge.
            pos_terms = mat * masks.positive if self.pos_margin == 0 else (mat - self.pos_margin).mul_(masks.positive)
        else:
            pos_terms = mat - self.pos_margin
            pos_terms = (pos_terms.neg_() if sign < 0 else pos_terms).clamp_min_(0.0).mul_(masks.positive)
        neg_terms = torch.rsub(mat, self.neg_margin)
        neg_terms = (neg_terms.neg_() if sign < 0 else neg_terms).clamp_min_(0.0).mul_(masks.negative)
        if masks.weighted:
            value = (pos_terms * masks.positive_weight).sum() + (neg_terms * masks.negative_weight).sum()
            # d(loss)/d(mat) = sign * (w_p [active positive] - w_n [active negative]).
            coefficient = pos_terms.sign_().mul_(masks.positive_weight)
            coefficient.sub_(neg_terms.sign_().mul_(masks.negative_weight))
            return pairs.attach(value, coefficient.mul_(sign) if sign < 0 else coefficient)
        pos_sum, neg_sum = pos_terms.sum(), neg_terms.sum()
        pos_active, neg_active = pos_terms.sign_(), neg_terms.sign_()
        pos_count = self.reducer.divisor(masks.positive.sum(), pos_active.sum()).clamp_min(1.0)
        neg_count = self.reducer.divisor(masks.negative.sum(), neg_active.sum()).clamp_min(1.0)
        value = pos_sum / pos_count + neg_sum / neg_count
        # d(loss)/d(mat) = sign * ([active positive] / n_pos - [active negative] / n_neg)
        #                = (sign / n_pos) * ([active positive] - (n_pos / n_neg) [active negative]).
        coefficient = pos_active.addcmul_(neg_active, -pos_count / neg_count)
        return pairs.attach(value, coefficient, sign / pos_count)
