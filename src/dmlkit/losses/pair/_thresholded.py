"""Shared base of the losses scaled by ``alpha``/``beta`` around a similarity threshold ``base``."""

from __future__ import annotations

import torch

from dmlkit.core.validation import Interval
from dmlkit.distances import BaseDistance, CosineSimilarity
from dmlkit.losses.pair.base import PairLoss
from dmlkit.losses.pair.batch import PairBatch
from dmlkit.losses.pair.terms import dissimilarity, oriented


class ThresholdedPairLoss(PairLoss):
    """``alpha`` (positives), ``beta`` (negatives) and threshold ``base``, on cosine by default.

    Multi-similarity (Wang et al. 2019) and binomial deviance (Yi et al. 2014) share these
    parameters and the oriented distance-to-threshold :meth:`excess`.
    """

    _repr_keys = ("alpha", "beta", "base", "reduction")

    _parameter_constraints = {
        "alpha": [Interval(float, 0, None, closed="neither")],
        "beta": [Interval(float, 0, None, closed="neither")],
        "base": [Interval(float)],
    }

    def __init__(
        self,
        alpha: float = 2.0,
        beta: float = 50.0,
        base: float = 0.5,
        *,
        distance: BaseDistance | None = None,
        miner: object | None = None,
        reduction: str = "mean",
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
        self.alpha = float(alpha)
        self.beta = float(beta)
        self.base = float(base)

    def default_distance(self) -> BaseDistance:
        return CosineSimilarity()

    def excess(self, batch: PairBatch) -> torch.Tensor:
        """``[B, R]``: how far each pair lies beyond ``base`` in the "farther" direction."""
        measure = self.distance.matrix(batch.embeddings, batch.references)
        return dissimilarity(measure, self.distance) - oriented(self.base, self.distance)
