"""Photos for the claims tests: an ImageNet-pretrained backbone fine-tuned on stored frozen-stage outputs.

The set is ``grocery`` (``DATA/grocery/images/<class>/``: 81 grocery products, most of them not
ImageNet-1k classes, so the pretrained backbone has to learn; ``coarse_classes.csv`` maps each to one
of 43 coarse kinds). A fifth of the products is set aside once as the tuning pool (:func:`photo_tuning_pool`);
each seed re-draws which half of the others test (:func:`split_classes`), and a fifth of its training
labels (seeded) validate (:func:`photo_splits`). A tuning run trains on a fixed draw and is scored on the
tuning pool. The ``grocery-coarse`` setting (EPS's class-collapse claim) trains and validates on coarse
labels (its validation kinds held out whole) and is scored on fine products (``fine_*`` metrics).

The model is EfficientNet-Lite0 with its ImageNet weights (batch-norm statistics frozen), the stem and
its blocks through :data:`FROZEN_THROUGH` frozen, the rest (the last stage, the 1x1 head convolution and
a new :data:`PHOTO_EMBEDDING_SIZE`-D embedding) fine-tuned. The frozen stages are the same in every arm
and seed, so they run once per experiment (:func:`photo_store`,
:class:`~dmlkit.engine.frozen_stage_store.StageStore` under ``OUT/data/``): every photo at
:attr:`~dmlkit.claims.runner.Budget.photo_size` pixels through :data:`STORE_VIEWS` random resized crops
+ flips and its evaluation view (shorter side ``size * 256 / 224``, centre crop). A run
(:func:`train_photo_run`) is ``dmlkit.fit`` of :class:`~dmlkit.models.TrainedStages` on those outputs:
every stored crop of a training photo is a training item of its own (``STORE_VIEWS`` items a photo;
no augmentation on top), validation and test embed the evaluation view. The starting point (step 0,
the pretrained backbone under the seeded new head) is scored once per setting, split, normalisation
and store (:func:`starting_point`) and shared by every arm and grid point that has it.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from dmlkit.engine.checkpoint_files import atomic_write_json
from dmlkit.engine.frozen_stage_store import StageOutputs, StageStore, StoredStages
from dmlkit.engine.run_layout import LAST_CHECKPOINT
from dmlkit.exceptions import DataError

#: Photo sets: folder under the data root and the file mapping fine classes to coarse ones.
PHOTO_SETS: dict[str, str] = {"grocery": "grocery/images", "grocery-coarse": "grocery/images"}
COARSE_FILE = "grocery/coarse_classes.csv"
BACKBONE = "efficientnet_lite0"
#: One choice for every photo arm: the embedding size, the frozen part (the stem and blocks.0-5, through the
#: stride-32 stage's first container: the last stage blocks.6, the 1x1 head convolution and the embedding train,
#: a third of the cost a step of also training blocks.5), the training crops stored of every photo and the seed
#: of their draws (docs/claims.md has the measurements).
PHOTO_EMBEDDING_SIZE = 128
FROZEN_STAGES = 4
FROZEN_THROUGH = "blocks.5"
STORE_VIEWS = 4
STORE_SEED = 0
#: Fraction of a seed's training labels held out (seeded) to validate on.
PHOTO_VAL_FRACTION = 0.2
#: Fraction of the classes in the tuning pool, and the draw of the pool and of the tuning runs' training classes.
PHOTO_TUNING_FRACTION = 0.2
PHOTO_TUNING_SEED = 1_000_003


def _images(folder: Path) -> list[str]:
    from dmlkit.data.folder import IMAGE_EXTENSIONS

    return sorted(f for f in os.listdir(folder) if f.lower().endswith(IMAGE_EXTENSIONS))


def _permuted(items: list[str], seed: int) -> list[str]:
    return [items[i] for i in torch.randperm(len(items), generator=torch.Generator().manual_seed(seed)).tolist()]


def coarse_classes(data_root: Path) -> dict[str, str]:
    """``{fine class: coarse class}`` from ``grocery/coarse_classes.csv`` (columns ``class``, ``coarse_class``)."""
    path = Path(data_root) / COARSE_FILE
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            rows = list(csv.DictReader(f))
        return {r["class"]: r["coarse_class"] for r in rows}
    except (OSError, KeyError, csv.Error, UnicodeDecodeError) as exc:
        raise DataError(f"claims: cannot read the coarse classes {str(path)!r} (expected a CSV with columns 'class' "
                        f"and 'coarse_class'): {exc}") from None


def photo_tuning_pool(classes: list[str]) -> set[str]:
    """The classes no seed ever trains, validates or tests on (a fixed draw of :data:`PHOTO_TUNING_FRACTION`)."""
    return set(_permuted(sorted(classes), PHOTO_TUNING_SEED)[: max(1, round(len(classes) * PHOTO_TUNING_FRACTION))])


def split_classes(classes: list[str], seed: int, tuning: bool = False) -> tuple[list[str], list[str]]:
    """``(train, test)`` classes of ``seed`` drawn outside the tuning pool (``tuning``: a fixed draw's training
    classes, and the pool as test classes)."""
    pool = photo_tuning_pool(classes)
    kept = [c for c in sorted(classes) if c not in pool]
    order = _permuted(kept, PHOTO_TUNING_SEED if tuning else seed)
    test = order[: len(order) // 2]
    train = sorted(set(kept) - set(test))
    return train, sorted(pool) if tuning else sorted(test)


def photo_images(data_root: Path, cap: int | None = None) -> tuple[list[str], list[str]]:
    """``(paths, products)`` of the photo set: the first ``cap`` photos (sorted by name) of every product folder."""
    source = Path(data_root) / PHOTO_SETS["grocery"]
    if not source.is_dir():
        raise DataError(f"claims: the photo folder '{source}' does not exist (expected <class>/<image> under it; "
                        "--data-root sets the folder that holds it).")
    classes = sorted(e.name for e in os.scandir(source) if e.is_dir() and not e.name.startswith("."))
    pairs = [(str(source / cls / name), cls) for cls in classes for name in _images(source / cls)[:cap]]
    return [p for p, _ in pairs], [c for _, c in pairs]


def create_photo_model(seed: int, normalization: str = "l2"):
    """The pretrained backbone with its frozen stages and a new embedding head drawn from ``seed`` (the same start for
    every arm of a seed)."""
    from dmlkit.models import create_model

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = create_model(BACKBONE, embedding_size=PHOTO_EMBEDDING_SIZE, pretrained=True, normalization=normalization,
                            pooling="avg", freeze_bn=True, frozen_stages=FROZEN_STAGES)
        model.trunk.freeze_through(FROZEN_THROUGH)
        return model


def photo_store(data_root: Path, out: Path, budget, model=None, echo=None) -> StoredStages:
    """The frozen stages' outputs of every photo at ``budget.photo_size`` (computed once, under ``out/data``);
    ``model``: a :func:`create_photo_model` at hand (its frozen stages are every seed's)."""
    paths, names = photo_images(data_root, budget.photo_cap)
    model = create_photo_model(0) if model is None else model
    return StageStore(Path(out) / "data").outputs(model, BACKBONE, paths, names,
                                                  image_size=budget.photo_size, views=STORE_VIEWS, seed=STORE_SEED,
                                                  echo=echo)


@dataclass
class PhotoSplits:
    """A seed's stored splits: training crops, validation and test evaluation views, and the classes of each."""

    train: StageOutputs
    val: StageOutputs
    test: StageOutputs
    train_classes: list[str]
    val_classes: list[str]
    test_classes: list[str]


def photo_splits(stored: StoredStages, setting: str, seed: int, data_root: Path, tuning: bool = False) -> PhotoSplits:
    """The seed's training, validation and test data on ``stored`` (a :class:`~dmlkit.engine.frozen_stage_store.
    StoredStages`): :func:`split_classes`, then a seeded fifth of the training labels (products; coarse kinds in
    ``grocery-coarse``) validate. ``grocery-coarse`` labels training and validation by coarse kind, test by product."""
    products = sorted(set(stored.names))
    train, test = split_classes(products, seed, tuning)
    coarse = coarse_classes(data_root) if setting == "grocery-coarse" else {}
    label = {p: coarse.get(p, p) for p in train}
    labels = sorted(set(label.values()))
    held = set(_permuted(labels, seed + 1)[: max(1, round(len(labels) * PHOTO_VAL_FRACTION))])
    fit_products = [p for p in train if label[p] not in held]
    val_products = [p for p in train if label[p] in held]
    fit_rows, val_rows, test_rows = ([i for i, n in enumerate(stored.names) if n in keep]
                                     for keep in (set(fit_products), set(val_products), set(test)))
    return PhotoSplits(
        train=stored.training(fit_rows, [label[stored.names[i]] for i in fit_rows]),
        val=stored.evaluation(val_rows, [label[stored.names[i]] for i in val_rows]),
        test=stored.evaluation(test_rows), train_classes=fit_products, val_classes=val_products, test_classes=test)


def _numbers(metrics: dict, prefix: str) -> dict:
    return {f"{prefix}{k}": v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def starting_point(model, splits: PhotoSplits, path: Path, seed: int, metrics: Callable[..., dict]) -> dict:
    """``{"val", "test"}`` scores of the untrained ``model`` (the backbone alone under its new head), read from
    ``path`` when another run of the same setting, split, seed and normalisation scored it already;
    ``metrics(embeddings, labels, clustering=, seed=)`` scores (the runner's, as for the glyph runs)."""
    from dmlkit.evaluation.embed import embed_dataset

    if path.exists():
        return json.loads(path.read_text())
    start = {"val": metrics(*embed_dataset(model, splits.val), clustering=False, seed=seed),
             "test": metrics(*embed_dataset(model, splits.test), clustering=True, seed=seed)}
    atomic_write_json(path, start)
    return start


def photo_config(arm, point: dict, seed: int, budget, classes: int) -> dict:
    """``dmlkit.fit``'s settings of one photo run: the arm's loss at ``point``, the budget's schedule, the photo
    recipe's optimiser (the head at 10x the backbone's rate, proxies 100x; cosine decay over the cap). A batch
    holds ``budget.m`` photos a class, more where the ``classes`` training labels are too few to fill it (the
    coarse kinds: the next count that divides the batch)."""
    from dmlkit.claims.catalogue import apply_point
    from dmlkit.recipe.rules import PRETRAINED_HEAD_LR_MULTIPLIER

    batch = budget.photo_batch_size
    return {
        "seed": seed, "loss": apply_point(arm.loss, point), "asap": arm.asap,
        "optimizer": {"name": "adamw", "lr": point["lr"], "head_lr_multiplier": PRETRAINED_HEAD_LR_MULTIPLIER,
                      "loss_lr_multiplier": 100.0, "scheduler": "cosine"},
        "sampler": {"batch_size": batch, "m": min(m for m in range(max(budget.m, -(-batch // classes)), batch + 1)
                                                  if batch % m == 0)},
        "data": {"augment": "none"},  # the stored crops are the augmentation
        "protocol": {"selection": "best"},
        "train": {"max_steps": budget.photo_steps, "eval_every": budget.photo_eval_every,
                  "checkpoint_every": budget.photo_eval_every, "progress": False, "num_threads": budget.threads,
                  "patience": budget.photo_patience, "time_budget": None, "mixed_precision": "none",
                  "device": budget.device},
    }


def train_photo_run(arm, point: dict, seed: int, run_dir: Path, data_root: Path, out: Path, budget,
                    metrics: Callable[..., dict], tuning: bool = False) -> dict:
    """Train one photo run (or resume it) on the stored frozen-stage outputs; returns the pieces of its record.

    ``{"result", "start", "test", "test_classes"}``; test metrics of ``grocery-coarse`` are on fine products,
    named ``fine_*``; ``metrics`` scores the start (:func:`starting_point`).
    """
    import dmlkit
    from dmlkit.models import TrainedStages

    embedder = create_photo_model(seed, arm.normalization)
    stored = photo_store(data_root, out, budget, embedder)
    splits = photo_splits(stored, arm.setting, seed, data_root, tuning)
    model = TrainedStages(embedder)
    split_tag = "tune" if tuning else f"seed{seed}"
    start_path = Path(out) / "data" / "photo-start" / f"{arm.setting}-{split_tag}-{arm.normalization}-{stored.path.stem}.json"
    start = starting_point(model, splits, start_path, seed, metrics)
    result = dmlkit.fit(model, None, splits.train, val_data=splits.val, test_data=splits.test, out=run_dir,
                        resume=(run_dir / LAST_CHECKPOINT).exists(), report=False, echo=lambda s: None,
                        config=photo_config(arm, point, seed, budget, len(splits.train.class_names)))
    prefix = "fine_" if arm.setting == "grocery-coarse" else ""
    return {"result": result, "start": {"val": {"map_at_r": start["val"]["map_at_r"]}, "test": _numbers(start["test"], prefix)},
            "test": _numbers(result.test_metrics, prefix), "test_classes": splits.test_classes}
