"""Photos for the claims tests: an ImageNet-pretrained backbone fine-tuned, seeded class-disjoint splits.

The set is ``grocery`` (``DATA/grocery/images/<class>/``: 81 grocery products, most of them not
ImageNet-1k classes, so the pretrained backbone has to learn; ``coarse_classes.csv`` maps each to one
of 43 coarse kinds). A fifth of the products is set aside once as the tuning pool (:func:`photo_tuning_pool`);
each seed re-draws which of the others test: ``OUT/data/<setting>-<cap>-seed<S>/{train,test}/<class>/``
holds symbolic links to the photos (nothing is copied), which the ``folder`` data set reads as its
train / test split. The ``grocery-coarse`` setting (EPS's class-collapse claim) links its training
photos under their coarse class and tests on fine products. A tuning folder trains on a fixed draw
and tests on the tuning pool.

The run is the photo recipe's (``dmlkit train --set data.name=folder``): EfficientNet-Lite0 with its
ImageNet weights, the last stages fine-tuned on cached outputs of the frozen ones, random resized
crops and flips at :attr:`~dmlkit.claims.runner.Budget.photo_size` pixels (128 on a CPU; 224 for a
card), held-out validation classes of the training classes, and a checkpoint kept only when it beats
the pretrained embedding of step 0 significantly; training stops after ``photo_patience`` validations
without such a gain. :class:`StartingPoint` scores the test classes with the backbone alone, the row
every photo table starts from.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import torch

from dmlkit.engine.callbacks import Callback
from dmlkit.engine.checkpoint_files import atomic_write_json
from dmlkit.engine.run_layout import LAST_CHECKPOINT
from dmlkit.exceptions import DataError

#: Photo sets: folder under the data root and the file mapping fine classes to coarse ones.
PHOTO_SETS: dict[str, str] = {"grocery": "grocery/images", "grocery-coarse": "grocery/images"}
COARSE_FILE = "grocery/coarse_classes.csv"
BACKBONE = "efficientnet_lite0"
#: One choice for every photo arm: the embedding size, the frozen feature stages (timm's feature_info, highest
#: resolution first) and the augmented views cached of their outputs.
PHOTO_EMBEDDING_SIZE = 128
FROZEN_STAGES = 3
CACHE_VIEWS = 4
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


def seed_folder(data_root: Path, setting: str, seed: int, out: Path, cap: int | None = None,
                tuning: bool = False) -> Path:
    """``out/data/<setting>-<cap>-seed<seed>`` (``-tune``): the seed's train and test classes as links, the first
    ``cap`` photos of each class; ``grocery-coarse`` links its training photos under their coarse class."""
    source = Path(data_root) / PHOTO_SETS[setting]
    if not source.is_dir():
        raise DataError(f"claims: the photo folder '{source}' does not exist (expected <class>/<image> under it; "
                        "--data-root sets the folder that holds it).")
    target = out / "data" / f"{setting}-{cap or 'all'}-{'tune' if tuning else f'seed{seed}'}"
    if (target / "done").exists():
        return target
    classes = sorted(e.name for e in os.scandir(source) if e.is_dir() and not e.name.startswith("."))
    train, test = split_classes(classes, seed, tuning)
    coarse = coarse_classes(data_root) if setting == "grocery-coarse" else {}
    for split, names in (("train", train), ("test", test)):
        for cls in names:
            folder = target / split / (coarse.get(cls, cls) if split == "train" else cls)
            folder.mkdir(parents=True, exist_ok=True)
            for name in _images(source / cls)[:cap]:
                link = folder / name
                if not link.exists():
                    link.symlink_to((source / cls / name).resolve())
    atomic_write_json(target / "done", {"train_classes": train, "test_classes": test})
    return target


class StartingPoint(Callback):
    """Scores the test split with the untrained network at the step-0 validation (written once to ``path``)."""

    def __init__(self, path: Path):
        self.path = path

    def on_evaluation_end(self, trainer, step: int, metrics: dict) -> None:
        if step != 0 or self.path.exists():
            return
        test = trainer.evaluate_split(trainer.splits.test, clustering=True)
        atomic_write_json(self.path, {"val": dict(metrics), "test": test})


def photo_overrides(setting_root: Path, arm, point: dict, seed: int, budget) -> list[str]:
    """The ``--set`` overrides of one photo run: the recipe's photo path with the claims' fixed choices."""
    from dmlkit.claims.catalogue import apply_point

    loss = apply_point(arm.loss, point)
    miner = loss.pop("miner", None)
    patience = budget.photo_patience or budget.photo_steps
    overrides = [
        "data.name=folder", f"data.root={setting_root}", f"model.name={BACKBONE}", f"seed={seed}",
        f"protocol.seed={seed}", f"loss.name={loss['name']}", f"loss.args={json.dumps(loss.get('args', {}))}",
        f"optimizer.lr={point['lr']:.10f}", f"train.max_steps={budget.photo_steps}",
        f"train.eval_every={budget.photo_eval_every}", f"train.checkpoint_every={budget.photo_eval_every}",
        "train.time_budget=1000000", f"train.patience={patience}",
        f"data.image_size={budget.photo_size}", f"data.crop_size={budget.photo_size}",
        f"model.normalization={arm.normalization}", f"model.embedding_size={PHOTO_EMBEDDING_SIZE}",
        # fine-tuned as the photo recipe does on a CPU: the stages up to stride 8 frozen, their outputs cached
        # for a few augmented views, the stride-16 and -32 stages and the head trained
        f"model.frozen_stages={FROZEN_STAGES}", "train.feature_cache=on", f"train.cache_views={CACHE_VIEWS}",
        # pooling and mirror averaging fixed: the recipe's measured choice costs more than a short run
        "model.pooling=avg", "model.flip_average=false", "protocol.val_class_fraction=0.2",
        "train.progress=false", f"train.num_threads={budget.threads}", f"train.device={budget.device}",
    ]
    overrides += [f"asap.{k}={json.dumps(v) if isinstance(v, (dict, list)) else v}" for k, v in arm.asap.items()]
    if miner:
        overrides += [f"loss.miner.name={miner['name']}", f"loss.miner.args={json.dumps(miner.get('args', {}))}"]
    return overrides


def _numbers(metrics: dict, prefix: str) -> dict:
    return {f"{prefix}{k}": v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def train_photo_run(arm, point: dict, seed: int, run_dir: Path, data_root: Path, out: Path, budget,
                    tuning: bool = False) -> dict:
    """Train one photo run (or resume it) from ``dmlkit train``'s default preset; returns the pieces of its record.

    Test metrics of ``grocery-coarse`` are on fine products: named ``fine_*``.
    """
    from dmlkit.cli.train import DEFAULT_PRESET
    from dmlkit.config import load_config
    from dmlkit.engine.run_dir import release_locks
    from dmlkit.launch import launch

    root = seed_folder(data_root, arm.setting, seed, out, budget.photo_cap, tuning)
    cfg = load_config(preset=DEFAULT_PRESET, overrides=photo_overrides(root, arm, point, seed, budget))
    start_path = run_dir.parent / f"{run_dir.name}.start.json"
    resume = (run_dir / LAST_CHECKPOINT).exists()
    try:  # the one launch sequence of every run (claims the folder, keeps RUN/train.log)
        with launch(cfg, run_dir, resume=resume, report=False, callbacks=[StartingPoint(start_path)],
                    echo=lambda s: None) as trainer:
            result = trainer.fit()
    finally:
        release_locks()
    start = json.loads(start_path.read_text())
    prefix = "fine_" if arm.setting == "grocery-coarse" else ""
    return {"result": result, "start": {"val": {"map_at_r": start["val"]["map_at_r"]}, "test": _numbers(start["test"], prefix)},
            "test": _numbers(result.test_metrics, prefix),
            "test_classes": json.loads((root / "done").read_text())["test_classes"]}
