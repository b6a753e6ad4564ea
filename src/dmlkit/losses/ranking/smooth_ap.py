"""Smooth-AP (Brown et al., 2020): average precision with the ranking's step function replaced by a
sigmoid of temperature ``tau``, Eqs. (6)-(9)::

    AP(q) = 1/|P| sum_{j in P} (1 + sum_{k in P, k != j} G(s_qk - s_qj)) / (1 + sum_{k in A, k != j} G(s_qk - s_qj))

with ``G(x) = sigmoid(x / tau)``, ``P`` the query's positives and ``A`` everything ranked; the loss
is the mean of ``1 - AP`` over the queries.

PML vs paper: PML (after the paper's code) counts the query itself in its ranking, as one of
its positives and in ``A``; the paper's equation leaves it out. dmlkit follows PML by default
(``query_in_ranking=True``); ``query_in_ranking=False`` is the paper's equation (queries without
other positives are then skipped). PML also requires a batch grouped by class with equal counts
and reads the positives from positions: blocks of ``C`` consecutive samples for ``C`` classes of
``m`` samples, which are the classes only when ``C == m``. dmlkit reads them from the labels: the
same value as PML when ``C == m``, the label-defined one on any other batch (a deliberate difference).
PML's ``indices_tuple`` weights the queries.
"""

from __future__ import annotations

import torch

from dmlkit.core.validation import InstanceOf, Interval
from dmlkit.distances import BaseDistance, CosineSimilarity
from dmlkit.losses.base import LOSSES
from dmlkit.losses.pair.batch import PairBatch
from dmlkit.losses.ranking._base import RankingLoss, positive_lists, sigmoid_rank_sums


@LOSSES.register("smooth_ap")
class SmoothAPLoss(RankingLoss):
    """``1 - AP`` per query with sigmoid-smoothed ranks (Brown et al. Eq. (9)), averaged over queries."""

    reductions = ("mean", "mean_nonzero", "sum", "threshold")
    takes_anchor_weights = True
    measure = "a similarity (CosineSimilarity)"
    _parameter_constraints = {
        "temperature": [Interval(float, 0, None, closed="neither")],
        "query_in_ranking": [InstanceOf((bool,))],
    }
    _repr_keys = ("temperature", "query_in_ranking", "reduction")

    def __init__(
        self, temperature: float = 0.01, *, query_in_ranking: bool = True, distance: BaseDistance | None = None,
        reduction: str = "mean", reducer: object | None = None,
        embedding_regularizer: object | None = None, embedding_reg_weight: float = 1.0,
    ):
        super().__init__(
            distance=distance, reduction=reduction, reducer=reducer,
            embedding_regularizer=embedding_regularizer, embedding_reg_weight=embedding_reg_weight,
        )
        self.temperature = float(temperature)
        self.query_in_ranking = query_in_ranking

    def default_distance(self) -> BaseDistance:
        return CosineSimilarity()

    def compute_ranking_loss(self, batch: PairBatch, weights: torch.Tensor | None) -> torch.Tensor:
        x = batch.embeddings
        sim = self.distance.matrix(x, x)
        positive = batch.label_equal()
        ranked = torch.ones_like(positive)
        if not self.query_in_ranking:
            positive.fill_diagonal_(False)
            ranked.fill_diagonal_(False)
        index, valid = positive_lists(positive)
        masks = torch.stack((ranked, positive), dim=2).to(sim.dtype)  # [B, B, 2]
        # Each listed j meets itself at sigmoid(0) = 1/2 in both sums; the "+1" is its own rank.
        sums = sigmoid_rank_sums(sim, index, masks, self.temperature) + 0.5
        ratio = torch.where(valid, sums[:, :, 1] / sums[:, :, 0], 0.0)
        count = valid.sum(1)
        terms = 1 - ratio.sum(1) / count.clamp_min(1)
        if weights is not None:
            terms = terms * weights
        return self.reducer(terms, count > 0)
