"""Lifted structure losses: the original (Oh Song et al., 2016) and the generalized one
(Hermans et al., 2017, p. 4).

Both use masked log-sum-exps over dense ``[B, R]`` matrices, so memory and time are
``O(B R)``; PML's lifted structure loss builds a ``[num_pos_pairs, num_neg_pairs]`` matrix.

Paper vs PML: PML (dmlkit's default) uses plain distances and ``neg_margin``/``pos_margin``
thresholds; Oh Song et al. have ``pos_margin = 0``. With references other than the batch
(cross-batch memory, proxies), a positive reference has no negatives of its own in the
anchor-by-reference matrix, so dmlkit uses only the anchor's negatives there (PML indexes
anchor rows with reference indices in that case).
"""

from __future__ import annotations

import torch

from dmlkit.core.validation import Interval
from dmlkit.distances import BaseDistance, LpDistance
from dmlkit.losses.base import LOSSES
from dmlkit.losses.logsumexp import masked_logsumexp, softmax_rows
from dmlkit.losses.pair.base import PairLoss
from dmlkit.losses.pair.batch import PairBatch
from dmlkit.losses.pair.terms import Pairwise, dissimilarity, oriented


class _LiftedBase(PairLoss):
    _repr_keys = ("neg_margin", "pos_margin", "reduction")

    _parameter_constraints = {"neg_margin": [Interval(float)], "pos_margin": [Interval(float)]}

    def __init__(self, neg_margin, pos_margin, *, distance, miner, reduction, reducer, embedding_regularizer,
                 embedding_reg_weight):
        super().__init__(
            distance=distance, miner=miner, reduction=reduction,
            reducer=reducer,
            embedding_regularizer=embedding_regularizer,
            embedding_reg_weight=embedding_reg_weight,
        )
        self.neg_margin = float(neg_margin)
        self.pos_margin = float(pos_margin)

    def default_distance(self) -> BaseDistance:
        return LpDistance(power=1, normalize_embeddings=True)

    def _margins(self, batch: PairBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """``(d - pos_margin, neg_margin - d)`` oriented so that larger is worse, both ``[B, R]``."""
        dis = dissimilarity(self.distance.matrix(batch.embeddings, batch.references), self.distance)
        return dis - oriented(self.pos_margin, self.distance), oriented(self.neg_margin, self.distance) - dis


@LOSSES.register("lifted_structure")
class LiftedStructureLoss(_LiftedBase):
    """``1/2 [log(sum_{N(a)} e^{m - d_an} + sum_{N(p)} e^{m - d_pn}) + d_ap]_+^2`` per positive pair.

    Oh Song et al. (2016) Eq. (4); averaged over positive pairs (``reduction="mean"``, the
    paper's ``1 / (2|P|)`` and PML's). A pair none of whose samples has a negative has an
    empty sum (``log 0 = -inf``) and contributes 0.
    """

    reductions = ("mean", "mean_nonzero", "sum", "threshold")
    reduces_terms = True

    def __init__(
        self,
        neg_margin: float = 1.0,
        pos_margin: float = 0.0,
        *,
        distance: BaseDistance | None = None,
        miner: object | None = None,
        reduction: str = "mean",
        reducer: object | None = None,
        embedding_regularizer: object | None = None,
        embedding_reg_weight: float = 1.0,
    ):
        super().__init__(
            neg_margin, pos_margin, distance=distance, miner=miner, reduction=reduction,
            reducer=reducer,
            embedding_regularizer=embedding_regularizer,
            embedding_reg_weight=embedding_reg_weight,
        )

    def compute_pair_loss(self, batch: PairBatch) -> torch.Tensor:
        masks = batch.pair_masks()
        if batch.same_set and not masks.weighted and self.reduces_from_counts():
            return self._closed_form(batch, masks)
        pos_excess, neg_excess = self._margins(batch)
        per_anchor = masked_logsumexp(neg_excess, masks.negative)  # [B], -inf without negatives
        has_neg = masks.negative.any(1)
        # The pair (a, p) pools the negatives of anchor rows a and p. With references, as in PML,
        # reference p pools the negatives of anchor row p when there is one (and a = p counts once).
        num, num_refs = pos_excess.shape
        col_lse, col_has = per_anchor, has_neg
        if not batch.same_set:
            shared = min(num, num_refs)
            col_lse = per_anchor.new_full((num_refs,), float("-inf"))
            col_lse[:shared] = per_anchor[:shared]
            col_has = torch.zeros(num_refs, dtype=torch.bool, device=has_neg.device)
            col_has[:shared] = has_neg[:shared]
        shape = pos_excess.shape
        both = torch.stack((per_anchor.unsqueeze(1).expand(shape), col_lse.unsqueeze(0).expand(shape)), -1)
        second = col_has.unsqueeze(0).expand(shape)
        if not batch.same_set:
            rows = torch.arange(num, device=second.device).unsqueeze(1)
            second = second & (rows != torch.arange(num_refs, device=second.device).unsqueeze(0))
        valid = torch.stack((has_neg.unsqueeze(1).expand(shape), second), -1)
        neg_part = masked_logsumexp(both, valid)
        terms = (neg_part + pos_excess).clamp_min(0.0).square() / 2
        return self.reduce("loss", terms, masks.positive, batch, "pos_pair")

    def _closed_form(self, batch: PairBatch, masks) -> torch.Tensor:
        """The batch against itself, reduced from counts: value and ``d loss / d matrix`` without autograd.

        With ``L_a = log sum_{N(a)} e^{m - d_an}`` (softmax ``S_an`` over the row), ``J_ap = log(e^{L_a} + e^{L_p})
        + d_ap - pos_margin`` and the pair coefficient ``c_ap = [J_ap]_+ / divisor`` on positive pairs,
        ``d loss / d d_ap = c_ap`` and ``d loss / d d_an = -g_a S_an`` with ``g_a = sum_p c_ap e^{L_a - NP_ap}
        + sum_p c_pa e^{L_a - NP_pa}`` (``NP`` the pair's pooled log-sum).
        """
        pairs = Pairwise(self.distance, batch.embeddings, batch.references, True)
        dis = dissimilarity(pairs.mat, self.distance)
        neg_logits = torch.rsub(dis, oriented(self.neg_margin, self.distance)).masked_fill_(~masks.negative,
                                                                                           float("-inf"))
        per_anchor, softmax = softmax_rows(neg_logits)  # -inf and a zero row without negatives
        neg_part = torch.logaddexp(per_anchor[:, None], per_anchor[None, :])  # -inf when neither has one
        hinge = (dis - oriented(self.pos_margin, self.distance)).add_(neg_part).clamp_min_(0.0).mul_(masks.positive)
        reducer = self.reducer.for_sub_loss("loss")
        divisor = torch.as_tensor(reducer.divisor(masks.positive.sum(), hinge.sign().sum())).clamp_min(1)
        value = hinge.square().sum().div_(2 * divisor)
        coefficient = hinge.div_(divisor)  # c_ap
        row_share = (per_anchor[:, None] - neg_part).exp_().nan_to_num_(0.0).mul_(coefficient)
        pooled = row_share.sum(1).add_(coefficient.sub(row_share).sum(0))  # g_a: a as the pair's first or second
        return pairs.attach(value, dissimilarity(coefficient.addcmul_(softmax, pooled[:, None], value=-1.0),
                                                 self.distance))


@LOSSES.register("generalized_lifted_structure")
class GeneralizedLiftedStructureLoss(_LiftedBase):
    """``[log sum_{P(a)} e^{d_ap - pos_margin} + log sum_{N(a)} e^{neg_margin - d_an}]_+`` per anchor.

    Hermans et al. (2017) p. 4. Averaged over all ``B`` anchors as PML does; an anchor
    without positives (or without negatives) keeps the other half alone, as in PML (the empty
    log-sum counts 0, not ``-inf``).
    """

    reductions = ("mean", "sum")

    def __init__(
        self,
        neg_margin: float = 1.0,
        pos_margin: float = 0.0,
        *,
        distance: BaseDistance | None = None,
        miner: object | None = None,
        reduction: str = "mean",
        reducer: object | None = None,
        embedding_regularizer: object | None = None,
        embedding_reg_weight: float = 1.0,
    ):
        super().__init__(
            neg_margin, pos_margin, distance=distance, miner=miner, reduction=reduction,
            reducer=reducer,
            embedding_regularizer=embedding_regularizer,
            embedding_reg_weight=embedding_reg_weight,
        )

    def compute_pair_loss(self, batch: PairBatch) -> torch.Tensor:
        not_pos, not_neg = batch.excluded_masks()
        pairs = Pairwise(self.distance, batch.embeddings, batch.references, batch.same_set)
        # pos_excess = sign (mat - pos_margin), neg_excess = sign (neg_margin - mat).
        sign = -1.0 if self.distance.is_inverted else 1.0
        pos_logits = (pairs.mat - self.pos_margin).mul_(sign).masked_fill_(not_pos, float("-inf"))
        neg_logits = torch.rsub(pairs.mat, self.neg_margin).mul_(sign).masked_fill_(not_neg, float("-inf"))
        pos_lse, pos_soft = softmax_rows(pos_logits)
        neg_lse, neg_soft = softmax_rows(neg_logits)
        # An empty half (no positive or no negative) has a -inf log-sum: it counts 0 (PML's rule).
        empty = float("-inf")
        per_anchor = (pos_lse.masked_fill_(pos_lse == empty, 0.0) + neg_lse.masked_fill_(neg_lse == empty, 0.0)).clamp_min_(0.0)
        scale = 1.0 / self.reducer.divisor(per_anchor.shape[0], per_anchor.shape[0])  # mean over anchors, or sum
        value = per_anchor.sum() * scale
        # d(loss)/d(mat) = sign [hinge active] (softmax_P - softmax_N) * scale.
        active = torch.sign(per_anchor).mul_(sign * scale).unsqueeze(1)
        return pairs.attach(value, pos_soft.sub_(neg_soft).mul_(active))
