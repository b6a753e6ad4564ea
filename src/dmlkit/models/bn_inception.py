"""BN-Inception (Inception-v2 with batch norm), the standard DML backbone (ASAP, Proxy-Anchor, DRO).

Ioffe & Szegedy 2015, Table 1, in the Caffe-converted variant used throughout DML code
(input 224, 1024-d output; blocks 4c/4d are 608 channels wide, 4e 1056). Parameter names
follow that converted model (``conv1_7x7_s2``, ``inception_3a_1x1_bn``, ...) so its usual
ImageNet weight file loads with ``create_model("bn_inception", weights=PATH)``. Input is BGR,
0-255, mean-subtracted — see :data:`BN_INCEPTION_CFG`. ``pretrained=True`` without a file takes
that ImageNet file from Cadene's pretrained-models release (:data:`BN_INCEPTION_IMAGENET`), the one the
Proxy-Anchor and DRO code load, through the torch hub cache (:mod:`dmlkit.models.hub`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dmlkit.models._factory import register_model
from dmlkit.models.hub import UrlWeights, register_url_weights
from dmlkit.models.preprocessing import adapt_cfg_channels, make_cfg

BN_INCEPTION_CFG = make_cfg(
    mean=(104.0, 117.0, 128.0),  # B, G, R means in 0..255 units
    std=(1.0, 1.0, 1.0),
    input_size=(3, 224, 224),
    color="BGR",
    scale=255.0,
    interpolation="bilinear",
)


@dataclass(frozen=True)
class InceptionSpec:
    """Widths of one Inception block; ``single=None`` marks a stride-2 (grid-reduction) block."""

    name: str
    in_channels: int
    single: int | None  # 1x1 branch
    reduce3: int  # 3x3 branch: 1x1 reduce -> 3x3
    out3: int
    reduce_double: int  # double-3x3 branch: 1x1 reduce -> 3x3 -> 3x3
    out_double: int
    pool: str  # "avg" or "max"
    pool_proj: int | None  # 1x1 projection after pooling (None: pass-through, stride-2 blocks)

    @property
    def stride(self) -> int:
        return 2 if self.single is None else 1

    @property
    def out_channels(self) -> int:
        pooled = self.pool_proj if self.pool_proj is not None else self.in_channels
        return (self.single or 0) + self.out3 + self.out_double + pooled


SPECS = (
    InceptionSpec("3a", 192, 64, 64, 64, 64, 96, "avg", 32),
    InceptionSpec("3b", 256, 64, 64, 96, 64, 96, "avg", 64),
    InceptionSpec("3c", 320, None, 128, 160, 64, 96, "max", None),
    InceptionSpec("4a", 576, 224, 64, 96, 96, 128, "avg", 128),
    InceptionSpec("4b", 576, 192, 96, 128, 96, 128, "avg", 128),
    InceptionSpec("4c", 576, 160, 128, 160, 128, 160, "avg", 128),
    InceptionSpec("4d", 608, 96, 128, 192, 160, 192, "avg", 128),
    InceptionSpec("4e", 608, None, 128, 192, 192, 256, "max", None),
    InceptionSpec("5a", 1056, 352, 192, 320, 160, 224, "avg", 128),
    InceptionSpec("5b", 1024, 352, 192, 320, 192, 224, "max", 128),
)


class BNInception(nn.Module):
    """BN-Inception trunk: ``[B, 3, H, W] -> [B, 1024, H/32, W/32]`` (H, W multiples of 32)."""

    num_features = 1024

    def __init__(self, in_chans: int = 3):
        super().__init__()
        self._add_conv_bn("conv1_7x7_s2", in_chans, 64, 7, stride=2, padding=3)
        self._add_conv_bn("conv2_3x3_reduce", 64, 64, 1)
        self._add_conv_bn("conv2_3x3", 64, 192, 3, padding=1)
        for spec in SPECS:
            self._add_block(spec)
        self.pretrained_cfg = adapt_cfg_channels(BN_INCEPTION_CFG, in_chans)

    def _add_conv_bn(self, name: str, cin: int, cout: int, kernel: int, stride: int = 1, padding: int = 0) -> None:
        self.add_module(name, nn.Conv2d(cin, cout, kernel, stride=stride, padding=padding))
        self.add_module(f"{name}_bn", nn.BatchNorm2d(cout, eps=1e-5))

    def _add_block(self, spec: InceptionSpec) -> None:
        p, cin = f"inception_{spec.name}", spec.in_channels
        if spec.single is not None:
            self._add_conv_bn(f"{p}_1x1", cin, spec.single, 1)
        self._add_conv_bn(f"{p}_3x3_reduce", cin, spec.reduce3, 1)
        self._add_conv_bn(f"{p}_3x3", spec.reduce3, spec.out3, 3, stride=spec.stride, padding=1)
        self._add_conv_bn(f"{p}_double_3x3_reduce", cin, spec.reduce_double, 1)
        self._add_conv_bn(f"{p}_double_3x3_1", spec.reduce_double, spec.out_double, 3, padding=1)
        self._add_conv_bn(f"{p}_double_3x3_2", spec.out_double, spec.out_double, 3, stride=spec.stride, padding=1)
        if spec.pool_proj is not None:
            self._add_conv_bn(f"{p}_pool_proj", cin, spec.pool_proj, 1)

    def _unit(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """conv -> batch norm -> ReLU for the layer called ``name``."""
        return F.relu(getattr(self, f"{name}_bn")(getattr(self, name)(x)), inplace=True)

    def _block(self, spec: InceptionSpec, x: torch.Tensor) -> torch.Tensor:
        p = f"inception_{spec.name}"
        branches = []
        if spec.single is not None:
            branches.append(self._unit(f"{p}_1x1", x))
        branches.append(self._unit(f"{p}_3x3", self._unit(f"{p}_3x3_reduce", x)))
        double = self._unit(f"{p}_double_3x3_1", self._unit(f"{p}_double_3x3_reduce", x))
        branches.append(self._unit(f"{p}_double_3x3_2", double))
        if spec.stride == 2:
            branches.append(F.max_pool2d(x, 3, stride=2, ceil_mode=True))
        else:
            if spec.pool == "avg":
                pooled = F.avg_pool2d(x, 3, stride=1, padding=1, ceil_mode=True, count_include_pad=True)
            else:
                pooled = F.max_pool2d(x, 3, stride=1, padding=1, ceil_mode=True)
            branches.append(self._unit(f"{p}_pool_proj", pooled))
        return torch.cat(branches, dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(self._unit("conv1_7x7_s2", x), 3, stride=2, ceil_mode=True)
        x = self._unit("conv2_3x3", self._unit("conv2_3x3_reduce", x))
        x = F.max_pool2d(x, 3, stride=2, ceil_mode=True)
        for spec in SPECS:
            x = self._block(spec, x)
        return x


@register_model("bn_inception")
def bn_inception(in_chans: int | None = None) -> BNInception:
    """BN-Inception trunk (1024 features, BGR 0-255 input); ImageNet weights: :data:`BN_INCEPTION_IMAGENET`."""
    return BNInception(in_chans=in_chans or 3)


#: The ImageNet BN-Inception the DML papers' code loads (Cadene's pretrained-models, ``model_zoo.load_url``);
#: ``52deb4733`` in the name is the start of the file's SHA-256, checked after the download.
BN_INCEPTION_IMAGENET = UrlWeights(
    url="http://data.lip6.fr/cadene/pretrainedmodels/bn_inception-52deb4733.pth",
    tag="bn_inception.cadene_in1k",
    origin="Cadene's pretrained-models, as the Proxy-Anchor and DRO code load it",
)
register_url_weights("bn_inception", BN_INCEPTION_IMAGENET)
