"""Image transforms: Musgrave/ASAP and Proxy-Anchor pipelines, per-backbone normalisation.

Training (ASAP App. A.2, after Musgrave et al. 2020): shorter side to 256, random resized crop
(area 16-100 %, aspect 3/4-4/3), resize to 227, horizontal flip p=0.5. Evaluation: shorter side
256, centre crop 227. Proxy-Anchor (Sec. 5.1): random resized crop 224 + flip; resize 256,
centre crop 224. Normalisation (mean, std, input range, channel order) comes from the
backbone's preprocessing dict, never from constants here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch
from torch import nn

from dmlkit.core.devices import host_to_device
from dmlkit.exceptions import InvalidParameterError

PRESETS = ("musgrave", "proxy_anchor")


@dataclass(frozen=True)
class Preprocessing:
    """What a backbone expects: per-channel ``mean``/``std`` (in units of ``scale``), channels, order.

    ``scale`` is 1 for inputs in [0, 1] or 255 for [0, 255] (BN-Inception); ``color`` is
    ``"RGB"`` or ``"BGR"``; ``channels`` is ``input_size[0]``.
    """

    mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    std: tuple[float, ...] = (1.0, 1.0, 1.0)
    channels: int = 3
    color: str = "RGB"
    scale: float = 1.0
    input_size: tuple[int, ...] | None = None

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any] | "Preprocessing" | None) -> "Preprocessing":
        """Read a ``pretrained_cfg``-like dict (keys ``mean``, ``std``, ``input_size``, ``color``, ``scale``)."""
        if cfg is None:
            return cls(mean=(), std=())
        if isinstance(cfg, Preprocessing):
            return cfg
        if not isinstance(cfg, Mapping):
            raise InvalidParameterError(
                f"The preprocessing config must be a dict with keys mean, std, input_size, color, scale. "
                f"Got {type(cfg).__name__} instead."
            )
        input_size = tuple(cfg["input_size"]) if cfg.get("input_size") is not None else None
        channels = int(input_size[0]) if input_size else len(cfg.get("mean", (0, 0, 0)))
        mean = tuple(float(v) for v in cfg.get("mean", (0.0,) * channels))
        std = tuple(float(v) for v in cfg.get("std", (1.0,) * channels))
        color = str(cfg.get("color", "RGB")).upper()
        scale = float(cfg.get("scale", 1))
        if color not in ("RGB", "BGR"):
            raise InvalidParameterError(
                f"The 'color' entry of the preprocessing config must be 'RGB' or 'BGR'. Got {color!r} instead."
            )
        if scale not in (1.0, 255.0):
            raise InvalidParameterError(
                f"The 'scale' entry of the preprocessing config must be 1 or 255. Got {cfg.get('scale')!r} instead."
            )
        if len(mean) != channels or len(std) != channels:
            raise InvalidParameterError(
                f"The preprocessing config has {len(mean)} mean and {len(std)} std values but {channels} input channels."
            )
        if any(s <= 0 for s in std):
            raise InvalidParameterError(f"The 'std' entry of the preprocessing config must be > 0. Got {std} instead.")
        return cls(mean=mean, std=std, channels=channels, color=color, scale=scale, input_size=input_size)


class BackboneNormalize(nn.Module):
    """Map a float image ``[..., C, H, W]`` in [0, 1] to a backbone's input convention.

    Grey images (C=1) are repeated to ``channels``; RGB is flipped to BGR when asked; values are
    multiplied by ``scale`` and standardised with ``mean``/``std``. With an empty ``mean`` only the
    channel handling is applied.
    """

    batched = True  # works on [C, H, W] and [B, C, H, W] alike; deterministic

    def __init__(self, preprocessing: Preprocessing | Mapping[str, Any] | None):
        super().__init__()
        self.pre = Preprocessing.from_config(preprocessing)
        self.register_buffer("mean", torch.tensor(self.pre.mean).view(-1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(self.pre.std).view(-1, 1, 1), persistent=False)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        pre = self.pre
        if pre.mean and image.shape[-3] == 1 and pre.channels == 3:
            image = image.expand(*image.shape[:-3], 3, *image.shape[-2:])
        elif pre.mean and image.shape[-3] == 3 and pre.channels == 1:
            weights = torch.tensor([0.299, 0.587, 0.114], dtype=image.dtype, device=image.device).view(3, 1, 1)
            image = (image * weights).sum(dim=-3, keepdim=True)
        if pre.color == "BGR" and image.shape[-3] == 3:
            image = image.flip(-3)
        if pre.scale != 1.0:
            image = image * pre.scale
        if pre.mean:
            image = (image - self.mean.to(image.device, image.dtype)) / self.std.to(image.device, image.dtype)
        return image.contiguous()

    def extra_repr(self) -> str:
        p = self.pre
        return f"mean={p.mean}, std={p.std}, channels={p.channels}, color={p.color}, scale={p.scale:g}"


def _resize_for(crop_size: int, preset: str) -> int:
    """Shorter-side size before cropping: 256 for the published crops (227 / 224), scaled otherwise."""
    reference = 227 if preset == "musgrave" else 224
    return int(round(crop_size * 256 / reference))


def _check_preset(preset: str) -> None:
    if preset not in PRESETS:
        raise InvalidParameterError(
            f"The 'preset' parameter of the transforms must be one of {{{', '.join(map(repr, PRESETS))}}}. "
            f"Got {preset!r} instead."
        )


def train_transform(
    preset: str = "musgrave",
    preprocessing: Mapping[str, Any] | Preprocessing | None = None,
    image_size: int | None = None,
    *,
    crop_scale: Sequence[float] | None = None,
    crop_ratio: Sequence[float] = (3 / 4, 4 / 3),
) -> nn.Module:
    """Training augmentation for PIL images (ASAP App. A.2 / Musgrave; or Proxy-Anchor Sec. 5.1).

    ``musgrave``: shorter side 256, random resized crop area ``crop_scale`` (default 0.16-1) and
    aspect 3/4-4/3 to 227, horizontal flip. ``proxy_anchor``: random resized crop (area 0.08-1) to
    224, flip. ``image_size`` replaces 227/224. Returns a float tensor ``[C, H, W]``.
    """
    from torchvision import transforms as T

    _check_preset(preset)
    size = image_size or (227 if preset == "musgrave" else 224)
    steps: list[nn.Module] = []
    if preset == "musgrave":
        steps.append(T.Resize(_resize_for(size, preset)))
        scale = tuple(crop_scale) if crop_scale is not None else (0.16, 1.0)
    else:
        scale = tuple(crop_scale) if crop_scale is not None else (0.08, 1.0)
    steps += [
        T.RandomResizedCrop(size, scale=scale, ratio=tuple(crop_ratio)),
        T.RandomHorizontalFlip(0.5),
        T.PILToTensor(),
        T.ConvertImageDtype(torch.float32),
        BackboneNormalize(preprocessing),
    ]
    return T.Compose(steps)


def eval_transform(
    preset: str = "musgrave",
    preprocessing: Mapping[str, Any] | Preprocessing | None = None,
    image_size: int | None = None,
) -> nn.Module:
    """Evaluation transform for PIL images: shorter side 256, centre crop 227 (or 224 for ``proxy_anchor``)."""
    from torchvision import transforms as T

    _check_preset(preset)
    size = image_size or (227 if preset == "musgrave" else 224)
    return T.Compose(
        [
            T.Resize(_resize_for(size, preset)),
            T.CenterCrop(size),
            T.PILToTensor(),
            T.ConvertImageDtype(torch.float32),
            BackboneNormalize(preprocessing),
        ]
    )


def small_image_transform(
    preprocessing: Mapping[str, Any] | Preprocessing | None = None, image_size: int | None = None
) -> nn.Module:
    """Transform for small grey images on disk (Omniglot): resize to ``image_size``, to tensor, normalise."""
    from torchvision import transforms as T

    steps: list[nn.Module] = []
    if image_size is not None:
        steps.append(T.Resize((image_size, image_size)))
    steps += [T.PILToTensor(), T.ConvertImageDtype(torch.float32), BackboneNormalize(preprocessing)]
    return T.Compose(steps)


def tensor_transform(preprocessing: Mapping[str, Any] | Preprocessing | None = None) -> nn.Module | None:
    """Transform for in-memory float images ``[C, H, W]`` in [0, 1] (MNIST, digits): normalisation only."""
    if preprocessing is None:
        return None
    return BackboneNormalize(preprocessing)


def default_transforms(spec, image_size: int | None, preprocessing=None):
    """(train, eval) transforms a data set uses when none are given.

    Photos: Musgrave train/eval at ``image_size`` (default 227). Grey glyphs (Omniglot): resize only.
    In-memory tensors: none (``build_splits`` resizes the stored tensor once).
    """
    if spec.in_memory:
        t = tensor_transform(preprocessing)
        return t, t
    if spec.image_mode == "L":
        t = small_image_transform(preprocessing, image_size)
        return t, t
    return train_transform("musgrave", preprocessing, image_size), eval_transform("musgrave", preprocessing, image_size)


def photo_view(image_size: int, interpolation: str = "bilinear"):
    """The evaluation view of a photo (PIL in, PIL out): shorter side to ``image_size * 256 / 224``, centre crop.

    The standard ImageNet evaluation crop (crop fraction 0.875). Photos are decoded into memory as
    this view, and the evaluation transform of photos on disk applies the same two steps, so a run
    embeds an image file identically wherever it comes from.
    """
    from torchvision import transforms as T

    mode = {"bicubic": T.InterpolationMode.BICUBIC, "nearest": T.InterpolationMode.NEAREST}.get(
        interpolation, T.InterpolationMode.BILINEAR)
    return T.Compose([T.Resize(int(round(image_size * 256 / 224)), interpolation=mode), T.CenterCrop(image_size)])


def photo_transforms(preprocessing, image_size: int, crop_size: int) -> tuple[nn.Module, nn.Module]:
    """(train, eval) per-item transforms of photos on disk, matching the in-memory photo path.

    Train: random resized crop to ``crop_size`` (area 16-100 %, aspect 3/4-4/3) and a flip, taken from
    the image's evaluation view as the in-memory path does; eval: :func:`photo_view`
    (shorter side ``image_size * 256 / 224``, centre crop ``image_size``), then the backbone's normalisation.
    """
    from torchvision import transforms as T

    view = photo_view(image_size, str((preprocessing or {}).get("interpolation", "bilinear")))
    tail = [T.PILToTensor(), T.ConvertImageDtype(torch.float32), BackboneNormalize(preprocessing)]
    train = T.Compose([view, T.RandomResizedCrop(crop_size, scale=(0.16, 1.0)), T.RandomHorizontalFlip(0.5), *tail])
    return train, T.Compose([view, *tail])


def build_transforms(
    preset: str = "musgrave",
    preprocessing: Mapping[str, Any] | Preprocessing | None = None,
    image_size: int | None = None,
) -> tuple[nn.Module, nn.Module]:
    """(train, eval) pipelines for ``preset`` normalised for a backbone's ``preprocessing`` dict."""
    return train_transform(preset, preprocessing, image_size), eval_transform(preset, preprocessing, image_size)


