"""FastAP (Cakir et al., 2019): average precision over a soft histogram of distances, Eqs. (9)-(13).

Distances to an anchor's references are binned into ``L = num_bins + 1`` triangular bins over
``[0, 2^power]`` (the range of ``LpDistance`` between unit vectors); with ``h+_l`` (``h_l``) the
positive (all) counts of bin ``l`` and ``H+_l``, ``H_l`` their cumulative sums::

    FastAP(a) = 1/N+ sum_l h+_l H+_l / H_l,     loss = mean over anchors with positives of 1 - FastAP

PML vs paper: none in the value. PML's ``num_bins=10`` and distance (squared Euclidean between
L2-normalised embeddings) are kept; PML's ``indices_tuple`` weights each anchor's term.
"""

from __future__ import annotations

import torch

from dmlkit.core.validation import Interval
from dmlkit.distances import BaseDistance, LpDistance
from dmlkit.exceptions import InvalidParameterError
from dmlkit.losses.base import LOSSES, zero_loss
from dmlkit.losses.pair.batch import PairBatch
from dmlkit.losses.ranking._base import RankingLoss, node_shares


@LOSSES.register("fastap")
class FastAPLoss(RankingLoss):
    """``1 - FastAP`` per anchor (Cakir et al. Eq. (13)), averaged over the anchors with positives."""

    reductions = ("mean", "mean_nonzero", "sum", "threshold")
    takes_anchor_weights = True
    _parameter_constraints = {"num_bins": [Interval(int, 1, None)]}
    _repr_keys = ("num_bins", "reduction")

    def __init__(
        self, num_bins: int = 10, *, distance: BaseDistance | None = None, reduction: str = "mean",
        reducer: object | None = None, embedding_regularizer: object | None = None, embedding_reg_weight: float = 1.0,
    ):
        super().__init__(
            distance=distance, reduction=reduction, reducer=reducer,
            embedding_regularizer=embedding_regularizer, embedding_reg_weight=embedding_reg_weight,
        )
        if not (isinstance(self.distance, LpDistance) and self.distance.normalize_embeddings):
            raise InvalidParameterError(
                "The 'distance' parameter of FastAPLoss must be an LpDistance with normalize_embeddings=True "
                f"(its histogram spans [0, 2^power]). Got {self.distance!r} instead."
            )
        self.num_bins = int(num_bins)
        self.num_edges = self.num_bins + 1

    def default_distance(self) -> BaseDistance:
        return LpDistance(power=2, normalize_embeddings=True)

    def compute_ranking_loss(self, batch: PairBatch, weights: torch.Tensor | None) -> torch.Tensor:
        positive, negative = batch.label_pair_masks()
        has_positive = positive.any(1)
        if not has_positive.any():
            return zero_loss(batch.embeddings)
        x = batch.embeddings
        d = self.distance.matrix(x, x)
        top = float(2**self.distance.power)
        # Each distance's two triangular bins (Eq. (10)): one [B, B] pass, not [B, B, L].
        index, share = node_shares(d.clamp(0.0, top), 0.0, top / self.num_bins, self.num_edges)
        empty = d.new_zeros(d.shape[0], self.num_edges)
        h_pos, h_all = (  # per anchor and bin: the positives' and everything's counts
            empty.scatter_add(1, index + 1, share * w).scatter_add(1, index, (1 - share) * w)
            for w in (positive.to(d.dtype), (positive | negative).to(d.dtype))
        )
        cum_pos, cum_all = h_pos.cumsum(1), h_all.cumsum(1)
        product = h_pos * cum_pos
        safe = (product > 0) & (cum_all > 0)
        ratio = torch.where(safe, product / torch.where(safe, cum_all, torch.ones_like(cum_all)), 0.0)
        fast_ap = ratio.sum(1) / positive.sum(1).clamp_min(1)
        terms = 1 - fast_ap
        if weights is not None:
            terms = terms * weights
        return self.reducer(terms, has_positive)
