"""NT-Xent (Chen et al., 2020, SimCLR Eq. (1)) and supervised contrastive (Khosla et al., 2020, Eq. (2)).

Both are softmax cross-entropies over an anchor's row of similarities divided by a temperature.
NT-Xent gives each positive pair its own softmax against the anchor's negatives only; SupCon
(``L^sup_out``) averages the log-probabilities of an anchor's positives under one softmax over
all its other references. With a distance instead of a similarity the logits are ``-d / T``.

PML vs paper: none in the value. PML's reductions are kept: NT-Xent averages over positive pairs
(``MeanReducer``), SupCon over anchors with ``AvgNonZeroReducer`` (anchors without positives
count 0, as in PML); a batch without both a positive and a negative pair gives a connected 0.
Pairs selected several times (mined triplets sharing a pair) count once, where PML repeats them.
"""

from __future__ import annotations

import torch

from dmlkit.core.validation import Interval
from dmlkit.distances import BaseDistance, CosineSimilarity
from dmlkit.losses.base import LOSSES, zero_loss
from dmlkit.losses.logsumexp import masked_logsumexp
from dmlkit.losses.pair.base import PairLoss
from dmlkit.losses.pair.batch import PairBatch
from dmlkit.losses.pair.terms import Pairwise, count_divisor, reduces_from_counts

ELEMENT_REDUCTIONS = ("mean", "mean_nonzero", "sum", "threshold")


