"""Signal-to-noise-ratio contrastive loss (Yuan et al., "Signal-To-Noise Ratio: A Robust Distance
Metric for Deep Metric Learning", CVPR 2019).

Eq. (5): the SNR distance ``d_S(a, b) = var(b - a) / var(a)`` (noise variance over anchor
variance, along the feature dimension, unbiased as PML's ``torch.var``) in the contrastive loss
of Eq. (8), with PML's ``ContrastiveLoss`` hinges and reduction. Embeddings are L2-normalised
first, as PML's ``SNRDistance`` does by default. ``var(b - a)`` is computed from one matrix
product (``(|a|^2 + |b|^2 - 2 a.b - D (mean a - mean b)^2) / (D - 1)``), not from the
``[B, R, D]`` differences; an anchor with zero variance gets the ratio over ``1e-12`` instead of
a division by zero.
"""

from __future__ import annotations

import torch

from dmlkit.distances import BaseDistance, l2_normalize
from dmlkit.losses.base import LOSSES
from dmlkit.losses.pair.contrastive import ContrastiveLoss


class _SignalToNoiseRatio(BaseDistance):
    """``var(y_j - x_i) / var(x_i)`` between L2-normalised rows ``x [B, D]`` and ``y [R, D]`` (Yuan et al. Eq. (5))."""

    def pairwise(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x, y = l2_normalize(x), l2_normalize(y)
        dim = x.shape[1]
        x_mean, y_mean = x.mean(1), y.mean(1)
        squared = (x.square().sum(1)[:, None] + y.square().sum(1)[None, :] - 2.0 * (x @ y.T)).clamp_min(0.0)
        noise = (squared - dim * (x_mean[:, None] - y_mean[None, :]).square()).clamp_min(0.0) / max(dim - 1, 1)
        signal = x.var(1) if dim > 1 else torch.zeros_like(x_mean)
        return noise / signal.clamp_min(1e-12)[:, None]


@LOSSES.register("snr_contrastive")
class SignalToNoiseRatioContrastiveLoss(ContrastiveLoss):
    """``ContrastiveLoss`` on the SNR distance: ``[d_S(a, p) - pos_margin]_+`` and ``[neg_margin - d_S(a, n)]_+``."""

    def default_distance(self) -> BaseDistance:
        return _SignalToNoiseRatio()
