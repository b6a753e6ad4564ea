"""A small, fast CNN for small images (digits, glyphs, icons: MNIST-sized data and CPU runs)."""

from __future__ import annotations

import torch
from torch import nn

from dmlkit.models._factory import register_model
from dmlkit.models.preprocessing import MNIST_MEAN, MNIST_STD, adapt_cfg_channels, make_cfg

#: With ``downsample="auto"``, inputs at least this many pixels a side are downsampled by max
#: pooling; smaller ones (8x8 digits) by strided convolutions (docs/recipes.md: on 8x8 digits
#: pooling blocks measured MAP@R 0.25 against 0.41 for strided ones).
POOL_FROM_SIDE = 16

DOWNSAMPLING = ("auto", "max", "stride")


class ConvBlock(nn.Module):
    """3x3 convolution that halves the map, then batch norm -> ReLU.

    ``pool=True``: a stride-1 convolution followed by 2x2 max pooling (the classic few-shot glyph
    block; pooling before the normalisation and activation costs a quarter of pooling after them);
    ``pool=False``: a stride-2 convolution (cheaper, but it aliases: embeddings move more with
    one-pixel shifts). Both use the same weights, so the choice can follow the input size.
    """

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(out_channels)

    def forward(self, x: torch.Tensor, pool: bool) -> torch.Tensor:
        if pool:
            x = nn.functional.max_pool2d(self.conv(x), 2)
        else:
            x = nn.functional.conv2d(x, self.conv.weight, None, stride=2, padding=1)
        return nn.functional.relu(self.bn(x), inplace=True)


def output_side(side: int, depth: int, pool: bool) -> int:
    """The side of the final feature map for a ``side`` x ``side`` input."""
    for _ in range(depth):
        side = side // 2 if pool else (side + 1) // 2
    return side


class SmallCNN(nn.Module):
    """A few 3x3 conv blocks for small images: ``[B, C, H, W] -> [B, width*4, h, w]`` (three blocks).

    ``depth`` blocks (:class:`ConvBlock`) with ``width``, ``2*width``, then ``4*width`` channels,
    each halving the map. ``downsample="max"`` pools (28x28 -> 14 -> 7 -> 3), ``"stride"`` strides
    the convolutions (28 -> 14 -> 7 -> 4), ``"auto"`` (default) pools inputs of at least
    :data:`POOL_FROM_SIDE` pixels a side and strides smaller ones. Activations run in channels-last
    layout (faster convolutions and pooling on CPU). With ``keep_spatial=True`` the final map of a
    28x28 input is flattened into the channel axis (``[B, channels*h*w, 1, 1]``), so the head's
    global pooling keeps where strokes are.
    """

    def __init__(self, in_chans: int = 1, width: int = 16, keep_spatial: bool = False, depth: int = 3,
                 downsample: str = "auto"):
        super().__init__()
        if downsample not in DOWNSAMPLING:
            raise ValueError(f"The 'downsample' parameter of SmallCNN must be one of {DOWNSAMPLING}. Got {downsample!r}.")
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"The 'depth' parameter of SmallCNN must be an int >= 1. Got {depth!r}.")
        widths = [width * 2 ** min(i, 2) for i in range(depth)]
        self.blocks = nn.ModuleList(ConvBlock(c_in, c_out) for c_in, c_out in zip([in_chans, *widths], widths))
        self.blocks.to(memory_format=torch.channels_last)
        self.downsample = downsample
        self.keep_spatial = keep_spatial
        side = output_side(28, depth, self.pools(28))
        self.num_features = widths[-1] * (side * side if keep_spatial else 1)
        cfg = make_cfg(mean=MNIST_MEAN, std=MNIST_STD, input_size=(1, 28, 28), color="RGB")
        self.pretrained_cfg = adapt_cfg_channels(cfg, in_chans)

    def pools(self, side: int) -> bool:
        """Whether an input ``side`` pixels a side is downsampled by max pooling."""
        return self.downsample == "max" or (self.downsample == "auto" and side >= POOL_FROM_SIDE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pool = self.pools(min(x.shape[-2:]))
        features = x.contiguous(memory_format=torch.channels_last)
        for block in self.blocks:
            features = block(features, pool)
        if self.keep_spatial:
            return features.flatten(1)[:, :, None, None]
        return features


@register_model("small_cnn")
def small_cnn(in_chans: int | None = None, width: int = 16, keep_spatial: bool = False, depth: int = 3,
              downsample: str = "auto") -> SmallCNN:
    """Small CNN for small grey input (default 3 conv-pool blocks, 1 channel, 64 features; see :class:`SmallCNN`)."""
    return SmallCNN(in_chans=in_chans or 1, width=width, keep_spatial=keep_spatial, depth=depth, downsample=downsample)
