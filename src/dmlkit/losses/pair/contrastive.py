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

from dmlkit._validation import Interval, validate_params
from dmlkit.distances import BaseDistance, LpDistance
from dmlkit.losses.base import LOSSES
from dmlkit.losses.pair._common import PairBatch, PairLoss, attach_gradient, dissimilarity, oriented, pairwise


@LOSSES.register("contrastive")
class ContrastiveLoss(PairLoss):
    """``[d_ap - pos_margin]_+`` per positive pair plus ``[neg_margin - d_an]_+`` per negative pair.

    Hadsell et al. (2006) Eq. (4) without the squares (PML's form); Wu et al. (2017) Eq. (4)
    when ``pos_margin > 0``. For a similarity (``distance=CosineSimilarity()``) the roles
    flip: ``[pos_margin - s_ap]_+`` and ``[s_an - neg_margin]_+``.
    """

    supports_weights = True
    _repr_keys = ("pos_margin", "neg_margin", "reduction")

    def __init__(
        self,
        pos_margin: float = 0.0,
        neg_margin: float = 1.0,
        *,
        distance: BaseDistance | None = None,
        miner: object | None = None,
        reduction: str = "mean_nonzero",
    ):
        super().__init__(distance=distance, miner=miner, reduction=reduction)
        validate_params(
            type(self).__name__,
            {"pos_margin": pos_margin, "neg_margin": neg_margin},
            {"pos_margin": [Interval(float)], "neg_margin": [Interval(float)]},
        )
        self.pos_margin = float(pos_margin)
        self.neg_margin = float(neg_margin)

    def default_distance(self) -> BaseDistance:
        return LpDistance(power=1, normalize_embeddings=True)

    def compute_pair_loss(self, batch: PairBatch) -> torch.Tensor:
        masks = batch.pair_masks()
        pos, neg = masks.positive, masks.negative
        dis = dissimilarity(pairwise(self.distance, batch.embeddings, batch.references), self.distance)
        pos_margin = oriented(self.pos_margin, self.distance)
        neg_margin = oriented(self.neg_margin, self.distance)
        with torch.no_grad():
            # Float masks and arithmetic only: bool kernels and torch.where are slow on CPU.
            d = dis.detach()
            pos_f, neg_f = pos.to(d.dtype), neg.to(d.dtype)
            # Hinge of every pair in its own role: [d - pos_margin]_+ or [neg_margin - d]_+.
            terms = ((d - pos_margin) * pos_f + (neg_margin - d) * neg_f).clamp_min_(0.0)
            active = torch.sign(terms)
            if masks.weighted:
                pos_w, neg_w = masks.positive_weight * pos_f, masks.negative_weight * neg_f
            else:
                if self.reduction == "sum":
                    pos_count = neg_count = d.new_ones(())
                elif self.reduction == "mean":
                    pos_count, neg_count = pos_f.sum(), neg_f.sum()
                else:
                    pos_count, neg_count = (active * pos_f).sum(), (active * neg_f).sum()
                pos_w = pos_f / pos_count.clamp_min(1)
                neg_w = neg_f / neg_count.clamp_min(1)
            value = (terms * (pos_w + neg_w)).sum()
            # d(loss)/d(dis): +weight on active positives, -weight on active negatives.
            coefficient = active * (pos_w - neg_w)
        return attach_gradient(value, (dis, coefficient))
