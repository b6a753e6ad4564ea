"""Build the parts of a run from its config: data, model, training objective, batches."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Iterator

import torch
from torch import nn

from dmlkit._cpu_ops import cpu_bf16_native
from dmlkit.config.schema import RunConfig
from dmlkit.engine import distributed
from dmlkit.engine.objective import EnsembleObjective, TrainingObjective
from dmlkit.exceptions import ConfigError, DataError, InvalidParameterError
from dmlkit.seeds import derive_generator


def device_and_processes(cfg: RunConfig) -> tuple[torch.device, distributed.DistInfo]:
    """The run's device (under torchrun this rank's GPU) and its process group, joined; ``train.num_threads`` set."""
    device = resolve_device(cfg.train.device, local_rank=distributed.torchrun_local_rank())
    dist = distributed.init_distributed(backend="nccl" if device.type == "cuda" else "gloo")
    if cfg.train.num_threads:
        torch.set_num_threads(cfg.train.num_threads)
    return device, dist


def resolve_device(spec: str, *, local_rank: int | None = None) -> torch.device:
    """The device ``train.device`` names: ``auto`` is CUDA when available, else the CPU.

    ``local_rank`` (a torchrun worker's ``LOCAL_RANK``; None in a single process) makes ``cuda``
    mean ``cuda:LOCAL_RANK``: every rank trains on its own GPU. Asking for CUDA where
    ``torch.cuda.is_available()`` is False, or for a GPU index that is not there, is a ConfigError.
    """
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    if spec == "cpu":
        return torch.device("cpu")
    if not (spec == "cuda" or spec.startswith("cuda:") and spec[5:].isdigit()):
        raise ConfigError(f"train.device must be one of 'auto', 'cpu', 'cuda', 'cuda:N' (N a GPU index). Got {spec!r}.")
    if not torch.cuda.is_available():
        raise ConfigError(
            f"train.device={spec!r} asks for a GPU, but torch.cuda.is_available() is False here (no visible "
            "CUDA device, or a CPU-only PyTorch build). Use train.device=cpu, or auto to take a GPU only when there is one."
        )
    index = int(spec[5:]) if spec != "cuda" else None
    if local_rank is not None:
        if index is not None and index != local_rank:
            raise ConfigError(
                f"train.device={spec!r}: under torchrun every rank trains on cuda:LOCAL_RANK (this is rank "
                f"{local_rank} on its machine); set train.device=cuda (or auto) and pick GPUs with CUDA_VISIBLE_DEVICES."
            )
        index = local_rank
    count = torch.cuda.device_count()
    if index is None:
        index = torch.cuda.current_device()
    if index >= count:
        raise ConfigError(
            f"train.device asks for cuda:{index}, but only {count} CUDA device(s) are visible (cuda:0 ... cuda:{count - 1})."
        )
    return torch.device("cuda", index)


def model_arguments(cfg: RunConfig) -> dict:
    """What :func:`build_model` passes ``dmlkit.models.create_model`` for one model (or ensemble member)."""
    m = cfg.model
    return dict(
        embedding_size=m.embedding_size,
        normalization=m.normalization,
        pooling=m.pooling,
        pretrained=m.pretrained,
        weights=m.weights,
        freeze_bn=m.freeze_bn,
        frozen_stages=m.frozen_stages or 0,
        shift_average=m.shift_average or 0,
        flip_average=bool(m.flip_average),
        head_init=m.head_init or "kaiming",  # the recipe's identity head for a pretrained backbone
        **m.args,
    )


def build_model(cfg: RunConfig, *, first_member: nn.Module | None = None) -> nn.Module:
    """The embedding model named by ``cfg.model`` (``dmlkit.models.create_model``).

    With ``model.ensemble=N > 1`` an :class:`~dmlkit.models.EmbedderEnsemble`: the first member is
    built from the global RNG as a single model would be, member ``i`` from the stream
    ``derive_seed(seed, "ensemble member", i)``. ``first_member`` (a model already built from ``cfg`` as a single
    model) is taken as the first member rather than built again; the global RNG is left as it was.
    """
    from dmlkit.models import EmbedderEnsemble, create_model
    from dmlkit.seeds import derive_seed

    m = cfg.model

    def member() -> nn.Module:
        try:
            return create_model(m.name, **model_arguments(cfg))
        except TypeError as exc:  # a timm model's keyword arguments are known only to timm
            if isinstance(exc, InvalidParameterError) and str(exc).startswith("Unknown model"):
                raise ConfigError(f"model.name: {exc}") from None  # the name is at fault, not the recipe's args
            if not m.args:
                raise
            raise ConfigError(f"model.args {m.args} do not fit model {m.name!r} (passed on to timm): {exc}") from None

    size = m.ensemble or 1
    if size == 1:
        return first_member if first_member is not None else member()
    members = [first_member if first_member is not None else member()]
    state = torch.random.get_rng_state()
    for i in range(1, size):
        torch.manual_seed(derive_seed(cfg.seed, "ensemble member", i))
        members.append(member())
    torch.random.set_rng_state(state)  # what comes after the model draws as it would after one member
    return EmbedderEnsemble(members)


def _read_splits(cfg: RunConfig, preprocessing=None, *, decode: bool = True):
    """``data.build_splits`` with the config's data and protocol options (photos as their centre-crop view)."""
    from dmlkit import data as dm
    from dmlkit.data.download import ensure_dataset

    d = cfg.data
    ensure_dataset(d.name, d.root, d.download)  # data.download=true: fetched once, before the first read
    photos = decode and d.crop_size is not None and d.image_size is not None
    return dm.build_splits(
        d.name, root=d.root, label=d.label, eval_label=d.eval_label, image_size=d.image_size,
        fold=cfg.protocol.fold, num_folds=cfg.protocol.num_folds, seed=cfg.protocol.seed,
        skip_bad_images=d.skip_bad_images, preprocessing=preprocessing, cache_in_memory=decode,
        center_crop=photos, crop_size=d.crop_size if photos else None, pipeline=d.pipeline,
        **own_data_options(cfg),
    )


def own_data_options(cfg: RunConfig) -> dict:
    """The reader options of the users' own data sets (``folder``, ``csv``): the class split, seeded by
    ``protocol.seed`` like every data split, and for a CSV whether its paths may leave its folder."""
    d = cfg.data
    if d.name not in ("folder", "csv"):
        return {}
    options = {"class_split": d.class_split, "split_seed": cfg.protocol.seed}
    return {**options, "allow_outside_root": d.allow_outside_root} if d.name == "csv" else options


def build_batch_augmentation(cfg: RunConfig, fill: list[float]):
    """The batched training augmentation of ``data.augment`` (None for ``none``), called with a generator.

    ``crop`` with a paper ``data.pipeline`` is that pipeline's training crop of the stored views
    (:meth:`~dmlkit.data.transforms.PhotoPipeline.train_batch`); ``fill`` is the background as the
    model sees it (the affine warp's fill).
    """
    from dmlkit.data.transforms import batch_augmentation, photo_pipeline

    d = cfg.data
    if d.augment == "crop" and d.pipeline != "recipe":
        return photo_pipeline(d.pipeline, d.image_size, d.crop_size).train_batch()
    return batch_augmentation(d.augment, d.max_shift, fill=fill, crop_size=d.crop_size)


def survey_data(cfg: RunConfig):
    """The splits as read before any model exists (image files not decoded), for the recipe's first look."""
    return _read_splits(cfg, decode=False)


def build_splits(cfg: RunConfig, model: nn.Module, survey=None):
    """Train/val/test splits with the transforms the model's preprocessing asks for.

    ``survey`` (from :func:`survey_data`) is reused when it already holds every split in memory
    (MNIST, digits, zipped glyphs): only its transforms change to the model's normalisation.
    """
    from dmlkit.data.transforms import tensor_transform

    preprocessing = getattr(model, "pretrained_cfg", None)
    if survey is not None and all(getattr(ds, "images", None) is not None for _, ds in survey.items()) \
            and cfg.data.crop_size is None:
        splits = survey
        for _, dataset in splits.items():
            dataset.transform = tensor_transform(preprocessing)
    else:
        splits = _read_splits(cfg, preprocessing)
    p = cfg.protocol
    if p.val_fraction > 0 and splits.val is None:
        splits.train, splits.val = hold_out_samples(splits.train, p.val_fraction, p.seed)
        _evaluate_like_test(splits)
    if p.val_class_fraction and splits.val is None:  # set by the user, or by the recipe in a saved config.yaml
        hold_out_validation_classes(splits, p.val_class_fraction, p.seed)
    return splits


def split_reading(cfg: RunConfig, model: nn.Module) -> dict:
    """Everything :func:`build_splits` reads (without a survey): the data options it passes on, the protocol's
    split fields and the model's preprocessing. Splits read where two of these are equal are the same splits."""
    d, p = cfg.data, cfg.protocol
    return {
        "data": (d.name, d.root, d.label, d.eval_label, d.image_size, d.crop_size, d.skip_bad_images, d.pipeline,
                 tuple(sorted(own_data_options(cfg).items()))),
        "protocol": (p.fold, p.num_folds, p.seed, p.val_fraction),
        "val_class_fraction": p.val_class_fraction,
        "preprocessing": getattr(model, "pretrained_cfg", None),
    }


def hold_out_validation_classes(splits, fraction: float, seed: int) -> None:
    """Hold ``fraction`` of the training classes out of ``splits`` as its validation split (seeded by ``seed``);
    the training split before it is kept as ``splits.before_holdout``."""
    splits.before_holdout = splits.train
    splits.train, splits.val = hold_out_classes(splits.train, fraction, seed)
    _evaluate_like_test(splits)
    splits.info["val_classes"] = list(splits.val.class_names)


def background_fill(splits, background) -> list[float]:
    """The batch augmentation's fill: ``background`` (per channel, as the data holds it) after the training split's
    normalisation, as the model sees it."""
    background = torch.tensor(background).view(1, -1, 1, 1)
    transform = splits.train.transform
    return (transform(background) if getattr(transform, "batched", False) else background).flatten().tolist()


def _evaluate_like_test(splits) -> None:
    """A validation split cut from the training split gets the evaluation transform (no random crops or flips)."""
    evaluation = splits.test if splits.test is not None else splits.query
    if evaluation is None:  # a user's data without a test split: val keeps the training split's transform
        splits.val.augmentation_seed = None
        return
    splits.val.transform, splits.val.augmentation_seed = evaluation.transform, None


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` computes bf16 natively (a GPU with bf16; a CPU with AVX512-BF16 or AMX via oneDNN)."""
    if device.type == "cuda":  # Ampere or newer; older cards only emulate bf16 (slower than fp32)
        with torch.cuda.device(device):
            return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    if device.type == "cpu":
        return cpu_bf16_native()
    return False


def hold_out_classes(dataset, fraction: float, seed: int):
    """Hold out a seeded ``fraction`` of the classes (at least 2, at least 2 left) as a class-disjoint validation split."""
    from dmlkit.data.splits import split_classes

    names = [dataset.class_names[i] for i in dataset.labels.tolist()]
    classes = sorted(set(names))
    kept, held = split_classes(classes, 1.0 - fraction, seed)
    if len(held) < 2 or len(kept) < 2:
        raise DataError(f"protocol.val_class_fraction={fraction} of {len(classes)} classes leaves fewer than 2 "
                        "classes on one side; use 0 (no class-disjoint validation) or more classes.")
    held_set = set(held)
    is_val = torch.tensor([n in held_set for n in names])
    rows = torch.arange(len(names))
    return dataset.subset(rows[~is_val]), dataset.subset(rows[is_val])


def hold_out_samples(dataset, fraction: float, seed: int):
    """Split every class's images into train and validation parts (``fraction`` to validation, >= 1 each).

    Classes with a single image stay in training.
    """
    from dmlkit.data.splits import shuffle_within_classes

    labels = dataset.labels
    generator = derive_generator(seed, "val_hold_out")
    order, rank = shuffle_within_classes(labels, generator)
    count_of = torch.bincount(labels)
    n_val = torch.where(count_of > 1, (count_of.double() * fraction).round().long().clamp(1), 0)
    n_val = torch.minimum(n_val, (count_of - 1).clamp_min(0))
    is_val = rank < n_val[labels[order]]
    train_rows, val_rows = order[~is_val].sort().values, order[is_val].sort().values
    if len(val_rows) == 0:
        raise DataError(f"protocol.val_fraction={fraction} leaves no validation images (every class has one image).")
    return dataset.subset(train_rows, relabel=False), dataset.subset(val_rows, relabel=False)


def _resolve_distance(args: dict) -> dict:
    """``distance: euclidean`` (or ``{name, args}``) in loss/miner args becomes a distance object."""
    from dmlkit.distances import DISTANCES

    spec = args.get("distance")
    if isinstance(spec, str):
        args["distance"] = DISTANCES.create(spec)
    elif isinstance(spec, dict):
        if "name" not in spec or not set(spec) <= {"name", "args"}:
            raise ConfigError(f"distance must be a name or a mapping {{name: ..., args: {{...}}}}. Got {spec!r}.")
        args["distance"] = DISTANCES.create(spec["name"], **dict(spec.get("args") or {}))
    return args


def _nested_loss(spec):
    """A loss inside a loss (``ProxyPairLoss(pair_loss=...)``): a name or ``{name, args}``."""
    from dmlkit.losses import LOSSES

    if isinstance(spec, str):
        return LOSSES.create(spec)
    if isinstance(spec, dict) and "name" in spec and set(spec) <= {"name", "args"}:
        return LOSSES.create(spec["name"], **_resolve_distance(dict(spec.get("args") or {})))
    raise ConfigError(
        f"loss.args.pair_loss must be a loss name or a mapping {{name: ..., args: {{...}}}}. Got {spec!r}."
    )


def build_objective(cfg: RunConfig, num_classes: int, *, loss: nn.Module | None = None,
                    miner: nn.Module | None = None, member_folds=None) -> TrainingObjective | EnsembleObjective:
    """Loss from the registry (proxy losses get ``num_classes``/``embedding_size``), miner, memory.

    A ``loss`` or ``miner`` object (dmlkit's or pytorch-metric-learning's) is used instead of the
    config's. With ``model.ensemble=N > 1``: N such objectives, one per member
    (:class:`EnsembleObjective`; config-built losses only); with ``member_folds``
    (:class:`~dmlkit.engine.member_folds.MemberFolds`) each over its member's own training classes.
    """
    size = cfg.model.ensemble or 1
    if size > 1:
        if loss is not None or miner is not None:
            raise ConfigError(f"model.ensemble={size} trains one loss per member; it cannot share one loss or "
                              "miner object. Set model.ensemble=1, or name the loss in the config.")
        if member_folds is not None:
            return EnsembleObjective([build_member_objective(cfg, count) for count in member_folds.class_counts()],
                                     [cfg.model.embedding_size] * size, member_labels=member_folds.label_maps)
        return EnsembleObjective([build_member_objective(cfg, num_classes) for _ in range(size)],
                                 [cfg.model.embedding_size] * size)
    return build_member_objective(cfg, num_classes, loss, miner)


def build_member_objective(cfg: RunConfig, num_classes: int, loss: nn.Module | None = None,
                           miner: nn.Module | None = None) -> TrainingObjective:
    """One model's objective: the loss (the config's, or ``loss``), miner and cross-batch memory; what
    :func:`build_objective` gives each ensemble member (and the glyph plan times with a member's step)."""
    from dmlkit.mining import MINERS

    lc = cfg.loss
    if loss is None:
        loss = _config_loss(cfg, num_classes)
    if miner is None and lc.miner.name:
        miner = MINERS.create(lc.miner.name, **_resolve_distance(dict(lc.miner.args)))
    memory = None
    if lc.memory.memory_size > 0:
        from dmlkit.memory import CrossBatchMemory

        memory = CrossBatchMemory(
            loss,
            embedding_size=cfg.model.embedding_size,
            memory_size=lc.memory.memory_size,
            miner=miner,
            warmup_steps=lc.memory.warmup_steps,
        )
    return TrainingObjective(loss, miner, memory)


def _config_loss(cfg: RunConfig, num_classes: int) -> nn.Module:
    """The loss ``cfg.loss`` names, with the arguments the run and the enabled method add."""
    from dmlkit.losses import LOSSES
    from dmlkit.methods import loss_arguments

    lc = cfg.loss
    factory = LOSSES.get(lc.name)
    args = _resolve_distance(dict(lc.args))
    for key, value in (("num_classes", num_classes), ("embedding_size", cfg.model.embedding_size)):
        if key not in args and key in inspect.signature(factory).parameters:
            args[key] = value
    if "pair_loss" in args:
        args["pair_loss"] = _nested_loss(args["pair_loss"])
    args = loss_arguments(cfg, factory, args)
    try:
        return factory(**args)
    except TypeError as exc:
        raise ConfigError(f"loss.args do not fit loss {lc.name!r}: {exc}") from None


# ----------------------------------------------------------------------------- batches


class LabelMap:
    """Maps a split's label ids onto contiguous ``0..C-1`` (proxy rows are indexed by class)."""

    def __init__(self, labels: torch.Tensor):
        self.classes = torch.unique(labels)
        self._lookup = {int(c): i for i, c in enumerate(self.classes.tolist())}
        offset = int(self.classes.min())
        span = int(self.classes.max()) - offset + 1
        self._table = None
        if span <= 10_000_000:
            table = torch.full((span,), -1, dtype=torch.int64)
            table[self.classes - offset] = torch.arange(len(self.classes))
            self._table, self._offset = table, offset

    def __len__(self) -> int:
        return len(self.classes)

    def __call__(self, labels: torch.Tensor) -> torch.Tensor:
        if self._table is not None:
            return self._table[labels - self._offset]
        return torch.tensor([self._lookup[int(v)] for v in labels.tolist()], dtype=torch.int64)


@dataclass
class BatchPosition:
    """Where the batch stream is: epoch and batches consumed in it (resumable)."""

    epoch: int = 0
    batch_in_epoch: int = 0


def build_batch_sampler(cfg: RunConfig, labels: torch.Tensor, *, rank: int = 0, world_size: int = 1,
                        member_folds=None, seed: int | None = None):
    """The sampler named by ``cfg.sampler`` (``dmlkit.data.samplers``), seeded by ``seed`` (default ``cfg.seed``);
    with ``member_folds`` one per member over its own training rows, side by side
    (:class:`~dmlkit.engine.member_folds.MemberBatchSampler`; member 0 seeded by ``cfg.seed``, the others by seeds
    derived from it)."""
    from dmlkit.data.samplers import create_sampler

    if member_folds is not None:
        from dmlkit.engine.member_folds import MemberBatchSampler
        from dmlkit.seeds import derive_seed

        seeds = [cfg.seed] + [derive_seed(cfg.seed, "member sampler", i) for i in range(1, member_folds.members)]
        samplers = [build_batch_sampler(cfg, labels[rows], rank=rank, world_size=world_size, seed=member_seed)
                    for rows, member_seed in zip(member_folds.train_rows, seeds)]
        return MemberBatchSampler(samplers, member_folds.train_rows)
    s = cfg.sampler
    if len(labels) < s.batch_size * world_size:
        raise DataError(
            f"The training split has {len(labels)} images, fewer than one batch of sampler.batch_size={s.batch_size}"
            + (f" x {world_size} processes" if world_size > 1 else "")
            + ": set a smaller sampler.batch_size or add images."
        )
    classes = int(torch.as_tensor(labels).unique().numel())
    needed = 2 if s.name != "m_per_class" else max(2, s.batch_size // s.m)
    if classes < needed:  # said of the split and the settings, before the sampler's own check of its arguments
        raise DataError(
            f"The train split has {classes} class{'' if classes == 1 else 'es'}"
            + (f"; sampler.batch_size={s.batch_size} with sampler.m={s.m} needs {needed} per batch: lower "
               "sampler.batch_size, raise sampler.m or add classes." if classes >= 2 else
               "; metric learning needs at least 2 classes to train on: add classes (more class folders, or more "
               "labels in the train rows).")
        )
    common = dict(batch_size=s.batch_size, seed=cfg.seed if seed is None else seed, rank=rank, world_size=world_size)
    if s.name == "m_per_class":
        # an epoch is one pass over the training split (PML's default length is 100000 images)
        return create_sampler("m_per_class", labels=labels, m=s.m, length_before_new_iter=len(labels), **common)
    if s.name == "one_per_class":
        return create_sampler("one_per_class", labels=labels, **common)
    return create_sampler("random", num_samples=len(labels), **common)


def iterate_training_batches(
    dataset, sampler, position: BatchPosition, num_workers: int = 0, *, pin_memory: bool = False,
) -> Iterator[tuple[list[int], torch.Tensor, torch.Tensor, BatchPosition]]:
    """``(indices, images, labels, position)`` from ``position`` on, forever.

    In-memory data sets index whole batches at once (on their images' device: a split moved to the
    GPU gives batches there); image-file data sets are decoded and augmented in ``num_workers``
    DataLoader worker processes (one loader per epoch, created after ``dataset.set_epoch`` so
    augmentation seeds follow the epoch), into page-locked memory with ``pin_memory`` (training on a
    GPU: the copy to the card does not block).
    """
    while True:
        epoch, start = position.epoch, position.batch_in_epoch
        if hasattr(dataset, "set_epoch"):
            dataset.set_epoch(epoch)
        batches = sampler.batches(epoch)
        if len(batches) == 0:
            raise DataError("The batch sampler produced no batch: the training split is too small for the sampler settings.")
        remaining = batches[start:].tolist()
        if num_workers > 0 and not hasattr(dataset, "get_batch"):
            loader = torch.utils.data.DataLoader(dataset, batch_sampler=remaining, num_workers=num_workers,
                                                 pin_memory=pin_memory)
            stream = ((idx, x, torch.as_tensor(y, dtype=torch.int64)) for idx, (x, y) in zip(remaining, loader))
        else:
            stream = ((idx, *fetch_batch(dataset, idx)) for idx in remaining)
        for offset, (idx, images, labels) in enumerate(stream):
            yield idx, images, labels, BatchPosition(epoch, start + offset + 1)
        position = BatchPosition(epoch + 1, 0)


def fetch_batch(dataset, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Images and labels of ``indices``: in-memory data sets batch-index directly."""
    if hasattr(dataset, "get_batch"):
        return dataset.get_batch(indices)
    items = [dataset[i] for i in indices]
    images = torch.stack([it[0] for it in items])
    labels = torch.as_tensor([int(it[1]) for it in items], dtype=torch.int64)
    return images, labels
