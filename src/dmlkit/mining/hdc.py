"""Hard-aware cascaded mining: the hardest fraction of the positive and of the negative pairs."""

from __future__ import annotations

import math

import torch

from dmlkit.core.validation import NONE, Interval, validate_params
from dmlkit.distances import BaseDistance, as_distance
from dmlkit.mining.base import DISTANCE, BaseMiner, default_distance
from dmlkit.mining.selection import PairSelection


def hardest_fraction(values: torch.Tensor, fraction: float, largest: bool, ordered: bool = True) -> torch.Tensor:
    """Indices of the ``ceil(fraction * N)`` largest (or smallest) ``values``, hardest first.

    ``ordered=False`` returns the same indices in an unspecified order, without the sort of the
    kept share (``torch.topk`` selects the same set either way: one selection, then a sort).
    """
    k = math.ceil(fraction * values.numel())
    return torch.topk(values, k=k, largest=largest, sorted=ordered).indices


def hardest_mask(mat: torch.Tensor, candidates: torch.Tensor, fraction: float, largest: bool) -> torch.Tensor:
    """``[B, R]`` bool: the hardest ``fraction`` of the ``candidates`` pairs of ``mat``, ranked over the whole batch."""
    kept = torch.zeros(int(candidates.sum()), dtype=torch.bool, device=mat.device)
    kept[hardest_fraction(mat.masked_select(candidates), fraction, largest, ordered=False)] = True
    return torch.zeros_like(candidates).masked_scatter_(candidates, kept)


def hardest_first(mat: torch.Tensor, candidates: torch.Tensor, fraction: float,
                  largest: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows, cols)`` of :func:`hardest_mask`'s pairs, hardest first (PML's list and tie order)."""
    rows, cols = candidates.nonzero(as_tuple=True)
    keep = hardest_fraction(mat.masked_select(candidates), fraction, largest)
    return rows[keep], cols[keep]


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
        pos_largest, fraction = not self.distance.is_inverted, self.filter_percentage
        # The masks are what losses read; the hardest-first list (a sort of the kept pairs) is
        # built only when PML's tuple is asked for.
        return PairSelection(hardest_mask(mat, positive, fraction, pos_largest),
                             hardest_mask(mat, negative, fraction, not pos_largest),
                             lister=lambda: self._listed(mat, positive, negative))

    def pml_tuple(self, embeddings, labels, ref_emb=None, ref_labels=None) -> tuple[torch.Tensor, ...]:
        """PML's hardest-first list alone (no masks): the order and ties of ``torch.topk``, as PML."""
        return self._run(lambda x, refs, pos, neg: self._listed(self.distance(x, refs), pos, neg),
                         embeddings, labels, ref_emb, ref_labels)

    def _listed(self, mat, positive, negative) -> tuple[torch.Tensor, ...]:
        pos_largest, fraction = not self.distance.is_inverted, self.filter_percentage
        return (*hardest_first(mat, positive, fraction, pos_largest),
                *hardest_first(mat, negative, fraction, not pos_largest))
