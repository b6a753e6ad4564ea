"""A small, fast CNN for 28x28 grey images (MNIST-sized smoke tests and CPU runs)."""

from __future__ import annotations

import torch
from torch import nn

from dmlkit.models._factory import register_model
from dmlkit.models.preprocessing import MNIST_MEAN, MNIST_STD, adapt_cfg_channels, make_cfg


def conv_bn_relu(in_channels: int, out_channels: int, stride: int) -> nn.Sequential:
    """3x3 convolution (no bias) -> batch norm -> ReLU."""
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    )


class SmallCNN(nn.Module):
    """Three strided 3x3 conv-BN-ReLU blocks: ``[B, C, 28, 28] -> [B, width*4, 4, 4]``.

    With ``keep_spatial=True`` the ``4 x 4`` map is flattened into the channel axis
    (``[B, width*4*16, 1, 1]``), so the head's global pooling keeps where strokes are; for
    digits that layout matters (global average pooling of a 4x4 map discards it).
    """

    def __init__(self, in_chans: int = 1, width: int = 16, keep_spatial: bool = False):
        super().__init__()
        self.features = nn.Sequential(
            conv_bn_relu(in_chans, width, 2),
            conv_bn_relu(width, 2 * width, 2),
            conv_bn_relu(2 * width, 4 * width, 2),
        )
        self.keep_spatial = keep_spatial
        self.num_features = 4 * width * (16 if keep_spatial else 1)
        cfg = make_cfg(mean=MNIST_MEAN, std=MNIST_STD, input_size=(1, 28, 28), color="RGB")
        self.pretrained_cfg = adapt_cfg_channels(cfg, in_chans)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.features(x)
        if self.keep_spatial:
            return features.flatten(1)[:, :, None, None]
        return features


@register_model("small_cnn")
def small_cnn(in_chans: int | None = None, width: int = 16, keep_spatial: bool = False) -> SmallCNN:
    """Small strided CNN for 28x28 grey input (default 1 channel, 64 features; see ``keep_spatial``)."""
    return SmallCNN(in_chans=in_chans or 1, width=width, keep_spatial=keep_spatial)
