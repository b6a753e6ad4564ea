"""Triplet margin loss over all (or randomly sampled) triplets of the batch.

Schroff et al. (2015) Eq. (1) / DRO paper Eq. (28): ``[d_ap - d_an + margin]_+`` per triplet.
Paper vs PML: the papers average over all triplets (``reduction="mean"``); PML averages over
the triplets with a non-zero loss (``AvgNonZeroReducer``), dmlkit's default. Distance default
as in PML: Euclidean between L2-normalised embeddings.

``swap=True`` (Balntas et al., 2016) replaces ``d_an`` with ``min(d_an, d_pn)``. PML looks
``d_pn`` up in the anchor-by-reference matrix, which is wrong when references are not the
batch; dmlkit computes the true positive-to-negative distance between references.
"""

from __future__ import annotations

import torch

from dmlkit.core.validation import BOOL, Interval, Options
from dmlkit.distances import BaseDistance, LpDistance
from dmlkit.losses.base import LOSSES
from dmlkit.losses.logsumexp import log1p_exp
from dmlkit.losses.pair._triplets import (
    GeneratorStateMixin,
    all_triplets,
    all_triplets_sums,
    sample_triplets,
)
from dmlkit.losses.pair.base import PairLoss
from dmlkit.losses.pair.batch import PairBatch
from dmlkit.losses.pair.terms import Pairwise, attach_gradient, dissimilarity
from dmlkit.mining.selection import TripletSelection


@LOSSES.register("triplet_margin")
class TripletMarginLoss(GeneratorStateMixin, PairLoss):
    """``h(d_ap - d_an + margin)`` per triplet, ``h`` = ReLU or softplus (``smooth_loss``).

    Schroff et al. (2015) Eq. (1). ``triplets_per_anchor="all"`` uses every triplet without
    materialising them (memory ``O(B R)``); an int draws that many random triplets per anchor
    from a generator seeded with ``seed`` (its state is part of ``state_dict``).
    """

    _repr_keys = ("margin", "swap", "smooth_loss", "triplets_per_anchor", "reduction")
    reduces_terms = True

    _parameter_constraints = {
        "margin": [Interval(float)],
        "swap": [BOOL],
        "smooth_loss": [BOOL],
        "triplets_per_anchor": [Options(("all",)), Interval(int, 1, None)],
        "seed": [Interval(int, 0, None)],
    }

    def __init__(
        self,
        margin: float = 0.05,
        swap: bool = False,
        smooth_loss: bool = False,
        triplets_per_anchor: str | int = "all",
        *,
        distance: BaseDistance | None = None,
        miner: object | None = None,
        reduction: str = "mean_nonzero",
        seed: int = 0,
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
        self.margin = float(margin)
        self.swap = swap
        self.smooth_loss = smooth_loss
        self.triplets_per_anchor = triplets_per_anchor
        self.generator = torch.Generator().manual_seed(seed)

    def default_distance(self) -> BaseDistance:
        return LpDistance(power=1, normalize_embeddings=True)

    def _positive_negative_rows(self, batch: PairBatch, dis: torch.Tensor, positives: torch.Tensor):
        """Oriented reference-to-reference rows ``[U, R]`` for the positives used, and the row of each reference."""
        if batch.same_set:
            return dis, torch.arange(dis.shape[0], device=dis.device)
        unique = positives.unique()
        rows = torch.full((batch.num_references,), -1, dtype=torch.long, device=dis.device)
        rows[unique] = torch.arange(unique.numel(), device=dis.device)
        dis_pn = dissimilarity(self.distance(batch.references[unique], batch.references), self.distance)
        return dis_pn, rows

    def compute_pair_loss(self, batch: PairBatch) -> torch.Tensor:
        sel = batch.selection
        if (not isinstance(sel, TripletSelection) and self.triplets_per_anchor == "all" and not self.swap
                and self.reduces_from_counts()):
            # every triplet, reduced from counts: the matrix without autograd, its gradient by the distance
            pairs = Pairwise(self.distance, batch.embeddings, batch.references, batch.same_set)
            masks = batch.pair_masks()
            value, coefficient, _ = all_triplets_sums(dissimilarity(pairs.mat, self.distance), masks.positive,
                                                      masks.negative, self.margin, smooth=self.smooth_loss,
                                                      reducer=self.reducer)
            return pairs.attach(value, dissimilarity(coefficient, self.distance))
        dis = dissimilarity(self.distance.matrix(batch.embeddings, batch.references), self.distance)
        if isinstance(sel, TripletSelection):
            a, p, n = sel.anchor, sel.positive, sel.negative
        else:
            masks = batch.pair_masks()
            if self.triplets_per_anchor == "all" and not self.reduces_from_counts():
                a, p, n = all_triplets(masks.positive, masks.negative)
            elif self.triplets_per_anchor == "all":  # with swap (without: above)
                dis_pn, pn_rows = self._positive_negative_rows(batch, dis, masks.positive.any(0).nonzero()[:, 0])
                value, coefficient, coefficient_pn = all_triplets_sums(
                    dis, masks.positive, masks.negative, self.margin, smooth=self.smooth_loss, reducer=self.reducer,
                    dis_pn=dis_pn, pn_rows=pn_rows)
                return attach_gradient(value, (dis, coefficient), (dis_pn, coefficient_pn))
            else:
                a, p, n = sample_triplets(masks.positive, masks.negative, self.triplets_per_anchor, self.generator)
        d_an = dis[a, n]
        if self.swap:
            dis_pn, pn_rows = self._positive_negative_rows(batch, dis, p)
            d_an = torch.minimum(d_an, dis_pn[pn_rows[p], n])
        violation = dis[a, p] - d_an + self.margin
        terms = log1p_exp(violation) if self.smooth_loss else violation.clamp_min(0.0)
        return self.reduce("loss", terms, None, batch, "triplet", (a, p, n))
