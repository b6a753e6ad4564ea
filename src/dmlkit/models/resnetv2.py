"""ResNetV2-20: the pre-activation ResNet of He et al. 2016 (Identity Mappings) for small images.

ASAP Sec. 5 uses it for MNIST. 3 stages of 3 pre-activation basic blocks (16, 32, 64 channels),
a 3x3 stem, and a final BN-ReLU; ``[B, 1, 28, 28] -> [B, 64, 7, 7]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dmlkit.models._factory import register_model
from dmlkit.models.preprocessing import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    MNIST_MEAN,
    MNIST_STD,
    adapt_cfg_channels,
    make_cfg,
)


class PreActBasicBlock(nn.Module):
    """BN-ReLU-conv3x3-BN-ReLU-conv3x3 plus identity (or 1x1 projection) shortcut."""

    def __init__(self, in_channels: int, out_channels: int, stride: int):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_channels)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.shortcut = (
            nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False)
            if stride != 1 or in_channels != out_channels
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = F.relu(self.bn1(x))
        shortcut = x if self.shortcut is None else self.shortcut(pre)
        out = self.conv1(pre)
        out = self.conv2(F.relu(self.bn2(out)))
        return out + shortcut


class PreActResNet(nn.Module):
    """Pre-activation ResNet for small images with ``depth = 6n + 2`` layers."""

    def __init__(self, depth: int = 20, in_chans: int = 1, widths: tuple[int, ...] = (16, 32, 64), image_size: int = 28):
        super().__init__()
        if (depth - 2) % 6 != 0:
            raise ValueError(f"PreActResNet depth must be 6n + 2. Got {depth}.")
        blocks_per_stage = (depth - 2) // 6
        self.stem = nn.Conv2d(in_chans, widths[0], 3, padding=1, bias=False)
        layers, cin = [], widths[0]
        for stage, width in enumerate(widths):
            for index in range(blocks_per_stage):
                stride = 2 if stage > 0 and index == 0 else 1
                layers.append(PreActBasicBlock(cin, width, stride))
                cin = width
        self.blocks = nn.Sequential(*layers)
        self.final_bn = nn.BatchNorm2d(cin)
        self.num_features = cin
        if in_chans == 1:
            cfg = make_cfg(mean=MNIST_MEAN, std=MNIST_STD, input_size=(1, image_size, image_size), color="RGB")
        else:
            cfg = make_cfg(mean=IMAGENET_MEAN, std=IMAGENET_STD, input_size=(3, image_size, image_size), color="RGB")
        self.pretrained_cfg = adapt_cfg_channels(cfg, in_chans)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.final_bn(self.blocks(self.stem(x))))


@register_model("resnetv2_20")
def resnetv2_20(in_chans: int | None = None, image_size: int = 28) -> PreActResNet:
    """ResNetV2-20 (pre-activation, 64 features) for 28x28 / 32x32 images (ASAP's MNIST net)."""
    return PreActResNet(depth=20, in_chans=in_chans or 1, image_size=image_size)
