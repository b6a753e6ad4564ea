"""Circle loss (Sun et al., 2020), Eq. (4) with the self-paced weights of Eq. (5).

``log(1 + sum_n e^{gamma a_n (s_n - Delta_n)} sum_p e^{-gamma a_p (s_p - Delta_p)})`` per anchor,
with ``a_p = [1 + m - s_p]_+``, ``a_n = [s_n + m]_+``, ``Delta_p = 1 - m``, ``Delta_n = m``. The
weights ``a_p``, ``a_n`` are held constant in the gradient (the paper's Sec. 3.2 and PML).

PML vs paper: none in the value. PML's defaults (``m=0.4, gamma=80``, the paper's fine-grained
retrieval setting), cosine similarity, and its reduction (``AvgNonZeroReducer`` over anchors; an
anchor without a positive or a negative gives 0) are kept.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dmlkit._validation import Interval
from dmlkit.distances import BaseDistance, CosineSimilarity
from dmlkit.losses.base import LOSSES, zero_loss
from dmlkit.losses.logsumexp import masked_logsumexp
from dmlkit.losses.pair.base import PairLoss
from dmlkit.losses.pair.batch import PairBatch
from dmlkit.losses.pair.terms import require_orientation


@LOSSES.register("circle")
class CircleLoss(PairLoss):
    """Circle loss per anchor: ``softplus(LSE_n(gamma a_n (s_n - m)) + LSE_p(-gamma a_p (s_p - 1 + m)))``."""

    reductions = ("mean_nonzero", "mean", "sum", "threshold")
    #: Hands its terms to the reducer itself, so any reducer object applies (PairLoss.reduces_terms).
    reduces_terms = True
    _parameter_constraints = {
        "m": [Interval(float, None, None)],
        "gamma": [Interval(float, 0, None, closed="neither")],
    }
    _repr_keys = ("m", "gamma", "reduction")

    def __init__(
        self, m: float = 0.4, gamma: float = 80, *, distance: BaseDistance | None = None,
        miner: object | None = None, reduction: str = "mean_nonzero", reducer: object | None = None,
        embedding_regularizer: object | None = None, embedding_reg_weight: float = 1.0,
    ):
        super().__init__(
            distance=distance, miner=miner, reduction=reduction, reducer=reducer,
            embedding_regularizer=embedding_regularizer, embedding_reg_weight=embedding_reg_weight,
        )
        require_orientation(self.distance, "CircleLoss", True, "a similarity in [-1, 1] (CosineSimilarity)")
        self.m, self.gamma = float(m), float(gamma)
        # PML's derived attributes: optima O_p, O_n and margins Delta_p, Delta_n.
        self.op, self.on, self.delta_p, self.delta_n = 1 + self.m, -self.m, 1 - self.m, self.m

    def default_distance(self) -> BaseDistance:
        return CosineSimilarity()

    def compute_pair_loss(self, batch: PairBatch) -> torch.Tensor:
        masks = batch.pair_masks()
        pos, neg = masks.positive, masks.negative
        valid = pos.any(1) & neg.any(1)
        if not valid.any():
            return zero_loss(batch.embeddings, batch.references)
        s = self.distance.matrix(batch.embeddings, batch.references)
        detached = s.detach()
        positive = -self.gamma * (self.op - detached).clamp_min(0.0) * (s - self.delta_p)
        negative = self.gamma * (detached - self.on).clamp_min(0.0) * (s - self.delta_n)
        logits = torch.where(pos, positive, negative)
        total = masked_logsumexp(logits, pos, dim=1) + masked_logsumexp(logits, neg, dim=1)
        total = torch.where(valid, total, total.new_zeros(()))
        terms = torch.where(valid, F.softplus(total), total.new_zeros(()))
        return self.reducer(terms)
