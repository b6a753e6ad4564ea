"""Signal-to-noise-ratio contrastive loss (Yuan et al., "Signal-To-Noise Ratio: A Robust Distance
Metric for Deep Metric Learning", CVPR 2019).

Eq. (5): the SNR distance ``d_S(a, b) = var(b - a) / var(a)`` (noise variance over anchor
variance, along the feature dimension, unbiased as PML's ``torch.var``) in the contrastive loss
of Eq. (8), with PML's ``ContrastiveLoss`` hinges and reduction. The distance is
:class:`dmlkit.distances.SNRDistance` (embeddings L2-normalised first, as PML's by default).
"""

from __future__ import annotations

from dmlkit.distances import BaseDistance, SNRDistance
from dmlkit.losses.base import LOSSES
from dmlkit.losses.pair.contrastive import ContrastiveLoss


@LOSSES.register("snr_contrastive")
class SignalToNoiseRatioContrastiveLoss(ContrastiveLoss):
    """``ContrastiveLoss`` on the SNR distance: ``[d_S(a, p) - pos_margin]_+`` and ``[neg_margin - d_S(a, n)]_+``."""

    def default_distance(self) -> BaseDistance:
        return SNRDistance()
