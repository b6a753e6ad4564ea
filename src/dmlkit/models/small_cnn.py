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
    """Strided 3x3 conv-BN-ReLU blocks: ``[B, C, 28, 28] -> [B, width*4, 4, 4]`` (three blocks).

    ``depth`` blocks with ``width``, ``2*width``, then ``4*width`` channels; ``downsample="stride"``
    halves the map with a stride-2 convolution, ``"max"`` with a stride-1 convolution followed by
    2x2 max pooling (the classic few-shot Omniglot block). With ``keep_spatial=True`` the final
    map is flattened into the channel axis (``[B, channels*H*W, 1, 1]``), so the head's global
    pooling keeps where strokes are; for digits that layout matters.
    """

    def __init__(self, in_chans: int = 1, width: int = 16, keep_spatial: bool = False, depth: int = 3,
                 downsample: str = "stride"):
        super().__init__()
        if downsample not in ("stride", "max"):
            raise ValueError(f"The 'downsample' parameter of SmallCNN must be 'stride' or 'max'. Got {downsample!r}.")
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"The 'depth' parameter of SmallCNN must be an int >= 1. Got {depth!r}.")
        layers: list[nn.Module] = []
        channels = in_chans
        for i in range(depth):
            out = width * 2 ** min(i, 2)
            if downsample == "stride":
                layers.append(conv_bn_relu(channels, out, 2))
            else:
                layers += [conv_bn_relu(channels, out, 1), nn.MaxPool2d(2)]
            channels = out
        self.features = nn.Sequential(*layers)
        self.keep_spatial = keep_spatial
        side = 28
        for _ in range(depth):
            side = (side + 1) // 2 if downsample == "stride" else side // 2
        self.num_features = channels * (side * side if keep_spatial else 1)
        cfg = make_cfg(mean=MNIST_MEAN, std=MNIST_STD, input_size=(1, 28, 28), color="RGB")
        self.pretrained_cfg = adapt_cfg_channels(cfg, in_chans)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.features(x)
        if self.keep_spatial:
            return features.flatten(1)[:, :, None, None]
        return features


@register_model("small_cnn")
def small_cnn(in_chans: int | None = None, width: int = 16, keep_spatial: bool = False, depth: int = 3,
              downsample: str = "stride") -> SmallCNN:
    """Small CNN for 28x28 grey input (default 3 strided blocks, 1 channel, 64 features; see :class:`SmallCNN`)."""
    return SmallCNN(in_chans=in_chans or 1, width=width, keep_spatial=keep_spatial, depth=depth, downsample=downsample)
