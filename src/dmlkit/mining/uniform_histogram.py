"""Pairs drawn so that their distances are spread evenly over a histogram's bins."""

from __future__ import annotations

import torch

from dmlkit.core.validation import NONE, Interval, validate_params
from dmlkit.distances import BaseDistance, as_distance
from dmlkit.mining.base import DISTANCE, BaseMiner, SeededMinerMixin, default_distance
from dmlkit.mining.selection import PairSelection


def histogram_bins(values: torch.Tensor, num_bins: int) -> torch.Tensor:
    """``[N]`` bin of each value among ``num_bins`` equal bins over ``[min, max]`` (the last bin closed)."""
    edges = torch.linspace(values.min(), values.max(), steps=num_bins + 1, device=values.device, dtype=values.dtype)
    return (torch.bucketize(values, edges, right=True) - 1).clamp_(0, num_bins - 1)


class UniformHistogramMiner(SeededMinerMixin, BaseMiner):
    """``pos_per_bin`` positive and ``neg_per_bin`` negative pairs from each non-empty distance bin.

    pytorch-metric-learning's miner: the positive (and the negative) pair distances are cut
    into ``num_bins`` equal bins between their minimum and maximum, and each non-empty bin gives
    that many pairs drawn uniformly with replacement, so the mined distances are uniform over
    the range seen. The draws come from the miner's own generator (``seed=``, saved in
    ``state_dict``). The PML tuple lists repeated draws; dmlkit losses count a pair once.
    """

    _repr_keys = ("num_bins", "pos_per_bin", "neg_per_bin", "seed")

    def __init__(self, num_bins: int = 100, pos_per_bin: int = 10, neg_per_bin: int = 10,
                 distance: BaseDistance | None = None, *, seed: int = 0, generator: torch.Generator | None = None):
        super().__init__()
        validate_params(type(self).__name__,
                        {"num_bins": num_bins, "pos_per_bin": pos_per_bin, "neg_per_bin": neg_per_bin,
                         "distance": distance},
                        {"num_bins": [Interval(int, 1, None)], "pos_per_bin": [Interval(int, 0, None)],
                         "neg_per_bin": [Interval(int, 0, None)], "distance": [DISTANCE, NONE]})
        self.num_bins = int(num_bins)
        self.pos_per_bin = int(pos_per_bin)
        self.neg_per_bin = int(neg_per_bin)
        self.distance = as_distance(distance) if distance is not None else default_distance()
        self._init_generator(seed, generator)

    def draw_per_bin(self, values: torch.Tensor, per_bin: int) -> torch.Tensor:
        """``[K * per_bin]`` indices into ``values``: ``per_bin`` uniform draws from each of the ``K`` non-empty bins."""
        if values.numel() == 0 or per_bin == 0:
            return torch.zeros(0, dtype=torch.long, device=values.device)
        bins = histogram_bins(values, self.num_bins)
        order = torch.argsort(bins, stable=True)
        counts = torch.bincount(bins, minlength=self.num_bins)
        starts = counts.cumsum(0) - counts
        filled = (counts > 0).nonzero(as_tuple=True)[0]
        uniform = torch.rand(filled.numel(), per_bin, generator=self.generator, dtype=torch.float64,
                             device=self.generator.device).to(values.device)
        offset = (uniform * counts[filled, None]).long().clamp_max_(counts[filled, None] - 1)
        return order[(starts[filled, None] + offset).reshape(-1)]

    def mine(self, embeddings, ref_emb, positive, negative) -> PairSelection:
        mat = self.distance(embeddings, ref_emb)
        a1, p = positive.nonzero(as_tuple=True)
        a2, n = negative.nonzero(as_tuple=True)
        keep_pos = self.draw_per_bin(mat[a1, p], self.pos_per_bin)
        keep_neg = self.draw_per_bin(mat[a2, n], self.neg_per_bin)
        return PairSelection.from_pairs(a1[keep_pos], p[keep_pos], a2[keep_neg], n[keep_neg], *mat.shape)
