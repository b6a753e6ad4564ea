"""PNP loss (Li et al., 2022): penalise only the negatives ranked before each positive, Eqs. (5)-(9).

For query ``q`` and positive ``j``, ``R(q, j) = sum_{k in N(q)} sigmoid((s_qk - s_qj) / anneal)``
(the argument clamped to [-50, 50], as PML), and the loss is the mean over queries with positives
of ``1/|P| sum_j f(R(q, j))`` with ``f`` by ``variant``: ``"O"`` R (PNP-O), ``"Ds"`` log(1 + R)
(PNP-D_s), ``"Dq"`` ``1 - (1 + R)^-alpha`` (PNP-D_q, as ``1 -`` the mean), ``"Iu"`` (1 + R) log(1 + R)
(PNP-I_u), ``"Ib"`` ``(bR - log(1 + bR)) / b^2`` (PNP-I_b).

PML vs paper: PML (after the paper's code) counts the query itself among its positives (it has
``R`` near 0, so it lowers the mean, and adds 1 per query with ``Dq``); the paper's equation does
not. dmlkit follows PML by default (``query_in_ranking=True``); ``query_in_ranking=False`` is the
paper's equation. PML's defaults (``b=2, alpha=1, anneal=0.01, variant="O"``) are kept.
"""

from __future__ import annotations

import torch

from dmlkit.core.validation import InstanceOf, Interval, Options
from dmlkit.distances import BaseDistance, CosineSimilarity
from dmlkit.losses.base import LOSSES, zero_loss
from dmlkit.losses.pair.batch import PairBatch
from dmlkit.losses.ranking._base import RankingLoss, positive_lists, sigmoid_rank_sums

#: PML's bound on the sigmoid's argument.
SIGMOID_CLAMP = 50.0


@LOSSES.register("pnp")
class PNPLoss(RankingLoss):
    """Mean over queries of ``f(negatives ranked before each positive)`` (Li et al. Eq. (9))."""

    VARIANTS = ["Ds", "Dq", "Iu", "Ib", "O"]
    reductions = ("mean", "mean_nonzero", "sum", "threshold")
    measure = "a similarity (CosineSimilarity)"
    _parameter_constraints = {
        "b": [Interval(float, 0, None, closed="neither")],
        "alpha": [Interval(float, None, None)],
        "anneal": [Interval(float, 0, None, closed="neither")],
        "variant": [Options(tuple(VARIANTS))],
        "query_in_ranking": [InstanceOf((bool,))],
    }
    _repr_keys = ("b", "alpha", "anneal", "variant", "query_in_ranking")

    def __init__(
        self, b: float = 2, alpha: float = 1, anneal: float = 0.01, variant: str = "O", *,
        query_in_ranking: bool = True, distance: BaseDistance | None = None, reduction: str = "mean",
        reducer: object | None = None, embedding_regularizer: object | None = None, embedding_reg_weight: float = 1.0,
    ):
        super().__init__(
            distance=distance, reduction=reduction, reducer=reducer,
            embedding_regularizer=embedding_regularizer, embedding_reg_weight=embedding_reg_weight,
        )
        self.b, self.alpha, self.anneal = float(b), float(alpha), float(anneal)
        self.variant = variant
        self.query_in_ranking = query_in_ranking

    def default_distance(self) -> BaseDistance:
        return CosineSimilarity()

    def compute_ranking_loss(self, batch: PairBatch, weights: torch.Tensor | None) -> torch.Tensor:
        same = batch.label_equal()
        others = same.clone().fill_diagonal_(False)
        positive = same & others.any(1, keepdim=True) if self.query_in_ranking else others
        index, valid = positive_lists(positive)
        count = valid.sum(1)
        if not bool((count > 0).any()):
            return zero_loss(batch.embeddings)
        x = batch.embeddings
        sim = self.distance.matrix(x, x)
        negatives = (~same).to(sim.dtype)[:, :, None]
        ranks = sigmoid_rank_sums(sim, index, negatives, self.anneal, SIGMOID_CLAMP).squeeze(2)  # [B, M]
        terms = torch.where(valid, self._shape(ranks), 0.0).sum(1) / count.clamp_min(1)
        loss = self.reducer(terms, count > 0)
        return 1 - loss if self.variant == "Dq" else loss

    def _shape(self, r: torch.Tensor) -> torch.Tensor:
        """``f(R)`` of the variant (Li et al. Eqs. (6)-(8); ``Dq`` before the ``1 -``)."""
        if self.variant == "Ds":
            return torch.log1p(r)
        if self.variant == "Dq":
            return (1 + r).pow(-self.alpha)
        if self.variant == "Iu":
            return (1 + r) * torch.log1p(r)
        if self.variant == "Ib":
            return (self.b * r - torch.log1p(self.b * r)) / self.b**2
        return r
