"""The run's splits from its config: read (``data.*``, the protocol's folds and seeds), with the transforms the model's
preprocessing asks for, and validation held out of the training split (images or classes)."""

from __future__ import annotations

import torch
from torch import nn

from dmlkit.config.schema import RunConfig
from dmlkit.core.seeds import derive_generator
from dmlkit.exceptions import DataError


def read_splits(cfg: RunConfig, preprocessing=None, *, decode: bool = True):
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
        splits = read_splits(cfg, preprocessing)
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


def _evaluate_like_test(splits) -> None:
    """A validation split cut from the training split gets the evaluation transform (no random crops or flips)."""
    evaluation = splits.test if splits.test is not None else splits.query
    if evaluation is None:  # a user's data without a test split: val keeps the training split's transform
        splits.val.augmentation_seed = None
        return
    splits.val.transform, splits.val.augmentation_seed = evaluation.transform, None


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


__all__ = ["build_splits", "hold_out_classes", "hold_out_samples", "hold_out_validation_classes", "own_data_options",
           "read_splits", "split_reading"]
