"""Multi-similarity pair mining: informative positives and negatives relative to each other."""

from __future__ import annotations

import torch

from dmlkit.core.validation import NONE, Interval, validate_params
from dmlkit.distances import BaseDistance, CosineSimilarity, as_distance
from dmlkit.mining.base import DISTANCE, BaseMiner
from dmlkit.mining.selection import PairSelection


def hard_negative_mask(mat: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor,
                       epsilon: float, inverted: bool) -> torch.Tensor:
    """``[B, R]`` negatives closer than the anchor's hardest positive, within ``epsilon``.

    Multi-Similarity loss (Wang et al., 2019), Eq. (7): ``S_an + eps > min_{p} S_ap``.
    """
    if inverted:
        hardest_pos = mat.masked_fill(~positive, float("inf")).amin(dim=1, keepdim=True)
        return negative & (mat + epsilon > hardest_pos)
    hardest_pos = mat.masked_fill(~positive, float("-inf")).amax(dim=1, keepdim=True)
    return negative & (mat - epsilon < hardest_pos)


def hard_positive_mask(mat: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor,
                       epsilon: float, inverted: bool) -> torch.Tensor:
    """``[B, R]`` positives farther than the anchor's hardest negative, within ``epsilon``.

    Multi-Similarity loss (Wang et al., 2019), Eq. (8): ``S_ap - eps < max_{n} S_an``.
    """
    if inverted:
        hardest_neg = mat.masked_fill(~negative, float("-inf")).amax(dim=1, keepdim=True)
        return positive & (mat - epsilon < hardest_neg)
    hardest_neg = mat.masked_fill(~negative, float("inf")).amin(dim=1, keepdim=True)
    return positive & (mat + epsilon > hardest_neg)


class MultiSimilarityMiner(BaseMiner):
    """Keep negatives with ``S_an + eps > min_p S_ap`` and positives with ``S_ap - eps < max_n S_an``.

    Wang et al., "Multi-Similarity Loss with General Pair Weighting" (2019), Eqs. (7)-(8).
    Default measure is cosine similarity; distances flip the inequalities.
    """

    _repr_keys = ("epsilon",)

    def __init__(self, epsilon: float = 0.1, distance: BaseDistance | None = None):
        super().__init__()
        validate_params(type(self).__name__, {"epsilon": epsilon, "distance": distance},
                        {"epsilon": [Interval(float)], "distance": [DISTANCE, NONE]})
        self.epsilon = float(epsilon)
        self.distance = as_distance(distance) if distance is not None else CosineSimilarity()

    def mine(self, embeddings, ref_emb, positive, negative) -> PairSelection:
        mat = self.distance(embeddings, ref_emb)
        inverted = self.distance.is_inverted
        return PairSelection(hard_positive_mask(mat, positive, negative, self.epsilon, inverted),
                             hard_negative_mask(mat, positive, negative, self.epsilon, inverted))
