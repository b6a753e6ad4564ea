"""The run configuration: one dataclass per section, the single source of defaults.

A config is built from a YAML mapping (a preset or a user file) plus ``--set a.b=value``
overrides. Every problem is collected (unknown keys with did-you-mean and the valid keys at
that level, wrong types, out-of-range values) and raised together as one
:class:`~dmlkit.exceptions.ConfigError` before anything heavy starts.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Optional

from dmlkit.core.validation import (
    NONE,
    Capped,
    FilePath,
    Interval,
    ListOf,
    Matches,
    Options,
    OptionsFrom,
    Text,
    short_repr,
    suggest_value,
)
from dmlkit.exceptions import ConfigError


@dataclass
class DataConfig:
    """Which data set to read and how.

    ``augment="translate"`` shifts every training batch by up to ``max_shift`` pixels,
    ``"affine"`` warps it (rotation, scale, shear, shift; background fill), batched for data held
    in memory (image files get their own per-item augmentation), ``"crop"`` takes a random resized
    crop of ``crop_size`` pixels (area 16-100 %, aspect 3/4-4/3) and flips half of them (photos held
    in memory, which are stored as their ``image_size`` evaluation view); ``"auto"`` lets the recipe
    (:mod:`dmlkit.recipe.rules`) choose from the kind of images. For photos ``image_size`` is the
    evaluation size (shorter side resized to ``image_size * 256 / 224``, centre crop) and
    ``crop_size`` the training crop; ``None`` lets the recipe choose both from the images' size.
    ``num_workers=None`` lets the recipe choose DataLoader workers (on a GPU, for images read from disk).
    ``pipeline`` names who decides the photos' train and evaluation transforms
    (:func:`dmlkit.data.transforms.photo_pipeline`), in memory and on disk alike: ``recipe`` (the
    above) or a paper's own (``musgrave``, ``proxy_anchor``, ``proxy_nca``: ``image_size`` is then the
    evaluation crop, ``crop_size`` the training crop, and the training crops are the pipeline's,
    so ``augment`` must stay ``auto`` or be ``crop``).
    ``download=true`` fetches a benchmark (cub200, cars196, sop) into ``root`` before it is read when
    ``root`` does not hold it yet (:func:`dmlkit.data.download.download_dataset`: terms printed,
    checksums verified, counts checked).
    ``class_split`` is how a ``folder`` (without ``train``/``test`` sub-folders) or a ``csv`` without
    split columns divides its classes into train and test halves: ``random`` (a random half trains,
    seeded by ``protocol.seed``, the seed of every data split, so runs of other ``seed`` values test on the
    same classes) or ``sorted`` (the first half by class name trains); the benchmarks keep their
    protocols' splits. The chosen classes are in the run's ``manifest.json``.
    ``allow_outside_root=true`` lets a ``csv`` manifest name images outside its own folder (absolute paths).
    """

    name: str = "mnist"
    root: Optional[str] = None
    label: str = "class"
    eval_label: Optional[str] = None
    image_size: Optional[int] = None
    crop_size: Optional[int] = None
    num_workers: Optional[int] = 0
    skip_bad_images: bool = False
    download: bool = False
    augment: str = "auto"
    max_shift: int = 2
    pipeline: str = "recipe"
    class_split: str = "random"
    allow_outside_root: bool = False


@dataclass
class ProtocolConfig:
    """Model-selection protocol (ASAP App. A.2 after Musgrave et al.).

    ``fold=None`` trains on all training classes with no validation split: the last
    checkpoint is kept. ``fold=i`` trains on the other folds of the training classes and
    selects the checkpoint by validation MAP@R on fold ``i``. ``val_fraction=f`` (with
    ``fold=None``) instead holds out a fraction ``f`` of the images of every training class for
    validation (for data sets with too few classes for class-disjoint folds, e.g. the 5
    training digits of MNIST). ``val_class_fraction=f`` holds out a seeded fraction ``f`` of the
    training classes (class-disjoint); ``None`` lets the recipe decide (0.2 with >= 20 classes,
    else 0). The test classes are never used for selection.

    ``member_folds=True`` (with ``model.ensemble=N > 1`` and validation classes): each ensemble member holds out
    its own fold of the training classes (``round(1 / val_class_fraction)`` seeded folds; member 0's is the
    held-out validation classes) and trains on the rest, in its own batches; each member is scored on its own
    fold and the pooled per-query MAP@R selects the checkpoint (the fold models of Musgrave et al. trained side
    by side as one ensemble, which then has seen every training class). ``None`` lets the recipe decide (on for
    the recipe's glyph ensemble).

    ``selection`` is how the validation MAP@R picks the kept checkpoint (and drives early stopping):
    ``significant`` (dmlkit's rule for pretrained backbones: a checkpoint must beat the untrained
    embedding of step 0 by 2 standard errors of the paired per-query gain) or ``best`` (the highest
    validation MAP@R, Musgrave et al.'s protocol that the paper presets follow; step 0 is not scored).
    """

    fold: Optional[int] = None
    num_folds: int = 4
    seed: int = 0
    val_fraction: float = 0.0
    val_class_fraction: Optional[float] = None
    member_folds: Optional[bool] = None
    selection: str = "significant"


@dataclass
class ModelConfig:
    """Backbone and embedding head (``dmlkit.models.create_model`` arguments).

    ``name="auto"`` lets the recipe choose from the data: an ImageNet-pretrained
    ``efficientnet_lite0`` for photos, the small CNN for glyphs and digits. ``embedding_size``,
    ``pooling``, ``pretrained``, ``freeze_bn``, ``head_init`` and ``frozen_stages`` left ``None`` are
    set by the recipe too (a pretrained backbone keeps its feature size with an identity-initialised
    head, GeM pooling and frozen batch-norm statistics; on a CPU its stem and first two feature stages
    are not trained). ``frozen_stages=k`` leaves the trunk's parameters up to the end of its k-th
    feature stage (timm's ``feature_info``, highest resolution first) untrained. ``ensemble=N > 1`` trains N members of this model
    side by side (each from its own initialisation, with its own loss) and embeds with their
    concatenation (``dmlkit.models.EmbedderEnsemble``). ``shift_average=r`` averages eval-mode
    embeddings over input shifts of up to ``r`` pixels and ``flip_average`` over the image and its
    mirror (:class:`dmlkit.models.Embedder`). ``None`` lets the recipe decide these from the data.
    """

    name: str = "small_cnn"
    embedding_size: Optional[int] = 64
    normalization: str = "l2"
    pooling: Optional[str] = "avg"
    pretrained: Optional[bool] = False
    weights: Optional[str] = None
    freeze_bn: Optional[bool] = False
    head_init: Optional[str] = "kaiming"
    frozen_stages: Optional[int] = 0
    ensemble: Optional[int] = None
    shift_average: Optional[int] = None
    flip_average: Optional[bool] = False
    args: dict = field(default_factory=dict)


@dataclass
class MinerConfig:
    """Pair/triplet miner or pair weighter; ``name=None`` uses all pairs."""

    name: Optional[str] = None
    args: dict = field(default_factory=dict)


@dataclass
class MemoryConfig:
    """Cross-batch memory; ``memory_size=0`` disables it."""

    memory_size: int = 0
    warmup_steps: int = 0


@dataclass
class LossConfig:
    """The loss by registry name with its constructor arguments."""

    name: str = "proxy_anchor"
    args: dict = field(default_factory=dict)
    miner: MinerConfig = field(default_factory=MinerConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)


@dataclass
class OptimizerConfig:
    """Optimiser, parameter groups, schedule and clipping.

    ``lr`` is the backbone's learning rate; the head learns at ``lr * head_lr_multiplier`` and the
    loss's own parameters (proxies) at ``lr * head_lr_multiplier * loss_lr_multiplier``. ``None``
    lets the recipe choose (a small CNN from scratch and a pretrained backbone want very different rates).
    ``scheduler`` is ``none``, ``step``, ``cosine`` or ``wsd`` (the rate holds, then decays over the
    horizon's last ``decay_fraction``); ``None`` lets the recipe choose.
    """

    name: str = "adamw"
    lr: Optional[float] = 1e-3
    head_lr_multiplier: Optional[float] = 1.0
    weight_decay: float = 1e-4
    momentum: float = 0.9
    betas: list = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    loss_lr_multiplier: Optional[float] = None
    scheduler: Optional[str] = "none"
    decay_fraction: float = 0.2
    step_size: int = 1000
    gamma: float = 0.5
    warmup_steps: int = 0
    grad_clip: Optional[float] = None


@dataclass
class SamplerConfig:
    """How batches are drawn; ``batch_size`` and ``m`` left at ``None`` are set by the recipe."""

    name: str = "m_per_class"
    batch_size: Optional[int] = None
    m: Optional[int] = None


@dataclass
class TrainConfig:
    """Step budget, evaluation cadence, early stopping, numerics, logging.

    ``max_steps`` and ``eval_every`` left at ``None`` are set by the recipe from the data size.
    ``time_budget`` (seconds of wall clock for the whole run, the test split's embedding included)
    fits the steps and evaluations into that time from speeds measured while the run trains
    (:mod:`dmlkit.recipe.budget_planner`); left ``None``, the recipe sets it when it also chooses the steps.

    ``device`` is where the model, the loss (proxies, cross-batch memory) and every batch live:
    ``auto`` (CUDA when available, else the CPU), ``cpu``, ``cuda`` or ``cuda:N``; under torchrun
    with CUDA each rank uses ``cuda:LOCAL_RANK``. ``mixed_precision`` runs the model under autocast
    (``bf16`` on CPU; ``fp16``/``bf16`` on GPU; ``fp16`` adds a gradient scaler); losses always
    turn autocast off and accumulate in fp32; a run's splits are embedded under the same autocast
    (in training, ``dmlkit evaluate`` and ``dmlkit embed``). ``auto`` lets the recipe
    pick ``bf16`` where the device computes it natively (a CPU with AVX512-BF16 or AMX, a GPU with
    bf16) and ``none`` elsewhere. ``compile`` wraps the model in ``torch.compile``.
    ``step_capture`` compiles the training step's forward, loss and backward (CUDA graphs on a card:
    :mod:`dmlkit.engine.training.step_capture`): ``compile``, ``off``, or ``auto`` (on a card, when the
    steps left pay for the compilation; eager on the CPU). What cannot be captured trains eagerly, with
    the reason in ``resolved.json``.
    ``on_nonfinite``: a step whose loss or gradient norm is not finite stops training with a
    ``NonFiniteError`` (``stop``) or is skipped (``skip``); with a fused optimiser (Adam/AdamW on CUDA)
    the check runs on the device and is read with the next log record (docs/gpu.md).
    Every ``log_every`` steps a record goes to ``log.jsonl`` and, with
    ``tensorboard``, the same scalars to TensorBoard event files in ``RUN_DIR/tensorboard``
    (needs the ``tensorboard`` package). ``loggers`` names experiment trackers
    (``[tensorboard, mlflow, wandb]``, :mod:`dmlkit.engine.loggers`): the config as parameters,
    every record as metrics, report and best checkpoint as artifacts; ``tracking_uri`` is MLflow's
    (``None``: MLflow's file store in ``RUN_DIR/mlruns``). ``model.name=auto`` chooses the photo
    backbone by ``time_budget`` too (:mod:`dmlkit.recipe.backbone_choice`).
    ``feature_cache`` computes the frozen stages' output once, for ``cache_views`` augmented views
    of each training image, and trains the rest of the model from it
    (:mod:`dmlkit.engine.frozen_stage_cache`): ``auto`` (where possible and within the memory cap),
    ``on`` (a ConfigError where impossible) or ``off``; ``cache_views=None`` lets the recipe choose.
    """

    max_steps: Optional[int] = None
    eval_every: Optional[int] = None
    patience: Optional[int] = None
    time_budget: Optional[float] = None
    log_every: int = 10
    checkpoint_every: int = 100
    device: str = "auto"
    mixed_precision: str = "none"
    compile: bool = False
    step_capture: str = "auto"
    on_nonfinite: str = "stop"
    num_threads: Optional[int] = None
    progress: bool = True
    tensorboard: bool = False
    loggers: list = field(default_factory=list)
    tracking_uri: Optional[str] = None
    feature_cache: str = "auto"
    cache_views: Optional[int] = None


@dataclass
class EvalConfig:
    """Evaluation of the validation and test splits.

    ``over_cluster=k > 1`` adds NMI+ to the clustering metrics: NMI of k-means with ``k`` times the
    class count (EPS Tables 2-3 use 30), which does not reward collapsing a class to one point.
    ``val_shift_average=r`` embeds the validation split with shifts of up to ``r`` pixels instead
    of ``model.shift_average``'s (the test split always takes the model's): a validation compares
    checkpoints of one run, so fewer shifts do at a fraction of the cost. ``None``: as the test
    split (the recipe chooses 1 when the model averages over shifts of 2 px or more).
    """

    ks: list = field(default_factory=lambda: [1, 2, 4, 8])
    backend: str = "torch"
    clustering: bool = True
    over_cluster: int = 1
    batch_size: int = 512
    save_embeddings: bool = True
    val_shift_average: Optional[int] = None


@dataclass
class AsapConfig:
    """ASAP alternating projections (Alg. 1-2, Eq. 4.11); off unless ``enabled``."""

    enabled: bool = False
    proximal_lambda: float = 2e-4
    proxies_per_class: int = 1
    pool_size: int = 1
    patience: int = 3
    max_projections: int = 10
    projections_without_improvement: int = 2
    pool_source: str = "forward"


@dataclass
class RunConfig:
    """A whole training run; ``name=None`` names it after its data and loss (``folder-proxy-anchor``)."""

    name: Optional[str] = None
    seed: int = 0
    data: DataConfig = field(default_factory=DataConfig)
    protocol: ProtocolConfig = field(default_factory=ProtocolConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    asap: AsapConfig = field(default_factory=AsapConfig)


# ----------------------------------------------------------------------------- value checks

#: Declared value constraints per dotted field, in the constraint language of every class's parameters
#: (:mod:`dmlkit.core.validation`): a value is valid when one of its constraints accepts it. Option lists
#: come from where the options live (registries, the modules that implement them).
#: Seeds reach libraries that keep them in a C int (faiss k-means): 0 .. 2**31 - 1.
MAX_SEED = 2**31 - 1
#: Natural ranges of the counts and sizes below: more steps than any run takes (a billion), a year of
#: seconds, images and batches far beyond one machine's memory. A value past them is a typo or an attack
#: (``max_steps=10**30`` overflows every counter), refused before anything starts.
MAX_STEPS = 10**9
MAX_SECONDS = 366 * 24 * 3600
MAX_IMAGE_SIZE = 16_384
MAX_BATCH = 2**24
#: Characters in a run's name: its folder ``runs/<YYYYmmdd-HHMMSS>-<name>-<n>`` must fit a file name (255 bytes).
MAX_RUN_NAME = 200

CONSTRAINTS: dict[str, list] = {
    "seed": [Interval(int, 0, MAX_SEED)],
    "name": [NONE, Text(MAX_RUN_NAME)],
    "data.root": [NONE, FilePath()],
    "model.weights": [NONE, FilePath()],
    "data.name": [OptionsFrom("dmlkit.data", "DATASETS")],
    "loss.name": [OptionsFrom("dmlkit.losses", "LOSSES")],
    "loss.miner.name": [NONE, OptionsFrom("dmlkit.mining", "MINERS")],
    "data.num_workers": [NONE, Interval(int, 0, None)],
    "data.image_size": [NONE, Capped(int, 0, MAX_IMAGE_SIZE, closed="right")],
    "data.crop_size": [NONE, Capped(int, 0, MAX_IMAGE_SIZE, closed="right")],
    "data.augment": [OptionsFrom("dmlkit.data.transforms", "BATCH_AUGMENTATIONS", ("auto",))],
    "data.max_shift": [Interval(int, 0, None)],
    "data.pipeline": [OptionsFrom("dmlkit.data.transforms", "PIPELINES")],
    "data.class_split": [OptionsFrom("dmlkit.data.folder", "CLASS_SPLITS")],
    "protocol.selection": [Options(("significant", "best"))],
    "eval.over_cluster": [Interval(int, 1, None)],
    "eval.val_shift_average": [NONE, Interval(int, 0, None)],
    "protocol.num_folds": [Interval(int, 2, None)],
    "protocol.seed": [Interval(int, 0, MAX_SEED)],
    "protocol.val_fraction": [Interval(float, 0, 1, closed="left")],
    "protocol.val_class_fraction": [NONE, Interval(float, 0, 1, closed="left")],
    "model.embedding_size": [NONE, Capped(int, 0, 2**20, closed="right")],
    "model.head_init": [NONE, OptionsFrom("dmlkit.models.embedder", "HEAD_INITS")],
    "model.normalization": [OptionsFrom("dmlkit.distances.normalization", "NORMALIZATIONS")],
    "model.pooling": [NONE, OptionsFrom("dmlkit.models.embedder", "POOLINGS")],
    "model.ensemble": [NONE, Interval(int, 1, None)],
    "model.shift_average": [NONE, Interval(int, 0, None)],
    "loss.memory.memory_size": [Capped(int, 0, 2**31)],
    "loss.memory.warmup_steps": [Capped(int, 0, MAX_STEPS)],
    "optimizer.name": [OptionsFrom("dmlkit.engine.optim", "OPTIMIZERS")],
    "optimizer.lr": [NONE, Interval(float, 0, None, closed="neither")],
    "optimizer.head_lr_multiplier": [NONE, Interval(float, 0, None, closed="neither")],
    "optimizer.weight_decay": [Interval(float, 0, None)],
    "optimizer.eps": [Interval(float, 0, None, closed="neither")],
    "optimizer.loss_lr_multiplier": [NONE, Interval(float, 0, None, closed="neither")],
    "optimizer.scheduler": [NONE, OptionsFrom("dmlkit.engine.optim", "SCHEDULERS")],
    "optimizer.decay_fraction": [Interval(float, 0, 1, closed="right")],
    "optimizer.step_size": [Capped(int, 0, MAX_STEPS, closed="right")],
    "optimizer.gamma": [Interval(float, 0, 1, closed="right")],
    "optimizer.warmup_steps": [Capped(int, 0, MAX_STEPS)],
    "optimizer.grad_clip": [NONE, Interval(float, 0, None, closed="neither")],
    "optimizer.betas": [ListOf(Interval(float, 0, 1, closed="left"), "a list of two floats in [0, 1)", 2, 2)],
    "sampler.name": [OptionsFrom("dmlkit.data.samplers", "SAMPLERS")],
    "sampler.batch_size": [NONE, Capped(int, 2, MAX_BATCH)],
    "sampler.m": [NONE, Interval(int, 1, None)],
    "train.max_steps": [NONE, Capped(int, 1, MAX_STEPS)],
    "train.eval_every": [NONE, Capped(int, 1, MAX_STEPS)],
    "train.patience": [NONE, Capped(int, 1, MAX_STEPS)],
    "train.time_budget": [NONE, Capped(float, 1, MAX_SECONDS)],
    "train.log_every": [Capped(int, 1, MAX_STEPS)],
    "train.checkpoint_every": [Capped(int, 1, MAX_STEPS)],
    "train.device": [Matches(r"auto|cpu|cuda|cuda:\d+", "one of 'auto', 'cpu', 'cuda', 'cuda:N' (N a GPU index)")],
    "train.mixed_precision": [Options(("none", "bf16", "fp16", "auto"))],
    "train.on_nonfinite": [Options(("stop", "skip"))],
    "train.step_capture": [OptionsFrom("dmlkit.engine.training.step_capture", "CAPTURE_MODES")],
    "train.num_threads": [NONE, Interval(int, 1, None)],
    "train.feature_cache": [OptionsFrom("dmlkit.engine.frozen_stage_cache", "CACHE_MODES")],
    "train.cache_views": [NONE, Interval(int, 1, None)],
    "train.loggers": [ListOf(OptionsFrom("dmlkit.engine.loggers", "LOGGERS"),
                             "a list of tracker names from {'tensorboard', 'mlflow', 'wandb'}")],
    "eval.ks": [ListOf(Capped(int, 1, MAX_BATCH), f"a non-empty list of ints >= 1, at most {MAX_BATCH}", 1)],
    "eval.backend": [OptionsFrom("dmlkit.evaluation._checks", "BACKENDS")],
    "eval.batch_size": [Capped(int, 1, MAX_BATCH)],
    "asap.proximal_lambda": [Interval(float, 0, None)],
    "asap.proxies_per_class": [Interval(int, 1, None)],
    "asap.pool_size": [Interval(int, 1, None)],
    "asap.patience": [Interval(int, 1, None)],
    "asap.max_projections": [Interval(int, 1, None)],
    "asap.projections_without_improvement": [Interval(int, 1, None)],
    "asap.pool_source": [Options(("forward", "cache"))],
}


def _member_fold_count(val_class_fraction: float) -> int:
    from dmlkit.data.splits import member_fold_count  # deferred: the config loads without the data package

    return member_fold_count(val_class_fraction)


def _cross_checks(cfg: RunConfig) -> list[str]:
    """Constraints that involve several fields."""
    problems = []
    s = cfg.sampler
    if s.name == "m_per_class" and None not in (s.m, s.batch_size) and s.batch_size % s.m != 0:
        problems.append(
            f"sampler.batch_size ({s.batch_size}) must be divisible by sampler.m ({s.m}) for m_per_class batches."
        )
    if s.name == "m_per_class" and None not in (s.m, s.batch_size) and s.batch_size // max(s.m, 1) < 2:
        problems.append(
            f"sampler.batch_size ({s.batch_size}) / sampler.m ({s.m}) must give at least 2 classes per batch."
        )
    p = cfg.protocol
    if p.fold is not None and not (0 <= p.fold < p.num_folds):
        problems.append(f"protocol.fold must be None or an int in [0, {p.num_folds - 1}]. Got {p.fold}.")
    if cfg.asap.enabled and cfg.asap.proxies_per_class > cfg.asap.pool_size:
        problems.append(
            f"asap.proxies_per_class ({cfg.asap.proxies_per_class}) cannot exceed asap.pool_size "
            f"({cfg.asap.pool_size}): k-center picks the proxies from the pool."
        )
    if p.fold is not None and p.val_fraction > 0:
        problems.append("protocol.fold and protocol.val_fraction are alternatives: set one of them.")
    if cfg.asap.enabled and p.fold is None and p.val_fraction == 0 and p.val_class_fraction == 0:
        # val_class_fraction None: the recipe holds out classes, or dmlkit.fit was given a validation split
        problems.append("asap.enabled needs a validation split: set protocol.fold, protocol.val_fraction or "
                        "protocol.val_class_fraction > 0.")
    if p.member_folds and (p.fold is not None or p.val_fraction > 0 or p.val_class_fraction == 0):
        problems.append("protocol.member_folds holds out each member's fold of the training classes: it needs "
                        "protocol.val_class_fraction > 0 (or left to the recipe), not protocol.fold or "
                        "protocol.val_fraction.")
    if p.member_folds and p.val_class_fraction and (cfg.model.ensemble or 1) > _member_fold_count(p.val_class_fraction):
        problems.append(f"protocol.member_folds gives each of model.ensemble={cfg.model.ensemble} members its own "
                        f"fold, but protocol.val_class_fraction={p.val_class_fraction} makes only "
                        f"{_member_fold_count(p.val_class_fraction)} folds: raise the fraction or lower the ensemble.")
    if cfg.asap.enabled and (cfg.model.ensemble or 1) > 1:
        problems.append("asap.enabled trains one model's proxies: set model.ensemble=1 (or leave ASAP off).")
    if cfg.data.pipeline != "recipe" and cfg.data.augment not in ("auto", "crop"):
        problems.append(
            f"data.pipeline={cfg.data.pipeline} decides the training crops: data.augment must be auto or crop. "
            f"Got {cfg.data.augment!r}."
        )
    # val_class_fraction None: the recipe holds out classes, or dmlkit.fit was given a validation split
    if cfg.train.patience is not None and p.fold is None and p.val_fraction == 0 and p.val_class_fraction == 0:
        problems.append("train.patience needs a validation split: set protocol.fold, protocol.val_fraction or "
                        "protocol.val_class_fraction.")
    return problems


# ----------------------------------------------------------------------------- building

#: A float written with an exponent as people write them (``3e-4``, ``1E-3``, ``1e3``): YAML 1.2's syntax.
EXPONENT_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*\.?[0-9_]*|\.[0-9_]+)[eE][-+]?[0-9]+$")
#: Any decimal float (``0.5``, ``.5``, ``5``, ``3e-4``); words (``inf``, ``nan``) are not numbers a config means.
DECIMAL_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*\.?[0-9_]*|\.[0-9_]+)(?:[eE][-+]?[0-9]+)?$")


#: The largest int any field holds: what a 64-bit counter (torch, numpy) can.
MAX_INT = 2**63 - 1


def as_float(text: str) -> float | None:
    """``text`` as a float when it is written as a decimal number (``3e-4``, ``.5``, ``1_000``), else None."""
    text = text.strip()
    return float(text.replace("_", "")) if DECIMAL_FLOAT.match(text) else None



def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "None"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, path: str, problems: list[str]) -> Any:
    """Check ``value`` against the annotation ``tp``; ints are accepted for floats."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0], path, problems)
    number = None
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        number = value
    elif tp is float and isinstance(value, str) and as_float(value) is not None:
        number = as_float(value)  # "3e-4" from a YAML 1.1 reader, a quoted value or a Python caller
    if number is not None:
        if (isinstance(number, int) and abs(number) > MAX_INT) or not math.isfinite(number):  # .inf, nan, 1e999
            problems.append(f"{path} must be a finite number. Got {short_repr(value)}.")
            return dataclasses.MISSING
        return float(number)
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if tp is bool and isinstance(value, bool):
        return value
    if tp is str and isinstance(value, str):
        return value
    if tp is str and isinstance(value, bool):  # YAML 1.1 reads a bare on/off as a boolean: the word it was
        return "on" if value else "off"
    if tp is list and isinstance(value, (list, tuple)):
        return list(value)
    if tp is list and isinstance(value, str) and value:
        return [value]  # `--set train.loggers=mlflow`: one name is a one-element list
    if tp is dict and isinstance(value, dict):
        return dict(value)
    problems.append(f"{path} must be {_type_name(tp)}. Got {short_repr(value)} ({type(value).__name__}).")
    return dataclasses.MISSING


def _build(cls: type, data: Any, prefix: str, problems: list[str]) -> Any:
    obj = cls()
    if data is None:
        return obj
    if not isinstance(data, dict):
        problems.append(f"{prefix or 'the config'} must be a mapping. Got {short_repr(data)}.")
        return obj
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1, cutoff=0.6)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            where = f"'{prefix}'" if prefix else "the top level"
            problems.append(f"Unknown key '{path}'.{hint} Valid keys at {where}: {', '.join(names)}.")
            continue
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            setattr(obj, key, _build(tp, value, path, problems))
            continue
        coerced = _coerce(value, tp, path, problems)
        if coerced is dataclasses.MISSING:
            continue
        constraints = CONSTRAINTS.get(path)
        if constraints is not None and not any(c.accepts(coerced) for c in constraints):
            wrong = next((v for v in coerced if not any(c.item.accepts(v) for c in constraints if isinstance(c, ListOf))),
                         None) if isinstance(coerced, list) else coerced
            items = [c.item for c in constraints if isinstance(c, ListOf)]
            problems.append(f"{path} must be {' or '.join(c.describe() for c in constraints)}. Got {short_repr(coerced)}."
                            + suggest_value(wrong, [*constraints, *items]))
            continue
        if isinstance(coerced, int) and not isinstance(coerced, bool) and abs(coerced) > MAX_INT:  # no cap of its own
            problems.append(f"{path} must be an int of at most {MAX_INT} (a 64-bit count). Got {short_repr(coerced)}.")
            continue
        setattr(obj, key, coerced)
    return obj


def config_from_dict(data: dict | None) -> RunConfig:
    """Build and validate a :class:`RunConfig`; raises ConfigError listing every problem."""
    problems: list[str] = []
    cfg = _build(RunConfig, data or {}, "", problems)
    problems.extend(_cross_checks(cfg))
    from dmlkit.config.components import args_problems  # deferred: reads the loss, miner and model registries

    refused = tuple(s for s in ("loss.miner", "loss", "model") if any(p.startswith(f"{s}.name ") for p in problems))
    problems.extend(args_problems(cfg, skip=refused))
    if problems:
        raise ConfigError(problems)
    if cfg.name is None:
        cfg.name = f"{cfg.data.name}-{cfg.loss.name.replace('_', '-')}"
    return cfg


def config_to_dict(cfg: RunConfig) -> dict:
    """Plain nested dict (YAML-serialisable) of a config."""
    return dataclasses.asdict(cfg)


def field_paths(cls: type = RunConfig, prefix: str = "") -> list[str]:
    """Every dotted field path of the schema (for help texts and did-you-mean)."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = f"{prefix}.{f.name}" if prefix else f.name
        if dataclasses.is_dataclass(hints[f.name]):
            out.extend(field_paths(hints[f.name], path))
        else:
            out.append(path)
    return out


def uses_pretrained_weights(cfg: Any) -> bool:
    """Whether the model starts from trained weights (offline ImageNet weights or ``model.weights``)."""
    return bool(cfg.model.pretrained) or cfg.model.weights is not None


def selects_by_significance(cfg: Any) -> bool:
    """Whether validation keeps a checkpoint only when it beats the pretrained embedding of step 0
    significantly (``protocol.selection=significant`` with trained starting weights), rather than the best MAP@R."""
    return cfg.protocol.selection == "significant" and uses_pretrained_weights(cfg)
