"""The hardest positive and hardest negative of every anchor (batch-hard triplets)."""

from __future__ import annotations

import torch

from dmlkit.core.validation import NONE, validate_params
from dmlkit.distances import BaseDistance, as_distance
from dmlkit.mining.base import DISTANCE, BaseMiner, default_distance
from dmlkit.mining.selection import TripletSelection


def extreme_per_row(mat: torch.Tensor, mask: torch.Tensor, largest: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(index [B], has_any [B])``: the column of the largest (or smallest) masked entry of each row."""
    fill = float("-inf") if largest else float("inf")
    masked = mat.masked_fill(~mask, fill)
    index = masked.argmax(dim=1) if largest else masked.argmin(dim=1)
    return index, mask.any(dim=1)


class BatchHardMiner(BaseMiner):
    """One triplet per anchor: its farthest positive and its closest negative.

    Hermans et al., "In Defense of the Triplet Loss" (2017), Eq. (5). Anchors without a
    positive or without a negative are skipped. For similarities, "farthest" means least
    similar.
    """

    def __init__(self, distance: BaseDistance | None = None):
        super().__init__()
        validate_params(type(self).__name__, {"distance": distance}, {"distance": [DISTANCE, NONE]})
        self.distance = as_distance(distance) if distance is not None else default_distance()

    def mine(self, embeddings, ref_emb, positive, negative) -> TripletSelection:
        mat = self.distance(embeddings, ref_emb)
        inverted = self.distance.is_inverted
        hardest_pos, has_pos = extreme_per_row(mat, positive, largest=not inverted)
        hardest_neg, has_neg = extreme_per_row(mat, negative, largest=inverted)
        anchor = (has_pos & has_neg).nonzero(as_tuple=True)[0]
        return TripletSelection(anchor, hardest_pos[anchor], hardest_neg[anchor])
