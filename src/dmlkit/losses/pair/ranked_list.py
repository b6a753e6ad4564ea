"""Ranked list loss (Wang et al., 2019, CVPR), Eqs. (5)-(9), with PML's positive weighting ``Tp``.

Per anchor, positives farther than ``alpha - margin`` and negatives closer than ``alpha`` are
pulled and pushed with weights ``w_p = exp(Tp (d_p - (alpha - margin)))`` and
``w_n = exp(Tn (alpha - d_n))``::

    L_P = sum w_p (d_p - (alpha - margin)) / sum w_p,   L_N = sum w_n (alpha - d_n) / sum w_n
    L = (1 - imbalance) L_P + imbalance L_N      (mean over the anchors)

PML vs paper: PML's defaults (``alpha = 1 + margin / 2``, ``Tp = 0``: the paper's RLL-Simpler)
and its ``1e-5`` per reference added to each weight sum (a guard against ``0/0``: the values
differ from the exact ratio by under ``1e-5 R / |P*|`` relative) are kept, and the weights are
not detached, as in PML. Pairs at distance exactly 0 are left out, as PML's masks do.

float16 batches: distances, weights, guard and ratios in float16 as PML computes them (a weight
below float16's smallest subnormal is 0), the reduction in float32.
"""

from __future__ import annotations

import torch

from dmlkit.core.validation import InstanceOf, Interval, validate_params
from dmlkit.distances import BaseDistance, LpDistance
from dmlkit.exceptions import AssertedParameterError, InvalidParameterError
from dmlkit.losses.base import LOSSES
from dmlkit.losses.pair.base import PairLoss
from dmlkit.losses.pair.batch import PairBatch
from dmlkit.losses.pair.terms import Pairwise, count_divisor, in_input_precision, reduces_from_counts, require_orientation

#: PML's guard, added once per reference to each anchor's weight sums.
WEIGHT_EPS = 1e-5


def _weighted_ratio(
    terms: torch.Tensor, temperature: float, mask: torch.Tensor, low: torch.dtype | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(L, dL/dt)`` per row: ``L = sum_mask w t / (sum_mask w + 1e-5 R)``, ``w = exp(temperature t)``.

    Numerator and denominator are both scaled by ``exp(-shift)``, ``shift`` the row's largest
    positive exponent, so no weight overflows; the ratio is unchanged. The derivative
    ``w_k (1 + T t_k - T L) / (sum w + guard)`` is exact without autograd. With ``low`` (float16,
    the embeddings' dtype) the weights, sums and ratio are computed in that dtype as
    PML computes them (a weight below its smallest subnormal is 0, and the guard is added to each
    weight before the sum, so it vanishes beside weights near 1); the results come back in ``terms``' dtype.
    """
    out_dtype = terms.dtype
    if low is not None:
        terms = terms.to(low)
    exponent = torch.where(mask, temperature * terms, terms.new_full((), float("-inf")))
    shift = exponent.detach().amax(1, keepdim=True).clamp_min(0.0)
    weights = torch.exp(exponent - shift)  # 0 outside the mask
    if low is None:
        total = weights.sum(1, keepdim=True) + WEIGHT_EPS * terms.shape[1] * torch.exp(-shift)
    else:
        total = (weights + WEIGHT_EPS * torch.exp(-shift)).sum(1, keepdim=True)
    ratio = (weights * torch.where(mask, terms, terms.new_zeros(()))).sum(1, keepdim=True) / total
    with torch.no_grad():
        slope = weights * (1 + temperature * (terms - ratio)) / total
    return ratio.squeeze(1).to(out_dtype), slope.masked_fill_(~mask, 0.0).to(out_dtype)


@LOSSES.register("ranked_list")
class RankedListLoss(PairLoss):
    """Ranked list loss per anchor: weighted hinges of the positive and negative sets (Eq. (9))."""

    reductions = ("mean", "mean_nonzero", "sum", "threshold")
    #: Hands its terms to the reducer itself, so any reducer object applies (PairLoss.reduces_terms).
    reduces_terms = True
    _parameter_constraints = {
        "margin": [Interval(float, None, None)],
        "Tn": [Interval(float, None, None)],
        "Tp": [Interval(float, None, None)],
        "alpha": [Interval(float, None, None), InstanceOf((type(None),))],
    }
    _repr_keys = ("margin", "Tn", "imbalance", "alpha", "Tp")

    def __init__(
        self, margin: float, Tn: float, imbalance: float = 0.5, alpha: float | None = None, Tp: float = 0,
        *, distance: BaseDistance | None = None, miner: object | None = None, reduction: str = "mean",
        reducer: object | None = None, embedding_regularizer: object | None = None, embedding_reg_weight: float = 1.0,
    ):
        try:  # PML asserts this one: the error is also an AssertionError
            validate_params("RankedListLoss", {"imbalance": imbalance}, {"imbalance": [Interval(float, 0, 1)]})
        except InvalidParameterError as error:
            raise AssertedParameterError(str(error)) from None
        super().__init__(
            distance=distance, miner=miner, reduction=reduction, reducer=reducer,
            embedding_regularizer=embedding_regularizer, embedding_reg_weight=embedding_reg_weight,
        )
        require_orientation(self.distance, "RankedListLoss", False, "a distance (larger is farther)")
        self.margin, self.Tn, self.Tp = float(margin), float(Tn), float(Tp)
        self.imbalance = float(imbalance)
        self.alpha = 1 + self.margin / 2 if alpha is None else float(alpha)

    def default_distance(self) -> BaseDistance:
        return LpDistance(power=1, normalize_embeddings=True)

    def compute_pair_loss(self, batch: PairBatch) -> torch.Tensor:
        masks = batch.pair_masks()
        closed_form = reduces_from_counts(self.reducer)
        if closed_form:
            pairs = Pairwise(self.distance, batch.embeddings, batch.references, batch.same_set)
            d = pairs.mat
        else:  # the terms themselves go to the reducer: autograd
            d = self.distance.matrix(batch.embeddings, batch.references)
        d = in_input_precision(d, self.distance, batch)
        low = batch.input_dtype if batch.float16_input else None
        boundary = self.alpha - self.margin
        nonzero = d > 0
        pos = masks.positive & (d > boundary) & nonzero
        neg = masks.negative & (d < self.alpha) & nonzero
        loss_p, slope_p = _weighted_ratio(d - boundary, self.Tp, pos, low)
        loss_n, slope_n = _weighted_ratio(self.alpha - d, self.Tn, neg, low)
        terms = (1 - self.imbalance) * loss_p + self.imbalance * loss_n
        if not closed_form:
            return self.reducer(terms)
        divisor = count_divisor(self.reducer, terms.numel(), (terms > 0).sum())
        grad = ((1 - self.imbalance) * slope_p - self.imbalance * slope_n) / divisor  # dt/dd: +1, -1
        return pairs.attach(terms.sum() / divisor, grad)
