"""Photos for the claims tests: an ImageNet-pretrained backbone fine-tuned on stored frozen-stage outputs.

The set is ``grocery`` (``DATA/grocery/images/<class>/``: 81 grocery products, most of them not
ImageNet-1k classes, so the pretrained backbone has to learn; ``coarse_classes.csv`` maps each to one
of 43 coarse kinds). A fifth of the products is set aside once as the tuning pool (:func:`photo_tuning_pool`);
each seed re-draws which :data:`PHOTO_TEST_FRACTION` of the others test (:func:`split_classes`), and
:data:`PHOTO_VAL_FRACTION` of its training labels (seeded) validate (:func:`photo_splits`). A tuning run
trains on a fixed draw and is scored on the tuning pool. The ``grocery-coarse`` setting (EPS's
class-collapse claim) trains on coarse labels and is scored on fine products (``fine_*`` metrics);
``grocery-coarse-disjoint`` does the same with test products whose kinds no training product has
(:func:`split_kinds`). In both, validation is drawn as the test is (held-out products; whole kinds in the
disjoint setting) and scored as the test is (by product): :data:`COARSE_VALIDATION`.

The model is EfficientNet-Lite0 with its ImageNet weights (batch-norm statistics frozen), the stem and
its blocks through :data:`FROZEN_THROUGH` frozen, the rest (the last stage, the 1x1 head convolution and
a new :data:`PHOTO_EMBEDDING_SIZE`-D embedding) fine-tuned. The frozen stages are the same in every arm
and seed, so they run once per experiment (:func:`photo_store`,
:class:`~dmlkit.engine.frozen_stage_store.StageStore` under ``OUT/data/``): every photo at
:attr:`~dmlkit.claims.runner.Budget.photo_size` pixels through :data:`STORE_VIEWS` random resized crops
+ flips and its evaluation view (shorter side ``size * 256 / 224``, centre crop). A run
(:func:`train_photo_run`) is ``dmlkit.fit`` of :class:`~dmlkit.models.TrainedStages` on those outputs:
every stored crop of a training photo is a training item of its own (``STORE_VIEWS`` items a photo;
no augmentation on top), validation and test embed the evaluation view. The starting point is the backbone alone
(:class:`BackboneAlone`: its pooled features, without the new head), scored once per setting, split and
store (:func:`starting_point`) and shared by every arm and grid point that has it; a run learned when its
selected checkpoint beats it on validation.
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
PHOTO_SETS: dict[str, str] = {"grocery": "grocery/images", "grocery-coarse": "grocery/images",
                              "grocery-coarse-disjoint": "grocery/images"}
#: The settings trained on coarse kinds and scored on fine products.
COARSE_SETTINGS = ("grocery-coarse", "grocery-coarse-disjoint")
COARSE_FILE = "grocery/coarse_classes.csv"
#: How the coarse settings validate: on held-out products labelled by product, as their test is. Held-out kinds
#: scored by kind measured whether kind membership transfers to unseen kinds (most kinds are one product), not
#: the fine retrieval the claim is about, and a selection by it disagreed with the tuning score (products).
COARSE_VALIDATION = "products"
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
#: Fraction of the products outside the tuning pool that test, and of a seed's training labels held out (seeded)
#: to validate on: about 26 test products, 12 validating, 27 training. A validation of a handful of products sits
#: near the top of MAP@R whatever the network, too close to tell a fine-tuned embedding from the backbone's.
PHOTO_TEST_FRACTION = 0.4
PHOTO_VAL_FRACTION = 0.3
#: Fraction of the classes in the tuning pool, and the draw of the pool and of the tuning runs' training classes.
PHOTO_TUNING_FRACTION = 0.2
PHOTO_TUNING_SEED = 1_000_003


def photo_protocol(setting: str = "grocery") -> dict:
    """The fixed choices of a photo run in ``setting`` that a record must share to be read back (beside the budget's)."""
    coarse = {"validation": COARSE_VALIDATION} if setting in COARSE_SETTINGS else {}
    return {"backbone": BACKBONE, "frozen_through": FROZEN_THROUGH, "views": STORE_VIEWS,
            "test_fraction": PHOTO_TEST_FRACTION, "val_fraction": PHOTO_VAL_FRACTION, **coarse}


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
    test = order[: round(len(order) * PHOTO_TEST_FRACTION)]
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


def split_kinds(products: list[str], coarse: dict[str, str], seed: int) -> tuple[list[str], list[str]]:
    """``(train, test)`` products of ``seed`` outside the tuning pool, split by coarse kind: a seeded order of the
    kinds, test kinds taken until they hold :data:`PHOTO_TEST_FRACTION` of the products, so no test product shares a
    kind with training."""
    pool = photo_tuning_pool(products)
    kept = [p for p in sorted(products) if p not in pool]
    test_kinds: set[str] = set()
    for kind in _permuted(sorted({coarse.get(p, p) for p in kept}), seed):
        if sum(coarse.get(p, p) in test_kinds for p in kept) >= round(len(kept) * PHOTO_TEST_FRACTION):
            break
        test_kinds.add(kind)
    return ([p for p in kept if coarse.get(p, p) not in test_kinds],
            [p for p in kept if coarse.get(p, p) in test_kinds])


def photo_splits(stored: StoredStages, setting: str, seed: int, data_root: Path, tuning: bool = False) -> PhotoSplits:
    """The seed's training, validation and test data on ``stored`` (a :class:`~dmlkit.engine.frozen_stage_store.
    StoredStages`): :func:`split_classes` (:func:`split_kinds` in ``grocery-coarse-disjoint``), then a seeded
    :data:`PHOTO_VAL_FRACTION` of the training products validate (of its kinds, whole, in
    ``grocery-coarse-disjoint``). The coarse settings label training by coarse kind, validation and test by
    product (:data:`COARSE_VALIDATION`)."""
    products = sorted(set(stored.names))
    coarse = coarse_classes(data_root) if setting in COARSE_SETTINGS else {}
    if setting == "grocery-coarse-disjoint" and not tuning:
        train, test = split_kinds(products, coarse, seed)
    else:
        train, test = split_classes(products, seed, tuning)
    label = {p: coarse.get(p, p) for p in train}
    # the held-out labels: products, or kinds whole where the test holds kinds out (the disjoint setting)
    unit = label if setting == "grocery-coarse-disjoint" and not tuning else {p: p for p in train}
    units = sorted(set(unit.values()))
    held = set(_permuted(units, seed + 1)[: max(1, round(len(units) * PHOTO_VAL_FRACTION))])
    fit_products = [p for p in train if unit[p] not in held]
    val_products = [p for p in train if unit[p] in held]
    fit_rows, val_rows, test_rows = ([i for i, n in enumerate(stored.names) if n in keep]
                                     for keep in (set(fit_products), set(val_products), set(test)))
    return PhotoSplits(
        train=stored.training(fit_rows, [label[stored.names[i]] for i in fit_rows]),
        val=stored.evaluation(val_rows),  # by product in every setting, as the test (COARSE_VALIDATION)
        test=stored.evaluation(test_rows), train_classes=fit_products, val_classes=val_products, test_classes=test)


def _numbers(metrics: dict, prefix: str) -> dict:
    return {f"{prefix}{k}": v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


class BackboneAlone(torch.nn.Module):
    """The pretrained backbone's own embedding from the stored outputs: its pooled features, L2-normalised (no new
    head: a random projection would score below the features it projects)."""

    def __init__(self, embedder):
        super().__init__()
        self.embedder = embedder

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.normalize(self.embedder.features_from_prefix(features), dim=1)


def starting_point(embedder, splits: PhotoSplits, path: Path, seed: int, metrics: Callable[..., dict]) -> dict:
    """``{"val", "test"}`` scores of the backbone alone (:class:`BackboneAlone`), the row every photo table starts
    from and what a run must beat to have learned; read from ``path`` when another run of the same setting, split
    and store scored it already; ``metrics(embeddings, labels, clustering=, seed=)`` scores (the runner's, as for
    the glyph runs)."""
    from dmlkit.evaluation.embed import embed_dataset

    if path.exists():
        return json.loads(path.read_text())
    model = BackboneAlone(embedder).eval()
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
        "train": {"max_steps": budget.photo_steps_of(arm), "eval_every": budget.photo_eval_every,
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
    scheme = f"-val{COARSE_VALIDATION}" if arm.setting in COARSE_SETTINGS else ""
    start_path = Path(out) / "data" / "photo-start" / f"backbone-{arm.setting}{scheme}-{split_tag}-{stored.path.stem}.json"
    start = starting_point(embedder, splits, start_path, seed, metrics)
    result = dmlkit.fit(model, None, splits.train, val_data=splits.val, test_data=splits.test, out=run_dir,
                        resume=(run_dir / LAST_CHECKPOINT).exists(), report=False, echo=lambda s: None,
                        config=photo_config(arm, point, seed, budget, len(splits.train.class_names)))
    prefix = "fine_" if arm.setting in COARSE_SETTINGS else ""
    return {"result": result, "start": {"val": {"map_at_r": start["val"]["map_at_r"]}, "test": _numbers(start["test"], prefix)},
            "test": _numbers(result.test_metrics, prefix), "test_classes": splits.test_classes}
