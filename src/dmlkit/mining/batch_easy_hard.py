"""One positive and one negative per anchor, each chosen easy, semi-hard, hard or all."""

from __future__ import annotations

import torch

from dmlkit.core.validation import NONE, InstanceOf, Options, validate_params
from dmlkit.distances import BaseDistance, as_distance
from dmlkit.exceptions import InvalidParameterError
from dmlkit.mining.base import DISTANCE, BaseMiner, default_distance
from dmlkit.mining.selection import PairSelection

STRATEGIES = ("hard", "semihard", "easy", "all")


def pick_per_row(mat: torch.Tensor, allowed: torch.Tensor, largest: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(value [B], column [B], has_any [B])``: each row's largest (or smallest) allowed entry."""
    fill = float("-inf") if largest else float("inf")
    masked = mat.masked_fill(~allowed, fill)
    value, column = masked.max(dim=1) if largest else masked.min(dim=1)
    return value, column, allowed.any(dim=1)


def in_range(mat: torch.Tensor, allowed_range: tuple[float, float] | None) -> torch.Tensor:
    """``[B, R]`` True where ``allowed_range[0] <= mat <= allowed_range[1]`` (everywhere when ``None``)."""
    if allowed_range is None:
        return torch.ones_like(mat, dtype=torch.bool)
    return (mat >= allowed_range[0]) & (mat <= allowed_range[1])


class BatchEasyHardMiner(BaseMiner):
    """For each anchor, the positive and the negative its strategies pick (Xuan et al., 2020).

    Xuan, Stylianou, Pless, "Improved Embeddings with Easy Positive Triplet Mining" (2020),
    generalised as in pytorch-metric-learning. Per anchor, among the pairs inside
    ``allowed_pos_range`` / ``allowed_neg_range`` (inclusive ``(low, high)`` of the distance or
    similarity):

    * positive ``"easy"``: the closest; ``"hard"``: the farthest; ``"semihard"``: the farthest
      that is still closer than the chosen negative; ``"all"``: every positive pair;
    * negative ``"easy"``: the farthest; ``"hard"``: the closest; ``"semihard"``: the closest
      that is still farther than the chosen positive; ``"all"``: every negative pair.

    Anchors missing either side are dropped (unless that side is ``"all"``, which takes every
    pair regardless of the range, as PML does). The output is a
    :class:`PairSelection`; PML's tuple is ``(a, p, a, n)``.
    """

    HARD, SEMIHARD, EASY, ALL = STRATEGIES
    all_batch_mining_strategies = list(STRATEGIES)
    _repr_keys = ("pos_strategy", "neg_strategy", "allowed_pos_range", "allowed_neg_range")

    def __init__(self, pos_strategy: str = "easy", neg_strategy: str = "semihard",
                 allowed_pos_range: tuple[float, float] | None = None,
                 allowed_neg_range: tuple[float, float] | None = None, distance: BaseDistance | None = None):
        super().__init__()
        name = type(self).__name__
        ranges = [InstanceOf((tuple, list)), NONE]
        validate_params(name, {"pos_strategy": pos_strategy, "neg_strategy": neg_strategy,
                               "allowed_pos_range": allowed_pos_range, "allowed_neg_range": allowed_neg_range,
                               "distance": distance},
                        {"pos_strategy": [Options(STRATEGIES)], "neg_strategy": [Options(STRATEGIES)],
                         "allowed_pos_range": ranges, "allowed_neg_range": ranges, "distance": [DISTANCE, NONE]})
        if pos_strategy == neg_strategy == "semihard":
            raise InvalidParameterError(f"{name}: pos_strategy and neg_strategy cannot both be 'semihard'.")
        if "semihard" in (pos_strategy, neg_strategy) and "all" in (pos_strategy, neg_strategy):
            raise InvalidParameterError(f"{name}: 'semihard' cannot be combined with 'all'.")
        for key, value in (("allowed_pos_range", allowed_pos_range), ("allowed_neg_range", allowed_neg_range)):
            if value is not None and len(value) != 2:
                raise InvalidParameterError(
                    f"The '{key}' parameter of {name} must be a (low, high) pair or None. Got {value!r} instead.")
        self.pos_strategy = pos_strategy
        self.neg_strategy = neg_strategy
        self.allowed_pos_range = allowed_pos_range
        self.allowed_neg_range = allowed_neg_range
        self.distance = as_distance(distance) if distance is not None else default_distance()

    def _pick(self, mat: torch.Tensor, allowed: torch.Tensor, farthest: bool):
        """The farthest (least similar) or the closest (most similar) allowed entry of each row."""
        return pick_per_row(mat, allowed, largest=farthest != self.distance.is_inverted)

    def _beyond(self, mat: torch.Tensor, threshold: torch.Tensor, farther: bool) -> torch.Tensor:
        """``[B, R]`` entries strictly farther (or strictly closer) than each row's ``threshold``."""
        if farther != self.distance.is_inverted:
            return mat > threshold[:, None]
        return mat < threshold[:, None]

    def mine(self, embeddings, ref_emb, positive, negative) -> PairSelection:
        mat = self.distance(embeddings, ref_emb)
        pos_ok = positive & in_range(mat, self.allowed_pos_range)
        neg_ok = negative & in_range(mat, self.allowed_neg_range)
        pos_pick = neg_pick = None
        if self.pos_strategy == "semihard":
            neg_pick = self._pick(mat, neg_ok, farthest=self.neg_strategy == "easy")
            pos_pick = self._pick(mat, pos_ok & self._beyond(mat, neg_pick[0], farther=False), farthest=True)
        elif self.neg_strategy == "semihard":
            pos_pick = self._pick(mat, pos_ok, farthest=self.pos_strategy != "easy")
            neg_pick = self._pick(mat, neg_ok & self._beyond(mat, pos_pick[0], farther=True), farthest=False)
        else:
            if self.pos_strategy != "all":
                pos_pick = self._pick(mat, pos_ok, farthest=self.pos_strategy == "hard")
            if self.neg_strategy != "all":
                neg_pick = self._pick(mat, neg_ok, farthest=self.neg_strategy == "easy")
        if pos_pick is None and neg_pick is None:  # "all" and "all": every pair
            return PairSelection(positive, negative, listed=(*positive.nonzero(as_tuple=True),
                                                             *negative.nonzero(as_tuple=True)))
        if pos_pick is not None and neg_pick is not None:
            a = (pos_pick[2] & neg_pick[2]).nonzero().squeeze(1)  # the kept anchors: one read, then gathers
            return PairSelection.from_pairs(a, pos_pick[1][a], a, neg_pick[1][a], *mat.shape)
        # "all" takes every pair, outside the allowed range too (as pytorch-metric-learning does);
        # its mask is the label mask itself, the picked side one entry per kept anchor.
        picked = pos_pick if pos_pick is not None else neg_pick
        a = picked[2].nonzero().squeeze(1)
        other = picked[1][a]
        one = torch.zeros_like(positive)
        one[a, other] = True
        if pos_pick is None:
            return PairSelection(positive, one, listed=(*positive.nonzero(as_tuple=True), a, other))
        return PairSelection(one, negative, listed=(a, other, *negative.nonzero(as_tuple=True)))
