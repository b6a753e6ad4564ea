"""Per-backbone input preprocessing: the config each model carries and the function applying it.

A model's ``pretrained_cfg`` says how its weights expect pixels to look. The data pipeline
must read it from the model (``Embedder.pretrained_cfg``) rather than hard-code ImageNet
constants: BN-Inception wants BGR 0-255 mean-subtracted input, timm models want RGB in [0, 1]
normalised by the ImageNet mean/std, and MNIST networks a single grey channel.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
import torch.nn.functional as F

from dmlkit.exceptions import DataError, InvalidParameterError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
MNIST_MEAN = (0.1307,)
MNIST_STD = (0.3081,)
COLORS = ("RGB", "BGR")
CFG_KEYS = ("mean", "std", "input_size", "color", "scale", "interpolation")


def make_cfg(
    *,
    mean: tuple[float, ...],
    std: tuple[float, ...],
    input_size: tuple[int, int, int],
    color: str,
    scale: float = 1.0,
    interpolation: str = "bilinear",
) -> dict[str, Any]:
    """Build a preprocessing config dict with the keys every ``Embedder.pretrained_cfg`` has.

    ``color`` is ``"RGB"`` or ``"BGR"`` (channel order of 3-channel input; grey models, with
    ``input_size[0] == 1``, use ``"RGB"``). ``scale`` is 1.0 for [0, 1] input, 255.0 for 0..255.
    ``mean``/``std`` are in the model's channel order and in units of ``scale`` (so BN-Inception's
    mean is ``(104, 117, 128)`` in BGR order with ``scale=255``).
    """
    cfg = dict(
        mean=tuple(float(m) for m in mean),
        std=tuple(float(s) for s in std),
        input_size=tuple(int(v) for v in input_size),
        color=color,
        scale=float(scale),
        interpolation=interpolation,
    )
    check_cfg(cfg)
    return cfg


def check_cfg(cfg: Mapping[str, Any]) -> None:
    """Raise :class:`InvalidParameterError` when a preprocessing config is incomplete or inconsistent."""
    missing = [k for k in CFG_KEYS if k not in cfg]
    if missing:
        raise InvalidParameterError(f"pretrained_cfg is missing the keys {missing}.")
    channels = cfg["input_size"][0]
    if len(cfg["mean"]) != channels or len(cfg["std"]) != channels:
        raise InvalidParameterError(
            f"pretrained_cfg has input_size {tuple(cfg['input_size'])} but mean has "
            f"{len(cfg['mean'])} and std has {len(cfg['std'])} entries."
        )
    if cfg["color"] not in COLORS:
        raise InvalidParameterError(f"pretrained_cfg color must be one of {COLORS}. Got {cfg['color']!r}.")
    if cfg["color"] == "BGR" and channels != 3:
        raise InvalidParameterError(f"pretrained_cfg color 'BGR' needs 3 input channels. Got {channels}.")
    if cfg["interpolation"] not in ("bilinear", "bicubic", "nearest"):
        raise InvalidParameterError(
            f"pretrained_cfg interpolation must be 'bilinear', 'bicubic' or 'nearest'. Got {cfg['interpolation']!r}."
        )


def adapt_cfg_channels(cfg: Mapping[str, Any], in_chans: int) -> dict[str, Any]:
    """Return ``cfg`` for a model built with ``in_chans`` input channels (mean/std averaged and repeated)."""
    cfg = dict(cfg)
    if in_chans == cfg["input_size"][0]:
        return cfg
    mean = sum(cfg["mean"]) / len(cfg["mean"])
    std = sum(cfg["std"]) / len(cfg["std"])
    cfg["mean"] = (mean,) * in_chans
    cfg["std"] = (std,) * in_chans
    cfg["input_size"] = (in_chans, *cfg["input_size"][1:])
    if in_chans != 3:
        cfg["color"] = "RGB"  # channel order only means something for 3 channels
    return cfg


def preprocess(x: torch.Tensor, cfg: Mapping[str, Any], *, resize: bool = False) -> torch.Tensor:
    """Turn RGB (or grey) images into the model's input as ``cfg`` prescribes.

    ``x`` is ``[B, C, H, W]`` or ``[C, H, W]`` with channels in RGB order (or one grey channel):
    uint8 in 0..255 or floating point in [0, 1]. Steps: to float in [0, 1]; reorder to BGR when
    ``cfg["color"] == "BGR"``; optionally resize to ``cfg["input_size"]``; multiply by
    ``cfg["scale"]``; subtract ``mean`` and divide by ``std``. Returns float32 ``[B, C, H', W']``.
    """
    check_cfg(cfg)
    if not isinstance(x, torch.Tensor):
        raise InvalidParameterError(
            f"preprocess expects a torch.Tensor image batch. Got {type(x).__name__}. Image files, PIL images and "
            "numpy arrays are embedded by a loaded model's embed: dmlkit.load(RUN_DIR).embed([...])."
        )
    squeeze = x.dim() == 3
    if squeeze:
        x = x.unsqueeze(0)
    if x.dim() != 4:
        raise DataError(f"images must be [B, C, H, W] or [C, H, W]. Got shape {tuple(x.shape)}.")
    channels = cfg["input_size"][0]
    if x.shape[1] != channels:
        raise DataError(f"images have {x.shape[1]} channels but the model's input_size is {tuple(cfg['input_size'])}.")
    if x.dtype == torch.uint8:
        x = x.float() / 255.0
    elif x.is_floating_point():
        x = x.float()
    else:
        raise DataError(f"images must be uint8 (0..255) or floating point ([0, 1]). Got dtype {x.dtype}.")
    if cfg["color"] == "BGR":
        x = x.flip(1)
    if resize and tuple(x.shape[-2:]) != tuple(cfg["input_size"][1:]):
        mode = cfg["interpolation"]
        kwargs = {} if mode == "nearest" else dict(align_corners=False, antialias=True)
        x = F.interpolate(x, size=tuple(cfg["input_size"][1:]), mode=mode, **kwargs)
    mean = torch.tensor(cfg["mean"], dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    std = torch.tensor(cfg["std"], dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    x = (x * cfg["scale"] - mean) / std
    return x.squeeze(0) if squeeze else x


class Preprocess:
    """Picklable callable applying :func:`preprocess` with a fixed config (for data loaders).

    Use after a PIL-to-tensor step: ``Preprocess(model.pretrained_cfg)(image_chw_uint8)``.
    """

    def __init__(self, cfg: Mapping[str, Any], *, resize: bool = False):
        check_cfg(cfg)
        self.cfg = dict(cfg)
        self.resize = resize

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        return preprocess(images, self.cfg, resize=self.resize)

    def __repr__(self) -> str:
        c = self.cfg
        return (
            f"Preprocess(color={c['color']!r}, scale={c['scale']}, mean={c['mean']}, std={c['std']}, "
            f"input_size={c['input_size']}, resize={self.resize})"
        )
