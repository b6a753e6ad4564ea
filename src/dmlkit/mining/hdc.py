"""Hard-aware cascaded mining: the hardest fraction of the positive and of the negative pairs."""

from __future__ import annotations

import math

import torch

from dmlkit._validation import NONE, Interval, validate_params
from dmlkit.distances import BaseDistance, as_distance
from dmlkit.mining.base import DISTANCE, BaseMiner, default_distance
from dmlkit.mining.selection import PairSelection


def hardest_fraction(values: torch.Tensor, fraction: float, largest: bool) -> torch.Tensor:
    """Indices of the ``ceil(fraction * N)`` largest (or smallest) ``values``, hardest first."""
    k = math.ceil(fraction * values.numel())
    return torch.topk(values, k=k, largest=largest).indices


class HDCMiner(BaseMiner):
    """The ``filter_percentage`` hardest positive pairs and hardest negative pairs of the batch.

    Yuan et al., "Hard-Aware Deeply Cascaded Embedding" (2017), Sec. 3.2: each level of the
    cascade keeps the hardest share of the pairs, ranked over the whole batch (not per anchor).
    Hardest positives are the farthest (least similar), hardest negatives the closest. The PML
    tuple lists them hardest first.
    """

    _repr_keys = ("filter_percentage",)

    def __init__(self, filter_percentage: float = 0.5, distance: BaseDistance | None = None):
        super().__init__()
        validate_params(type(self).__name__, {"filter_percentage": filter_percentage, "distance": distance},
                        {"filter_percentage": [Interval(float, 0, 1)], "distance": [DISTANCE, NONE]})
        self.filter_percentage = float(filter_percentage)
        self.distance = as_distance(distance) if distance is not None else default_distance()

    def mine(self, embeddings, ref_emb, positive, negative) -> PairSelection:
        mat = self.distance(embeddings, ref_emb)
        inverted = self.distance.is_inverted
        a1, p = positive.nonzero(as_tuple=True)
        a2, n = negative.nonzero(as_tuple=True)
        keep_pos = hardest_fraction(mat[a1, p], self.filter_percentage, largest=not inverted)
        keep_neg = hardest_fraction(mat[a2, n], self.filter_percentage, largest=inverted)
        return PairSelection.from_pairs(a1[keep_pos], p[keep_pos], a2[keep_neg], n[keep_neg], *mat.shape)