class RandomTranslate(nn.Module):
    """Batched random translation of ``[B, C, H, W]`` images by up to ``max_shift`` pixels.

    Uncovered pixels repeat the border (digits and glyphs have a uniform background).

    For in-memory data sets (MNIST, digits), where per-item PIL augmentation would dominate a
    training step. Randomness comes only from the ``generator`` passed in, so the engine can
    derive it from ``(seed, epoch, batch)`` and a resumed run replays the same shifts.
    """

    batched = True

    def __init__(self, max_shift: int = 2):
        super().__init__()
        if isinstance(max_shift, bool) or not isinstance(max_shift, int) or max_shift < 0:
            raise InvalidParameterError(
                f"The 'max_shift' parameter of RandomTranslate must be an int >= 0. Got {max_shift!r} instead."
            )
        self.max_shift = max_shift
        self._grids: tuple = ((), ())  # (shape and device, index grids): made once, not at every batch

    def forward(self, images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        if self.max_shift == 0:
            return images
        b, c, h, w = images.shape
        s, device = self.max_shift, images.device
        shifts = torch.randint(-s, s + 1, (b, 2), generator=generator)  # drawn on the CPU whatever the images' device
        shifts = host_to_device(shifts, device)  # queued, not waited for, on a card
        batch, channel, row, col = self._index_grids(b, c, h, w, device)
        # a pixel comes from (row - shift) clamped into the image: the border repeats (replicate padding)
        down, right = shifts.view(b, 2, 1).unbind(1)  # [B, 1] each
        rows = (row - down).clamp_(0, h - 1).view(b, 1, h, 1)
        cols = (col - right).clamp_(0, w - 1).view(b, 1, 1, w)
        return images[batch, channel, rows, cols]  # one gather, [B, C, H, W]

    def _index_grids(self, b: int, c: int, h: int, w: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        """Batch ``[B, 1, 1, 1]`` and channel ``[1, C, 1, 1]`` indices, row ``[H]`` and column ``[W]`` positions."""
        key = (b, c, h, w, device)
        if self._grids[0] != key:
            grids = (torch.arange(b, device=device).view(b, 1, 1, 1), torch.arange(c, device=device).view(1, c, 1, 1),
                     torch.arange(h, device=device), torch.arange(w, device=device))
            self._grids = (key, grids)
        return self._grids[1]


class RandomAffine(nn.Module):
    """Batched random affine warp of ``[B, C, H, W]`` images: rotation, scale, shear and shift.

    Each image gets its own rotation in ``[-degrees, degrees]``, isotropic scale in
    ``[1 - scale, 1 + scale]``, shear in ``[-shear, shear]`` degrees and shift in
    ``[-shift, shift]`` of the image size (bilinear sampling). Pixels that come from outside the
    image take ``fill`` (per channel): the background value, so white-on-black digits and
    black-on-white glyphs both stay clean at the borders. Randomness comes only from ``generator``.
    """

    batched = True

    def __init__(self, degrees: float = 15.0, scale: float = 0.1, shear: float = 10.0, shift: float = 0.1,
                 fill: float | list[float] = 0.0):
        super().__init__()
        for key, value in (("degrees", degrees), ("scale", scale), ("shear", shear), ("shift", shift)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise InvalidParameterError(
                    f"The '{key}' parameter of RandomAffine must be a float >= 0. Got {value!r} instead."
                )
        if scale >= 1:
            raise InvalidParameterError(f"The 'scale' parameter of RandomAffine must be a float in [0, 1). Got {scale!r}.")
        self.degrees, self.scale, self.shear, self.shift = float(degrees), float(scale), float(shear), float(shift)
        self.fill = [float(f) for f in fill] if isinstance(fill, (list, tuple)) else [float(fill)]

    def forward(self, images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        import math

        b = images.shape[0]
        u = torch.rand(b, 5, generator=generator, dtype=torch.float32) * 2 - 1  # uniform in [-1, 1]
        angle = u[:, 0] * math.radians(self.degrees)
        zoom = 1 + u[:, 1] * self.scale
        shear = u[:, 2] * math.radians(self.shear)
        cos, sin = torch.cos(angle), torch.sin(angle)
        # output -> input sampling matrix: inverse of (rotate * shear * zoom), then shift
        a11, a12 = cos / zoom, (sin + cos * torch.tan(shear)) / zoom
        a21, a22 = -sin / zoom, (cos - sin * torch.tan(shear)) / zoom
        theta = torch.stack([
            torch.stack([a11, a12, u[:, 3] * 2 * self.shift], dim=1),
            torch.stack([a21, a22, u[:, 4] * 2 * self.shift], dim=1),
        ], dim=1)
        theta = host_to_device(theta, images.device).to(images.dtype)  # computed on the CPU, applied on the images' device
        grid = torch.nn.functional.affine_grid(theta, list(images.shape), align_corners=False)
        fill = self.fill[0] if len(self.fill) == 1 else host_to_device(torch.tensor(self.fill), images.device).view(1, -1, 1, 1)
        warped = torch.nn.functional.grid_sample(images - fill, grid, mode="bilinear", padding_mode="zeros",
                                                 align_corners=False)
        return warped + fill

    def extra_repr(self) -> str:
        return f"degrees={self.degrees}, scale={self.scale}, shear={self.shear}, shift={self.shift}, fill={self.fill}"


class RandomResizedCropFlip(nn.Module):
    """Batched random resized crop to ``size x size`` plus a horizontal flip of half the images.

    Per image: an area fraction in ``scale`` and an aspect ratio (log-uniform) in ``ratio`` give the
    crop's width and height (as fractions of the image side, at most 1), its centre is uniform over
    the positions that keep it inside the image, and it is resampled bilinearly (one
    ``affine_grid`` / ``grid_sample`` for the whole batch). For photos held in memory as their
    evaluation view (data.augment ``crop``); randomness comes only from ``generator``.
    """

    batched = True

    def __init__(self, size: int, scale: Sequence[float] = (0.16, 1.0), ratio: Sequence[float] = (3 / 4, 4 / 3)):
        super().__init__()
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise InvalidParameterError(f"The 'size' parameter of RandomResizedCropFlip must be an int >= 1. Got {size!r}.")
        if not (len(scale) == 2 and 0 < scale[0] <= scale[1] <= 1):
            raise InvalidParameterError(f"The 'scale' parameter must be (low, high) with 0 < low <= high <= 1. Got {scale!r}.")
        if not (len(ratio) == 2 and 0 < ratio[0] <= ratio[1]):
            raise InvalidParameterError(f"The 'ratio' parameter must be (low, high) with 0 < low <= high. Got {ratio!r}.")
        self.size, self.scale, self.ratio = size, tuple(float(v) for v in scale), tuple(float(v) for v in ratio)

    def forward(self, images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        import math

        b = images.shape[0]
        u = torch.rand(b, 5, generator=generator, dtype=torch.float32)
        area = self.scale[0] + u[:, 0] * (self.scale[1] - self.scale[0])
        log_low, log_high = math.log(self.ratio[0]), math.log(self.ratio[1])
        aspect = torch.exp(log_low + u[:, 1] * (log_high - log_low))
        width = torch.sqrt(area * aspect).clamp(max=1.0)  # fractions of the image side
        height = torch.sqrt(area / aspect).clamp(max=1.0)
        cx = (u[:, 2] * 2 - 1) * (1 - width)  # centre in [-1, 1] coordinates, crop inside the image
        cy = (u[:, 3] * 2 - 1) * (1 - height)
        flip = torch.where(u[:, 4] < 0.5, -1.0, 1.0)
        zero = torch.zeros_like(width)
        theta = torch.stack([torch.stack([width * flip, zero, cx], 1), torch.stack([zero, height, cy], 1)], 1)
        grid = torch.nn.functional.affine_grid(host_to_device(theta, images.device).to(images.dtype),
                                               [b, images.shape[1], self.size, self.size], align_corners=False)
        return torch.nn.functional.grid_sample(images, grid, mode="bilinear", padding_mode="border", align_corners=False)

    def extra_repr(self) -> str:
        return f"size={self.size}, scale={self.scale}, ratio={tuple(round(r, 4) for r in self.ratio)}"


BATCH_AUGMENTATIONS = ("none", "translate", "affine", "crop")


def batch_augmentation(name: str, max_shift: int = 2, fill: float | list[float] = 0.0,
                       crop_size: int | None = None) -> nn.Module | None:
    """The batched augmentation named by ``data.augment``: ``none``, ``translate``, ``affine`` or ``crop``.

    ``affine`` uses the glyph/digit ranges the recipe measured (docs/recipes.md): rotation +-15 deg,
    scale +-10 %, shear +-10 deg, shift +-10 %; ``fill`` is the data's background value. ``crop`` is
    :class:`RandomResizedCropFlip` to ``crop_size`` (photos; area 16-100 %, as Musgrave et al.).
    """
    if name == "none":
        return None
    if name == "translate":
        return RandomTranslate(max_shift)
    if name == "affine":
        return RandomAffine(fill=fill)
    if name == "crop":
        if crop_size is None:
            raise InvalidParameterError("data.augment=crop needs data.crop_size (the training crop in pixels).")
        return RandomResizedCropFlip(crop_size)
    raise InvalidParameterError(f"data.augment must be one of {BATCH_AUGMENTATIONS}. Got {name!r}.")


# ----------------------------------------------------------------------------- photo pipelines


#: ``data.pipeline``: ``recipe`` (dmlkit's photo recipe) or a paper's own train/evaluation pipeline.
PIPELINES = ("recipe", "musgrave", "proxy_anchor", "proxy_nca")

#: Each paper pipeline's published crop and the shorter side (or, ``square``, both sides) it is cut from.
_PAPER_PIPELINES = {
    # ASAP App. A.2 after Musgrave et al. 2020: shorter side 256, random resized crop (area 16-100 %,
    # aspect 3/4-4/3) to 227 + flip; evaluation: shorter side 256, centre crop 227.
    "musgrave": dict(crop=227, scale=(0.16, 1.0), square=False),
    # Proxy-Anchor Sec. 4.2 / its official code: random resized crop (area 8-100 %) to 224 + flip;
    # evaluation: shorter side 256, centre crop 224.
    "proxy_anchor": dict(crop=224, scale=(0.08, 1.0), square=False),
    # Proxy-NCA Sec. 5: "resized to 256x256, then randomly cropped to 227x227"; centre crop at test.
    "proxy_nca": dict(crop=227, scale=None, square=True),
}


class BatchedSequence(nn.Sequential):
    """Deterministic batch-capable steps in order (``[C, H, W]`` or ``[B, C, H, W]``): one ``batched`` transform."""

    batched = True


class RandomCropFlip(nn.Module):
    """Batched random ``size x size`` crop at a uniform integer position, plus a horizontal flip of half the images.

    Proxy-NCA Sec. 5's plain random crop (no resampling: pixels are copied). Randomness comes only
    from ``generator`` (the global generator when None, which per-item seeding sets).
    """

    batched = True

    def __init__(self, size: int):
        super().__init__()
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise InvalidParameterError(f"The 'size' parameter of RandomCropFlip must be an int >= 1. Got {size!r}.")
        self.size = size

    def forward(self, images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        b, _, h, w = images.shape
        if h < self.size or w < self.size:
            raise InvalidParameterError(f"RandomCropFlip({self.size}) needs images of at least that size. Got {h}x{w}.")
        u = torch.rand(b, 3, generator=generator, dtype=torch.float64)
        top = (u[:, 0] * (h - self.size + 1)).long().clamp_max(h - self.size)
        left = (u[:, 1] * (w - self.size + 1)).long().clamp_max(w - self.size)
        steps = torch.arange(self.size)
        rows = (top[:, None] + steps[None, :])[:, :, None]  # [B, S, 1]
        cols = left[:, None] + steps[None, :]  # [B, S]
        cols = torch.where((u[:, 2] < 0.5)[:, None], cols.flip(1), cols)[:, None, :]  # [B, 1, S]
        batch, rows, cols = (host_to_device(t, images.device) for t in (torch.arange(b)[:, None, None], rows, cols))
        return images.permute(0, 2, 3, 1)[batch, rows, cols].permute(0, 3, 1, 2).contiguous()

    def extra_repr(self) -> str:
        return f"size={self.size}"


class PerItem(nn.Module):
    """A batched random transform applied to one image ``[C, H, W]`` (global generator, seeded per item)."""

    def __init__(self, batched_transform: nn.Module):
        super().__init__()
        self.inner = batched_transform

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.inner(image[None])[0]


@dataclass(frozen=True)
class PhotoPipeline:
    """The one description of how a run's photos become training and evaluation inputs (``data.pipeline``).

    A photo is first cut to its stored ``view``: shorter side ``resize`` (both sides with ``square``)
    then a centre ``view x view`` square. Photos held in memory are stored as that view; photos on
    disk are read through the same steps, so both paths give the model the same pixels. Training
    takes a random crop of ``crop_size`` from the view and flips half of them (``crop_scale``: a
    random resized crop with that area range and aspect 3/4-4/3; None: a plain crop at a random
    position); evaluation takes the view's centre ``eval_size`` crop.

    ``recipe`` stores the evaluation view itself (``view = eval_size = image_size``, shorter side
    ``image_size * 256 / 224``). The paper pipelines store the 256 view (``view = resize``), a square
    larger than the 227/224 crop, so a random crop reaches only the centre square of a wide photo where
    the papers crop the whole 256-high image; evaluation (shorter side 256, centre 227/224) is theirs.
    """

    name: str
    resize: int
    square: bool
    view: int
    eval_size: int
    crop_size: int
    crop_scale: tuple[float, float] | None
    interpolation: str = "bilinear"

    def view_transform(self):
        """PIL -> PIL: the stored view (resize, then centre square)."""
        from torchvision import transforms as T

        if self.name == "recipe":
            return photo_view(self.view, self.interpolation)
        mode = {"bicubic": T.InterpolationMode.BICUBIC, "nearest": T.InterpolationMode.NEAREST}.get(
            self.interpolation, T.InterpolationMode.BILINEAR)
        size = (self.resize, self.resize) if self.square else self.resize
        return T.Compose([T.Resize(size, interpolation=mode), T.CenterCrop(self.view)])

    def train_batch(self) -> nn.Module:
        """Batched training crop + flip of stored views ``[B, C, view, view]`` (called with a generator)."""
        if self.crop_scale is None:
            return RandomCropFlip(self.crop_size)
        return RandomResizedCropFlip(self.crop_size, scale=self.crop_scale)

    def eval_crop(self) -> nn.Module:
        """The deterministic centre ``eval_size`` crop of a view (identity when the view is that size)."""
        from torchvision import transforms as T

        return T.CenterCrop(self.eval_size) if self.eval_size != self.view else nn.Identity()

    def tensor_transforms(self, preprocessing=None) -> tuple[nn.Module | None, nn.Module | None]:
        """(train, eval) transforms of stored views held in memory: the training crop is the batch augmentation."""
        normalise = tensor_transform(preprocessing)
        if self.eval_size == self.view:
            return normalise, normalise
        steps = [self.eval_crop()] + ([normalise] if normalise is not None else [])
        return normalise, BatchedSequence(*steps)

    def item_transforms(self, preprocessing=None) -> tuple[nn.Module, nn.Module]:
        """(train, eval) per-item transforms of photo files: the same view, crops and normalisation."""
        if self.name == "recipe":
            return photo_transforms(preprocessing, self.view, self.crop_size)
        from torchvision import transforms as T

        to_float = [self.view_transform(), T.PILToTensor(), T.ConvertImageDtype(torch.float32)]
        normalise = BackboneNormalize(preprocessing)
        train = T.Compose([*to_float, PerItem(self.train_batch()), normalise])
        return train, T.Compose([*to_float, self.eval_crop(), normalise])


def photo_pipeline(name: str, image_size: int | None, crop_size: int | None = None,
                   interpolation: str = "bilinear") -> PhotoPipeline:
    """The :class:`PhotoPipeline` of ``data.pipeline=name`` at ``data.image_size`` / ``data.crop_size``.

    ``recipe``: evaluation at ``image_size`` (needed), training crops of ``crop_size`` (default
    ``image_size``). A paper pipeline: evaluation crop ``image_size`` and training crop ``crop_size``
    (both default to the paper's 227 or 224), cut from a view of side ``256 * crop / published crop``.
    """
    if name not in PIPELINES:
        raise InvalidParameterError(f"data.pipeline must be one of {PIPELINES}. Got {name!r} instead.")
    if name == "recipe":
        if not image_size:
            raise InvalidParameterError("data.pipeline=recipe needs data.image_size (the evaluation size).")
        resize = int(round(image_size * 256 / 224))
        return PhotoPipeline(name, resize, False, image_size, image_size, crop_size or image_size, (0.16, 1.0),
                             interpolation)
    paper = _PAPER_PIPELINES[name]
    eval_size = image_size or paper["crop"]
    crop = crop_size or eval_size
    view = int(round(256 * max(eval_size, crop) / paper["crop"]))
    return PhotoPipeline(name, view, paper["square"], view, eval_size, crop, paper["scale"], interpolation)
