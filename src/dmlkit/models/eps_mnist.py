"""The shallow MNIST network of Easy-Positive Sampling (EPS, Appendix C).

Two 3x3 convolutions with 32 and 64 filters, each followed by ReLU and batch norm, a 2x2
max-pool, then a dense layer of 128 units; the Embedder's linear head is the final dense layer
to the embedding (2-D in the paper). Convolutions are unpadded (``28 -> 26 -> 24 -> 12``).
"""

from __future__ import annotations

import torch
from torch import nn

from dmlkit.models._factory import register_model
from dmlkit.models.preprocessing import MNIST_MEAN, MNIST_STD, adapt_cfg_channels, make_cfg


class EPSMnistNet(nn.Module):
    """conv32-ReLU-BN, conv64-ReLU-BN, maxpool 2, dense 128 + ReLU: ``[B, C, 28, 28] -> [B, 128]``."""

    num_features = 128

    def __init__(self, in_chans: int = 1, image_size: int = 28):
        super().__init__()
        pooled = (image_size - 4) // 2
        self.features = nn.Sequential(
            nn.Conv2d(in_chans, 32, 3),
            nn.ReLU(inplace=True),
            nn.BatchNorm2d(32),
            nn.Conv2d(32, 64, 3),
            nn.ReLU(inplace=True),
            nn.BatchNorm2d(64),
            nn.MaxPool2d(2),
        )
        self.dense = nn.Sequential(nn.Flatten(), nn.Linear(64 * pooled * pooled, 128), nn.ReLU(inplace=True))
        cfg = make_cfg(mean=MNIST_MEAN, std=MNIST_STD, input_size=(1, image_size, image_size), color="RGB")
        self.pretrained_cfg = adapt_cfg_channels(cfg, in_chans)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense(self.features(x))


@register_model("eps_mnist_net")
def eps_mnist_net(in_chans: int | None = None, image_size: int = 28) -> EPSMnistNet:
    """EPS's MNIST network up to the 128-unit dense layer (128 features)."""
    return EPSMnistNet(in_chans=in_chans or 1, image_size=image_size)
