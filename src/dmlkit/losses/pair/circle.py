"""Circle loss (Sun et al., 2020), Eq. (4) with the self-paced weights of Eq. (5).

``log(1 + sum_n e^{gamma a_n (s_n - Delta_n)} sum_p e^{-gamma a_p (s_p - Delta_p)})`` per anchor,
with ``a_p = [1 + m - s_p]_+``, ``a_n = [s_n + m]_+``, ``Delta_p = 1 - m``, ``Delta_n = m``. The
weights ``a_p``, ``a_n`` are held constant in the gradient (the paper's Sec. 3.2 and PML).

PML vs paper: none in the value. PML's defaults (``m=0.4, gamma=80``, the paper's fine-grained
retrieval setting), cosine similarity, and its reduction (``AvgNonZeroReducer`` over anchors; an
anchor without a positive or a negative gives 0) are kept.

float16 batches: the cosine matrix is computed in float16 as PML's distance computes it (its rounding,
times ``gamma``, decides the loss's last bits in PML's float16 test), the rest in float32
(:func:`~dmlkit.losses.pair.terms.in_input_precision`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dmlkit.core.validation import Interval
from dmlkit.distances import BaseDistance, CosineSimilarity
from dmlkit.losses.base import LOSSES, zero_loss
from dmlkit.losses.logsumexp import masked_logsumexp
from dmlkit.losses.pair.base import PairLoss
from dmlkit.losses.pair.batch import PairBatch
from dmlkit.losses.pair.terms import Pairwise, count_divisor, in_input_precision, reduces_from_counts, require_orientation


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
        valid = pos.any(1) & neg.any(1)  # anchors with both kinds of pairs; none: a loss of 0 (PML)
        if not reduces_from_counts(self.reducer):  # the terms themselves go to the reducer: autograd
            if not bool(valid.any()):
                return zero_loss(batch.embeddings, batch.references)
            s = in_input_precision(self.distance.matrix(batch.embeddings, batch.references), self.distance, batch)
            slope = self._slopes(s.detach(), pos)
            logits = slope * self._centred(s, pos)
            total = masked_logsumexp(logits, pos, dim=1) + masked_logsumexp(logits, neg, dim=1)
            total = torch.where(valid, total, total.new_zeros(()))
            return self.reducer(torch.where(valid, F.softplus(total), total.new_zeros(())))
        pairs = Pairwise(self.distance, batch.embeddings, batch.references, batch.same_set)
        with torch.no_grad():
            mat = in_input_precision(pairs.mat, self.distance, batch)
            slope = self._slopes(mat, pos)  # d(logit)/ds, the weights held constant
            logits = slope * self._centred(mat, pos)
            exps, totals, shifts = [], [], []
            for group in (pos, neg):  # softmax within the positives and within the negatives
                shift = logits.masked_fill(~group, float("-inf")).amax(1, keepdim=True).nan_to_num_(0.0, 0.0, 0.0)
                e = torch.exp(logits - shift).masked_fill_(~group, 0.0)
                exps.append(e)
                totals.append(e.sum(1, keepdim=True))
                shifts.append(shift)
            valid = valid[:, None]
            total = torch.where(valid, totals[0].log() + totals[1].log() + shifts[0] + shifts[1], 0.0)
            terms = torch.where(valid, F.softplus(total), 0.0).squeeze(1)
            divisor = count_divisor(self.reducer, terms.numel(), (terms > 0).sum())
            weight = torch.where(valid, torch.sigmoid(total), 0.0) / divisor
            tiny = torch.finfo(totals[0].dtype).tiny  # an anchor without positives (or negatives): 0 / tiny = 0
            softmax = exps[0] / totals[0].clamp_min(tiny) + exps[1] / totals[1].clamp_min(tiny)
            grad = softmax.mul_(slope).mul_(weight)
        return pairs.attach(terms.sum() / divisor, grad)

    def _centred(self, s: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """``s - Delta_p`` on positives, ``s - Delta_n`` elsewhere (in ``s``'s dtype)."""
        return torch.where(pos, s - self.delta_p, s - self.delta_n)

    def _slopes(self, s: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """``-gamma a_p`` on positives, ``gamma a_n`` elsewhere (Eq. (5)'s weights, no gradient)."""
        return torch.where(pos, -self.gamma * (self.op - s).clamp_min(0.0), self.gamma * (s - self.on).clamp_min(0.0))
