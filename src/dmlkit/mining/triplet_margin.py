"""Triplets selected by how much they violate a margin (all / hard / semi-hard / easy)."""

from __future__ import annotations

import torch

from dmlkit.core.validation import NONE, Interval, Options, validate_params
from dmlkit.distances import BaseDistance, as_distance
from dmlkit.mining.base import DISTANCE, BaseMiner, default_distance, empty_triplets, triplet_margins
from dmlkit.mining.selection import TripletSelection

TRIPLET_TYPES = ("all", "hard", "semihard", "easy")


class TripletMarginMiner(BaseMiner):
    """Every triplet ``(a, p, n)`` whose margin ``t = d(a, n) - d(a, p)`` satisfies the chosen rule.

    Schroff et al. (FaceNet) Sec. 3.2 for semi-hard. With ``t`` the triplet margin:

    * ``"all"``: ``t <= margin`` (the triplet loss ``[margin - t]_+`` is not negative; PML's boundary),
    * ``"hard"``: ``t <= 0`` and ``t <= margin`` (the negative is at least as close as the positive),
    * ``"semihard"``: ``0 < t <= margin``, i.e. ``d(a,p) < d(a,n) <= d(a,p) + margin``,
    * ``"easy"``: ``t > margin`` (the complement of ``"all"``).

    For similarities ``t = s(a, p) - s(a, n)``. Work is ``O(P R)`` for ``P`` positive pairs,
    never ``O(B R^2)``. Triplets come out sorted by ``(anchor, positive, negative)``.
    """

    _repr_keys = ("margin", "type_of_triplets")

    mines_in_input_dtype = True

    def __init__(self, margin: float = 0.2, type_of_triplets: str = "all",
                 distance: BaseDistance | None = None):
        super().__init__()
        validate_params(type(self).__name__,
                        {"margin": margin, "type_of_triplets": type_of_triplets, "distance": distance},
                        {"margin": [Interval(float)], "type_of_triplets": [Options(TRIPLET_TYPES)],
                         "distance": [DISTANCE, NONE]})
        self.margin = float(margin)
        self.type_of_triplets = type_of_triplets
        self.distance = as_distance(distance) if distance is not None else default_distance()

    def keep(self, margins: torch.Tensor) -> torch.Tensor:
        """Boolean mask of the triplet margins kept by ``type_of_triplets``."""
        if self.type_of_triplets == "easy":
            return margins > self.margin
        kept = margins <= self.margin
        if self.type_of_triplets == "hard":
            kept &= margins <= 0
        elif self.type_of_triplets == "semihard":
            kept &= margins > 0
        return kept

    def mine(self, embeddings, ref_emb, positive, negative) -> TripletSelection:
        anchor, pos = positive.nonzero(as_tuple=True)
        if anchor.numel() == 0:
            return empty_triplets(embeddings.device)
        mat = self.distance(embeddings, ref_emb)
        kept = self.keep(triplet_margins(self.distance, mat, anchor, pos)) & negative[anchor]
        pair, neg = kept.nonzero(as_tuple=True)
        return TripletSelection(anchor[pair], pos[pair], neg)
