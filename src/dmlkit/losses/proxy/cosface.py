"""CosFace / large margin cosine loss (Wang et al., CVPR 2018)."""

from __future__ import annotations

from dmlkit.core.validation import Interval
from dmlkit.distances import BaseDistance, CosineSimilarity
from dmlkit.losses.base import LOSSES
from dmlkit.losses.proxy._classification import MarginSoftmaxLoss
from dmlkit.losses.proxy._margin_softmax import TargetMargin


@LOSSES.register("cosface")
class CosFaceLoss(MarginSoftmaxLoss):
    """Large margin cosine loss: CosFace Eq. (4).

    ``l_i = -log( e^{s (cos theta_y - m)} / (e^{s (cos theta_y - m)} + sum_{j != y} e^{s cos theta_j}) )``,
    mean over the batch; ``margin`` is m, ``scale`` is s (as PML and the paper). Computed
    ``chunk_size`` classes at a time; ``sample_rate < 1`` is partial FC.
    """

    _repr_keys = ("num_classes", "embedding_size", "margin", "scale", "chunk_size", "sample_rate")
    _parameter_constraints = {"margin": [Interval(float)]}

    def __init__(
        self,
        num_classes: int,
        embedding_size: int,
        margin: float = 0.35,
        scale: float = 64,
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
        self.margin = float(margin)
        self._setup_margin_softmax(scale, chunk_size, sample_rate)
        self._init_weights(weight_init_func)

    def default_distance(self) -> BaseDistance:
        return CosineSimilarity()

    def target_margin(self) -> TargetMargin:
        return TargetMargin("additive_cosine", self.margin)
