"""Histogram loss (Ustinova & Lempitsky, 2016), Eqs. (1)-(4).

The similarities of the positive and of the negative pairs are spread over ``R + 1`` nodes
``t_r = -1 + r Delta`` of ``[-1, 1]`` by linear interpolation (Eqs. (1)-(2)); with ``h+`` and
``h-`` the normalised histograms, the loss estimates the probability that a negative pair is more
similar than a positive one::

    L = sum_r h-_r  sum_{q <= r} h+_q          (Eq. (4))

Each unordered pair counts once, and only pairs of anchors that form a triplet (with both a
positive and a negative), as PML's triplet-based selection does. PML vs paper: none in the value;
PML's ``n_bins=100`` (``delta = 2 / n_bins``) and cosine similarity are kept, and a similarity of
exactly 1 goes to the last node (where PML indexes past the histogram).
"""

from __future__ import annotations

import torch

from dmlkit.core.validation import InstanceOf, Interval
from dmlkit.distances import BaseDistance, CosineSimilarity
from dmlkit.exceptions import AssertedParameterError
from dmlkit.losses.base import LOSSES, zero_loss
from dmlkit.losses.pair.base import PairLoss
from dmlkit.losses.pair.batch import PairBatch
from dmlkit.losses.pair.terms import require_orientation
from dmlkit.losses.ranking._base import node_shares


def interpolated_histogram(values: torch.Tensor, delta: float, num_nodes: int) -> torch.Tensor:
    """``[num_nodes]``: each value in ``[-1, 1]`` split between its two nearest nodes, then normalised (Eq. (2))."""
    index, share = node_shares(values, -1.0, delta, num_nodes)
    hist = values.new_zeros(num_nodes).index_add(0, index + 1, share).index_add(0, index, 1 - share)
    return hist / values.numel()


@LOSSES.register("histogram")
class HistogramLoss(PairLoss):
    """``sum_r h-_r Phi+_r``: the chance that a random negative pair outranks a random positive (Eq. (4))."""

    reductions = ("mean", "mean_nonzero", "sum", "threshold")
    supports_references = False
    #: Hands its terms to the reducer itself, so any reducer object applies (PairLoss.reduces_terms).
    reduces_terms = True
    _parameter_constraints = {
        "n_bins": [Interval(int, 1, None), InstanceOf((type(None),))],
        "delta": [Interval(float, 0, 2, closed="right"), InstanceOf((type(None),))],
    }
    _repr_keys = ("delta",)

    def __init__(
        self, n_bins: int | None = None, delta: float | None = None, *, distance: BaseDistance | None = None,
        miner: object | None = None, reduction: str = "mean", reducer: object | None = None,
        embedding_regularizer: object | None = None, embedding_reg_weight: float = 1.0,
    ):
        if n_bins is not None and delta is not None and delta != 2 / n_bins:  # PML asserts it
            raise AssertedParameterError(
                f"The 'delta' parameter of HistogramLoss must equal 2 / n_bins = {2 / n_bins!r} when both are given. "
                f"Got {delta!r} instead."
            )
        super().__init__(
            distance=distance, miner=miner, reduction=reduction, reducer=reducer,
            embedding_regularizer=embedding_regularizer, embedding_reg_weight=embedding_reg_weight,
        )
        require_orientation(self.distance, "HistogramLoss", True, "a similarity in [-1, 1] (CosineSimilarity)")
        self.delta = float(delta) if delta is not None else 2 / (100 if n_bins is None else n_bins)
        self.num_nodes = round(1 + 2 / self.delta)

    def default_distance(self) -> BaseDistance:
        return CosineSimilarity()

    def compute_pair_loss(self, batch: PairBatch) -> torch.Tensor:
        masks = batch.pair_masks()
        anchors = (masks.positive.any(1) & masks.negative.any(1))[:, None]
        pos, neg = masks.positive & anchors, masks.negative & anchors
        if not pos.any():
            return zero_loss(batch.embeddings)
        pos, neg = (pos | pos.T).triu(1), (neg | neg.T).triu(1)  # unordered pairs, once each
        sim = self.distance.matrix(batch.embeddings, batch.embeddings)
        h_pos = interpolated_histogram(sim[pos], self.delta, self.num_nodes)
        h_neg = interpolated_histogram(sim[neg], self.delta, self.num_nodes)
        return self.reducer((h_neg * h_pos.cumsum(0)).sum().reshape(1))
