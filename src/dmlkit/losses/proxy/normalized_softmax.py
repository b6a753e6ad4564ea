"""Normalised softmax (Zhai & Wu, "Classification is a Strong Baseline for Deep Metric Learning", BMVC 2019)."""

from __future__ import annotations

import torch

from dmlkit.core.validation import Interval
from dmlkit.distances import BaseDistance, CosineSimilarity, as_distance, l2_normalize
from dmlkit.losses.base import LOSSES
from dmlkit.losses.proxy._classification import MarginSoftmaxLoss
from dmlkit.losses.proxy._margin_softmax import TargetMargin


@LOSSES.register("normalized_softmax")
class NormalizedSoftmaxLoss(MarginSoftmaxLoss):
    """Softmax cross-entropy over ``sim(x, W_j / |W_j|) / temperature``: Zhai & Wu 2019 Eq. (1)-(2).

    ``l_i = -log( exp(sim(x_i, w_y) / T) / sum_j exp(sim(x_i, w_j) / T) )`` with normalised class
    weights ``w_j``, mean over the batch. The default similarity is the cosine (the paper's, and
    PML's default ``DotProductSimilarity()``, which normalises the embeddings); PML's other
    distances work as in PML (``DotProductSimilarity(normalize_embeddings=False)``: ``<x, w_j>``;
    a distance that is not a similarity enters negated). With the cosine the loss is computed
    ``chunk_size`` classes at a time (and ``sample_rate < 1`` is partial FC); other distances
    build the ``[B, C]`` logits.
    """

    _repr_keys = ("num_classes", "embedding_size", "temperature", "chunk_size", "sample_rate")
    _parameter_constraints = {"temperature": [Interval(float, 0, None, closed="neither")]}

    def __init__(
        self,
        num_classes: int,
        embedding_size: int,
        temperature: float = 0.05,
        chunk_size: int = 1024,
        sample_rate: float = 1.0,
        proxy_init: str = "standard_normal",
        seed: int = 0,
        weight_init_func: object | None = None,
        *,
        distance: object | None = None,
        reducer: object | None = None,
        embedding_regularizer: object | None = None,
        embedding_reg_weight: float = 1.0,
        weight_regularizer: object | None = None,
        weight_reg_weight: float = 1.0,
    ):
        super().__init__(num_classes, embedding_size, 1, proxy_init, seed,
                         distance=distance, reducer=reducer, embedding_regularizer=embedding_regularizer,
                         embedding_reg_weight=embedding_reg_weight, weight_regularizer=weight_regularizer,
                         weight_reg_weight=weight_reg_weight)
        self.temperature = float(temperature)
        self._setup_margin_softmax(1.0 / self.temperature, chunk_size, sample_rate)
        self._init_weights(weight_init_func)

    def default_distance(self) -> BaseDistance:
        return CosineSimilarity()

    def _check_distance(self, distance: object | None, owner: str) -> BaseDistance:
        return CosineSimilarity() if distance is None else as_distance(distance, owner)

    def target_margin(self) -> TargetMargin:
        return TargetMargin("none")

    def get_logits(self, embeddings: torch.Tensor) -> torch.Tensor:
        """``[B, C]`` ``sim(x, W_j / |W_j|) / temperature`` (negated for a distance)."""
        weights = self.weights_as(embeddings)
        logits = self.distance(embeddings.to(weights.dtype), l2_normalize(weights)) / self.temperature
        return logits if self.distance.is_inverted else -logits

    def per_sample_loss(self, embeddings: torch.Tensor, labels: torch.Tensor, chunked: bool = True) -> torch.Tensor:
        if isinstance(self.distance, CosineSimilarity):
            return super().per_sample_loss(embeddings, labels, chunked)
        return torch.nn.functional.cross_entropy(self.get_logits(embeddings), labels, reduction="none")
