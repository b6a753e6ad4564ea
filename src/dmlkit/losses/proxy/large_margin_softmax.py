"""L-Softmax (Liu et al., ICML 2016) and SphereFace / A-Softmax (Liu et al., CVPR 2017)."""

from __future__ import annotations

import math

import torch

from dmlkit.core.validation import Interval
from dmlkit.distances import BaseDistance, CosineSimilarity
from dmlkit.losses.base import LOSSES
from dmlkit.losses.proxy._classification import ClassificationLoss
from dmlkit.losses.proxy._math import safe_norms, unit_vectors


def multiplicative_angular_margin(cos: torch.Tensor, margin: int) -> torch.Tensor:
    """``psi(theta) = (-1)^k cos(m theta) - 2k`` for ``theta in [k pi/m, (k+1) pi/m]``: L-Softmax Eq. (6).

    ``cos(m theta)`` is the Chebyshev polynomial ``T_m(cos theta)`` (Eq. (7)'s expansion, by the
    recurrence ``T_{n+1} = 2 c T_n - T_{n-1}``); ``k`` carries no gradient (``cos`` clamped to [-1, 1] for it).
    """
    previous, current = torch.ones_like(cos), cos
    for _ in range(margin - 1):
        previous, current = current, 2 * cos * current - previous
    with torch.no_grad():
        k = torch.floor(torch.acos(cos.clamp(-1.0, 1.0)) / (math.pi / margin))
    return (1 - 2 * torch.remainder(k, 2)) * current - 2 * k


@LOSSES.register("large_margin_softmax")
class LargeMarginSoftmaxLoss(ClassificationLoss):
    """Large-margin softmax: L-Softmax Eq. (4)-(6).

    ``f_j = |W_j| |x| cos theta_j`` and, for the target, ``|W_y| |x| psi(theta_y)`` (see
    :func:`multiplicative_angular_margin`); ``l_i`` is the softmax cross-entropy of ``scale * f``,
    mean over the batch. ``margin`` is the integer m (PML casts it with ``int``); ``scale`` (PML's,
    default 1 = the paper) multiplies every logit.
    """

    _repr_keys = ("num_classes", "embedding_size", "margin", "scale")
    _parameter_constraints = {
        "margin": [Interval(float, 1, None)],
        "scale": [Interval(float, 0, None, closed="neither")],
    }
    #: Whether the logits carry the class weights' norms (L-Softmax) or only the embedding's (SphereFace).
    weight_norms: bool = True

    def __init__(
        self,
        num_classes: int,
        embedding_size: int,
        margin: int = 4,
        scale: float = 1,
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
        self.margin = int(margin)
        self.scale = float(scale)
        self._init_weights(weight_init_func)

    def default_distance(self) -> BaseDistance:
        return CosineSimilarity()

    def cosines_and_magnitudes(self, embeddings: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos [B, C], factor)``: the cosines and what each is multiplied by before ``scale``
        (``|x_i| |W_j|``, or ``|x_i|`` alone for SphereFace), with norms safe from over- and underflow."""
        weight = self.W_as(embeddings)
        embeddings = embeddings.to(weight.dtype)
        x_norm, w_norm = safe_norms(embeddings, 1), safe_norms(weight, 0)
        cos = unit_vectors(embeddings, 1) @ unit_vectors(weight, 0)
        return cos, x_norm[:, None] * w_norm[None, :] if self.weight_norms else x_norm[:, None]

    def get_logits(self, embeddings: torch.Tensor) -> torch.Tensor:
        """``[B, C]`` ``scale * magnitudes * cos`` (no margin), as PML's ``get_logits``."""
        cos, factor = self.cosines_and_magnitudes(embeddings)
        return cos * factor * self.scale

    def per_sample_loss(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        # |x_i| |W_j| cos theta_j (SphereFace: |x_i| cos theta_j) is the plain product x_i . W_j (W_j / |W_j|):
        # one [B, C] product and no [B, C] normalisation passes; only the target's cosine is recovered,
        # from B norms, for psi.
        weight = self.W_as(embeddings)
        embeddings = embeddings.to(weight.dtype)
        if not self.weight_norms:
            weight = unit_vectors(weight, 0)
        logits = embeddings @ weight
        magnitude = safe_norms(embeddings, 1)
        if self.weight_norms:
            magnitude = magnitude * safe_norms(weight.index_select(1, labels), 0)
        raw = logits.gather(1, labels[:, None]).squeeze(1)
        cos = raw / torch.where(magnitude > 0, magnitude, torch.ones_like(magnitude))
        target = magnitude * multiplicative_angular_margin(cos, self.margin)
        logits = torch.scatter(logits, 1, labels[:, None], target[:, None])
        if self.scale != 1.0:
            logits = logits * self.scale
        return torch.nn.functional.cross_entropy(logits, labels, reduction="none")


@LOSSES.register("sphereface")
class SphereFaceLoss(LargeMarginSoftmaxLoss):
    """A-Softmax: SphereFace Eq. (7)-(8), L-Softmax with normalised class weights.

    ``l_i = -log( e^{|x| psi(theta_y)} / (e^{|x| psi(theta_y)} + sum_{j != y} e^{|x| cos theta_j}) )``,
    ``psi`` as L-Softmax's; ``margin`` m (default 4, the paper's) and PML's ``scale`` on every logit.
    The paper's training-time blend with the plain softmax (``lambda`` annealing, in its code) is
    not part of the loss (as in PML).
    """

    weight_norms = False
