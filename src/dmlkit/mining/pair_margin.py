"""Positive pairs farther than ``pos_margin`` and negative pairs closer than ``neg_margin``."""

from __future__ import annotations

from dmlkit.core.validation import NONE, Interval, validate_params
from dmlkit.distances import BaseDistance, as_distance
from dmlkit.mining.base import DISTANCE, BaseMiner, default_distance
from dmlkit.mining.selection import PairSelection


class PairMarginMiner(BaseMiner):
    """Pairs that violate a contrastive margin: ``d(a,p) > pos_margin`` and ``d(a,n) < neg_margin``.

    Hadsell et al. (2006) contrastive loss; for similarities the inequalities flip
    (``s(a,p) < pos_margin``, ``s(a,n) > neg_margin``).
    """

    _repr_keys = ("pos_margin", "neg_margin")

    def __init__(self, pos_margin: float = 0.2, neg_margin: float = 0.8,
                 distance: BaseDistance | None = None):
        super().__init__()
        validate_params(type(self).__name__,
                        {"pos_margin": pos_margin, "neg_margin": neg_margin, "distance": distance},
                        {"pos_margin": [Interval(float)], "neg_margin": [Interval(float)],
                         "distance": [DISTANCE, NONE]})
        self.pos_margin = float(pos_margin)
        self.neg_margin = float(neg_margin)
        self.distance = as_distance(distance) if distance is not None else default_distance()

    def mine(self, embeddings, ref_emb, positive, negative) -> PairSelection:
        mat = self.distance(embeddings, ref_emb)
        if self.distance.is_inverted:
            return PairSelection(positive & (mat < self.pos_margin), negative & (mat > self.neg_margin))
        return PairSelection(positive & (mat > self.pos_margin), negative & (mat < self.neg_margin))
