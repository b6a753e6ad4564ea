"""The default recipe: training choices read from the training split, not from a data set's name.

Every field below is ``None`` (or ``"auto"``) in the schema until the recipe fills it from a
:class:`DataProfile` of the training split; a value the user sets (preset, config file or
``--set``) is never touched. The rules and the measurements behind them are in
``docs/recipes.md``; every resolved value is printed at start-up and written to ``config.yaml``.

=================================  ============================================================
field                              rule
=================================  ============================================================
``protocol.val_class_fraction``    0.2 of the training classes (at least 2) are held out for
                                   checkpoint choice when there are >= 20 classes; else none
``sampler.m``                      a fifth of a class's images (median), between 2 and 16
``sampler.batch_size``             ``m`` x classes per batch: 64 // m classes, or all of them
``train.max_steps``                ``epochs * images / batch_size``; epochs from the data size
                                   (80 for 1,000 images or fewer, then about 80,000 images seen,
                                   at least 10 epochs), between 50 and 2,000 steps
``train.eval_every``               10 evaluations when there is a validation split, else 1
``optimizer.loss_lr_multiplier``   100 x the model's learning rate for the proxies
``data.augment``                   glyphs/digits held in memory: ``affine`` (fill = the
                                   background) with fewer than 100 images per class, else
                                   ``translate``; photos on disk: none (their per-item
                                   transform is random resized crop + flip)
``model.shift_average``            small images (16 to 64 px a side): embeddings averaged over
                                   shifts of up to 2 px; else 0
``model.ensemble``                 small images with fewer than 100 images per class: 3 members
                                   (one model's embedding varies much with its initialisation
                                   there, and small images make members cheap); else 1
``train.mixed_precision``          ``auto``: bf16 where the device computes it natively, else none
=================================  ============================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

#: Fields the recipe may fill, in the order they are printed.
RECIPE_FIELDS = (
    "protocol.val_class_fraction",
    "sampler.m",
    "sampler.batch_size",
    "train.max_steps",
    "train.eval_every",
    "optimizer.loss_lr_multiplier",
    "data.augment",
    "model.shift_average",
    "model.ensemble",
    "train.mixed_precision",
)


@dataclass(frozen=True)
class DataProfile:
    """What the recipe reads from the training split."""

    num_images: int
    num_classes: int
    median_per_class: int
    min_per_class: int
    channels: int
    height: int
    width: int
    in_memory: bool
    background: tuple[float, ...]
    kind: str  # "glyph" (uniform background: digits, characters, icons) or "photo"

    def describe(self) -> str:
        return (f"{self.num_images} images, {self.num_classes} classes ({self.median_per_class} per class, "
                f"min {self.min_per_class}), {self.channels}x{self.height}x{self.width}, "
                f"{'in memory' if self.in_memory else 'on disk'}, kind={self.kind}")


def profile_split(dataset: Any) -> DataProfile:
    """Class counts, image shape, background and kind of a training split."""
    labels = dataset.labels
    counts = torch.bincount(labels)
    counts = counts[counts > 0]
    images = getattr(dataset, "images", None)
    if images is not None:
        x = images[: min(len(images), 2000)]
        x = x.float() / 255.0 if x.dtype == torch.uint8 else x.float()
        channels, height, width = x.shape[1:]
        border = torch.cat([x[:, :, 0, :], x[:, :, -1, :], x[:, :, :, 0], x[:, :, :, -1]], dim=2)  # [n, C, 2H+2W]
        background = tuple(float(v) for v in border.median(dim=2).values.median(dim=0).values)
        # a uniform background: most border pixels equal the background value (glyphs, digits, icons)
        near = (border - torch.tensor(background).view(1, -1, 1)).abs().amax(dim=1) < 0.1
        kind = "glyph" if float(near.float().mean()) > 0.9 else "photo"
        in_memory = True
    else:
        channels = 1 if getattr(dataset, "mode", "RGB") == "L" else 3
        height = width = 0
        background = (0.0,) * channels
        kind = "photo"
        in_memory = False
    return DataProfile(
        num_images=len(labels), num_classes=len(counts), median_per_class=int(counts.median()),
        min_per_class=int(counts.min()), channels=int(channels), height=int(height), width=int(width),
        in_memory=in_memory, background=background, kind=kind,
    )


def epochs_for(num_images: int) -> int:
    """80 epochs up to 1,000 images, then fewer (inverse to the size: about 80,000 images seen), at least 10."""
    return int(max(10, min(80, round(80 * 1000 / max(num_images, 1)))))


#: Images per batch the recipe aims for (fewer when the data has too few classes).
DEFAULT_BATCH = 64

#: Below this many images per class the recipe warps glyphs (affine) and trains an ensemble;
#: above it a shift is enough and one model is stable.
FEW_PER_CLASS = 100

#: Images at most this many pixels a side are "small": shift-averaged embeddings, cheap ensemble members.
SMALL_SIDE = 64

#: Small images at least this many pixels a side get shift-averaged embeddings (an 8x8 digit shifted
#: by a pixel loses an eighth of itself: measured worse).
MIN_SIDE_TO_SHIFT = 16

#: Members of the recipe's ensemble for small images with few images per class.
ENSEMBLE_MEMBERS = 3


def val_class_fraction_for(profile: DataProfile) -> float:
    return 0.2 if profile.num_classes >= 20 else 0.0


def resolve(cfg: Any, profile: DataProfile, *, bf16_native: bool = False) -> dict[str, tuple[Any, str]]:
    """``{field: (value, reason)}`` for the recipe fields ``cfg`` leaves unset (``None`` / ``"auto"``).

    ``profile`` describes the split the model trains on (after any validation classes are held out);
    ``bf16_native`` says whether the training device computes bf16 natively.
    """
    out: dict[str, tuple[Any, str]] = {}
    batch = cfg.sampler.batch_size
    if cfg.sampler.m is None and profile.median_per_class < 2:
        m = 1  # two images of a class would be one image twice
        out["sampler.m"] = (m, f"{profile.median_per_class} image per class: batches of distinct classes "
                               "(no positive pairs: only proxy losses learn from them)")
    elif cfg.sampler.m is None:
        target = max(2, min(16, profile.median_per_class // 5))
        if batch is None:
            m = target
        else:  # m-per-class batches need batch_size % m == 0 and >= 2 classes per batch
            m = max([d for d in range(1, batch // 2 + 1) if batch % d == 0 and d <= target] or [1])
        out["sampler.m"] = (m, f"a fifth of {profile.median_per_class} images per class, in [2, 16]"
                               + ("" if batch is None else f", dividing the batch of {batch}"))
    else:
        m = cfg.sampler.m
    if batch is None:
        classes = max(2, min(profile.num_classes, DEFAULT_BATCH // m))
        batch = classes * m
        out["sampler.batch_size"] = (batch, f"{classes} classes x m={m}"
                                            + (f" (all {profile.num_classes} classes)" if classes == profile.num_classes
                                               else f", about {DEFAULT_BATCH} images"))
    if cfg.train.max_steps is None:
        epochs = epochs_for(profile.num_images)
        steps = max(50, min(2000, round(epochs * profile.num_images / batch)))
        out["train.max_steps"] = (steps, f"{epochs} epochs of {profile.num_images} images at batch "
                                         f"{batch}, in [50, 2000]")
    if cfg.train.eval_every is None:
        steps = cfg.train.max_steps if cfg.train.max_steps is not None else out["train.max_steps"][0]
        has_val = bool(cfg.protocol.val_class_fraction) or cfg.protocol.fold is not None or cfg.protocol.val_fraction > 0
        every = max(1, steps // 10) if has_val else steps
        out["train.eval_every"] = (every, "10 validation evaluations" if has_val else "no validation split: at the end")
    if cfg.optimizer.loss_lr_multiplier is None:
        out["optimizer.loss_lr_multiplier"] = (100.0, "proxies learn 100x faster than the model")
    if cfg.data.augment == "auto":
        if profile.in_memory and profile.kind == "glyph" and profile.median_per_class < FEW_PER_CLASS:
            out["data.augment"] = ("affine", f"glyphs/digits on a uniform background {_fmt(profile.background)}, "
                                             f"{profile.median_per_class} < {FEW_PER_CLASS} images per class")
        elif profile.in_memory:
            out["data.augment"] = ("translate", f"{profile.kind}s in memory with {profile.median_per_class} images "
                                                f"per class: +-{cfg.data.max_shift} px shifts")
        else:
            out["data.augment"] = ("none", "photos on disk: random resized crop + flip per item")
    side = min(profile.height, profile.width)
    small = profile.in_memory and 0 < max(profile.height, profile.width) <= SMALL_SIDE
    if cfg.model.shift_average is None:
        if small and side >= MIN_SIDE_TO_SHIFT:
            out["model.shift_average"] = (2, f"{profile.height}x{profile.width} images: embeddings averaged over "
                                             "shifts of up to 2 px")
        elif small:
            out["model.shift_average"] = (0, f"{profile.height}x{profile.width} images: a shift would move a large "
                                             "part of the image out")
        else:
            out["model.shift_average"] = (0, f"images larger than {SMALL_SIDE} px or on disk: no shift averaging")
    if cfg.model.ensemble is None:
        if cfg.asap.enabled:
            out["model.ensemble"] = (1, "ASAP re-initialises one model's proxies")
        elif small and profile.median_per_class < FEW_PER_CLASS:
            out["model.ensemble"] = (ENSEMBLE_MEMBERS, f"{profile.median_per_class} < {FEW_PER_CLASS} images per class "
                                                       f"of small images: {ENSEMBLE_MEMBERS} members side by side")
        else:
            out["model.ensemble"] = (1, "one model" + ("" if small else f" (images larger than {SMALL_SIDE} px or on disk)")
                                        + ("" if profile.median_per_class < FEW_PER_CLASS else
                                           f" ({profile.median_per_class} images per class)"))
    if cfg.train.mixed_precision == "auto":
        out["train.mixed_precision"] = (("bf16", "the device computes bf16 natively") if bf16_native
                                        else ("none", "no native bf16 on this device"))
    return out


def _fmt(values: tuple[float, ...]) -> str:
    return "(" + ", ".join(f"{v:.2f}" for v in values) + ")"


def apply(cfg: Any, choices: dict[str, tuple[Any, str]]) -> None:
    """Write the resolved values into ``cfg``."""
    for path, (value, _) in choices.items():
        section, key = path.split(".")
        setattr(getattr(cfg, section), key, value)


def format_choices(profile: DataProfile, choices: dict[str, tuple[Any, str]]) -> str:
    """The lines printed at start-up."""
    lines = [f"recipe: training split: {profile.describe()}"]
    for path in RECIPE_FIELDS:
        if path in choices:
            value, reason = choices[path]
            lines.append(f"recipe:   {path} = {value}  ({reason})")
    return "\n".join(lines)