class _TemperatureLoss(PairLoss):
    """Shared constructor of the temperature-scaled softmax losses (cosine by default, PML's)."""

    reductions = ELEMENT_REDUCTIONS
    #: Hands its terms to the reducer itself, so any reducer object applies (PairLoss.reduces_terms).
    reduces_terms = True
    _parameter_constraints = {"temperature": [Interval(float, 0, None, closed="neither")]}
    _repr_keys = ("temperature", "reduction")

    def __init__(
        self, temperature: float, *, distance: BaseDistance | None = None, miner: object | None = None,
        reduction: str | None = None, reducer: object | None = None,
        embedding_regularizer: object | None = None, embedding_reg_weight: float = 1.0,
    ):
        super().__init__(
            distance=distance, miner=miner, reduction=reduction or self.reductions[0], reducer=reducer,
            embedding_regularizer=embedding_regularizer, embedding_reg_weight=embedding_reg_weight,
        )
        self.temperature = float(temperature)

    def default_distance(self) -> BaseDistance:
        return CosineSimilarity()

    def compute_pair_loss(self, batch: PairBatch) -> torch.Tensor:
        masks = batch.pair_masks()
        pos, neg = masks.positive, masks.negative
        contrast = pos.any() & neg.any()  # PML: a loss of 0 without a positive pair and a negative pair
        sign = 1.0 if self.distance.is_inverted else -1.0  # logits: s / T, or -d / T
        if not reduces_from_counts(self.reducer):  # the terms themselves go to the reducer
            if not bool(contrast):
                return zero_loss(batch.embeddings, batch.references)
            mat = self.distance.matrix(batch.embeddings, batch.references)
            terms, selected = self.terms(pos, neg, mat * (sign / self.temperature))
            return self.reducer(terms, selected)
        pairs = Pairwise(self.distance, batch.embeddings, batch.references, batch.same_set)
        with torch.no_grad():
            logits = pairs.mat * (sign / self.temperature)
            # nothing to contrast: no positive pair is kept, so every term and gradient is an exact 0 (no read)
            terms, selected, grad = self.closed_form(pos & contrast, neg, logits)
            if selected is None:
                num_selected, kept = terms.numel(), terms
            else:  # masked, not indexed: no output sized by the data
                num_selected, kept = selected.sum(), terms.masked_fill(~selected, 0.0)
            divisor = count_divisor(self.reducer, num_selected, (kept > 0).sum())
            grad.mul_(sign / self.temperature).div_(divisor)
        return pairs.attach(kept.sum() / divisor, grad)

    def terms(self, pos: torch.Tensor, neg: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(terms, mask)`` the reducer receives, from the pair masks and the logits ``[B, R]``."""
        raise NotImplementedError  # pragma: no cover - interface

    def closed_form(self, pos, neg, logits) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """:meth:`terms` and ``d(sum of the selected terms) / d(logits)`` ``[B, R]``, without autograd."""
        raise NotImplementedError  # pragma: no cover - interface


def _shifted_exp(logits: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(exp(z - m), m)``: ``m [B, 1]`` the row max over ``mask`` (``-inf`` for an empty row),
    the exponentials 0 outside ``mask``."""
    shift = logits.masked_fill(~mask, float("-inf")).amax(1, keepdim=True)
    return torch.exp(logits - shift).masked_fill_(~mask, 0.0), shift


@LOSSES.register("ntxent")
class NTXentLoss(_TemperatureLoss):
    """``-log(e^{s_ap/T} / (e^{s_ap/T} + sum_{n in N(a)} e^{s_an/T}))`` per positive pair (a, p).

    SimCLR Eq. (1) (NT-Xent), with the negatives of each anchor given by the labels (with
    ``SelfSupervisedLoss``: the other samples' views); averaged over the positive pairs.
    """

    def __init__(self, temperature: float = 0.07, **options):
        super().__init__(temperature, **options)

    def terms(self, pos, neg, logits):
        """Pair terms ``[B, R]`` over the positive pairs."""
        negatives = masked_logsumexp(logits, neg, dim=1)  # [B]; -inf for an anchor without negatives
        return torch.logaddexp(logits, negatives[:, None]) - logits, pos

    def closed_form(self, pos, neg, logits):
        """With ``e = exp(z - m)`` and ``D_ap = e_ap + sum_n e_an``: term ``log D_ap + m - z_ap``,
        gradient ``e_ap / D_ap - 1`` on (a, p) and ``e_an sum_p 1 / D_ap`` on (a, n)."""
        exps, shift = _shifted_exp(logits, pos | neg)
        denominator = exps.masked_fill(pos, 0.0).sum(1, keepdim=True) + exps  # D_ap on the positives
        denominator.masked_fill_(~pos, 1.0)
        terms = denominator.log().add_(shift).sub_(logits).masked_fill_(~pos, 0.0)
        inverse = denominator.reciprocal_().masked_fill_(~pos, 0.0)
        grad = torch.where(pos, exps * inverse - 1.0, exps * inverse.sum(1, keepdim=True))
        return terms, pos, grad


@LOSSES.register("supcon")
class SupConLoss(_TemperatureLoss):
    """``-1/|P(a)| sum_{p in P(a)} log(e^{s_ap/T} / sum_{k != a} e^{s_ak/T})`` per anchor a.

    Khosla et al. (2020) Eq. (2) (``L^sup_out``); the softmax runs over the anchor's selected
    positives and negatives; anchors without positives give 0 (dropped by the default
    ``mean_nonzero``).
    """

    reductions = ("mean_nonzero", "mean", "sum", "threshold")

    def __init__(self, temperature: float = 0.1, **options):
        super().__init__(temperature, **options)

    def terms(self, pos, neg, logits):
        """Anchor terms ``[B]``, every anchor (0 without positives, as PML)."""
        num_pos = pos.sum(1)
        normaliser = masked_logsumexp(logits, pos | neg, dim=1).masked_fill(num_pos == 0, 0.0)
        positive_sum = torch.where(pos, logits, logits.new_zeros(())).sum(1)
        return (num_pos * normaliser - positive_sum) / num_pos.clamp_min(1), None

    def closed_form(self, pos, neg, logits):
        """Term ``log sum_k e^{z_ak} - mean_p z_ap``; gradient ``softmax_ak - [k in P(a)] / |P(a)|``."""
        exps, shift = _shifted_exp(logits, pos | neg)
        num_pos = pos.sum(1, keepdim=True)
        total = exps.sum(1, keepdim=True)
        without = num_pos == 0
        mean_positive = torch.where(pos, logits, 0.0).sum(1, keepdim=True) / num_pos.clamp_min(1)
        terms = (total.log() + shift - mean_positive).masked_fill_(without, 0.0).squeeze(1)
        grad = (exps / total - pos / num_pos.clamp_min(1)).masked_fill_(without, 0.0)
        return terms, None, grad
