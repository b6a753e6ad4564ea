"""Photos for the claims tests: an ImageNet-pretrained backbone fine-tuned, seeded class-disjoint splits.

Each seed re-draws which classes test: ``OUT/data/<set>-<cap>-seed<S>/{train,test}/<class>/`` holds
symbolic links to the photos (nothing is copied), which the ``folder`` data set reads as its
train / test split. The run is the photo recipe's (``dmlkit train --set data.name=folder``):
EfficientNet-Lite0 with its ImageNet weights, the last stages fine-tuned on cached outputs of the
frozen ones, random resized crops and flips, held-out validation classes of the training classes,
and a checkpoint kept only when it beats the untrained embedding of step 0 significantly. The claims
fix the backbone, the steps and the learning rate (chosen on validation classes) instead of the time
budget: 500 steps, where the recipe's mini-ImageNet runs gain significantly over the backbone (in a
30-step probe at lr 1e-4 every validation stayed below step 0's). On a CPU a run is long (that probe took
462 s for 30 steps on 2 cores shared with other training), so the photo claims run by default only with
``--device cuda``.
:class:`StartingPoint` scores the test classes with the untrained network (the backbone alone), the
row every photo table starts from.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from dmlkit.engine.callbacks import Callback
from dmlkit.engine.checkpoint_files import atomic_write_json
from dmlkit.engine.run_layout import LAST_CHECKPOINT
from dmlkit.exceptions import DataError

#: Photo sets: folder under the data root and photos kept per class (None: all). The Oxford-IIIT Pet sample is not
#: one: its 10 photos of 18 training breeds leave the pretrained embedding near its ceiling (validation MAP@R 0.73
#: at step 0, no significant gain in a probe), so no loss can show what it learns there.
PHOTO_SETS: dict[str, tuple[str, int | None]] = {
    "miniimagenet": ("miniimagenet64/images", None),
}
BACKBONE = "efficientnet_lite0"


def _images(folder: Path) -> list[str]:
    from dmlkit.data.folder import IMAGE_EXTENSIONS

    return sorted(f for f in os.listdir(folder) if f.lower().endswith(IMAGE_EXTENSIONS))


def seed_folder(data_root: Path, setting: str, seed: int, out: Path, cap: int | None = None) -> Path:
    """``out/data/<setting>-<cap>-seed<seed>``: half the classes (a seeded draw) under ``test/``, the rest under
    ``train/``, the first ``cap`` photos of each class (default: the set's own cap)."""
    sub, default_cap = PHOTO_SETS[setting]
    cap = cap or default_cap
    source = Path(data_root) / sub
    if not source.is_dir():
        raise DataError(f"claims: the photo folder '{source}' does not exist (expected <class>/<image> under it; "
                        "--data-root sets the folder that holds it).")
    target = out / "data" / f"{setting}-{cap or 'all'}-seed{seed}"
    if (target / "done").exists():
        return target
    classes = sorted(e.name for e in os.scandir(source) if e.is_dir() and not e.name.startswith("."))
    order = [classes[i] for i in torch.randperm(len(classes), generator=torch.Generator().manual_seed(seed)).tolist()]
    test = set(order[: len(order) // 2])
    for cls in classes:
        folder = target / ("test" if cls in test else "train") / cls
        folder.mkdir(parents=True, exist_ok=True)
        for name in _images(source / cls)[:cap]:
            link = folder / name
            if not link.exists():
                link.symlink_to((source / cls / name).resolve())
    atomic_write_json(target / "done", {"test_classes": sorted(test)})
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


def photo_overrides(setting_root: Path, loss: dict, point: dict, seed: int, steps: int, eval_every: int,
                    threads: int, device: str) -> list[str]:
    """The ``--set`` overrides of one photo run: the recipe's photo path with the claims' fixed choices."""
    loss = {**loss, "args": {**loss.get("args", {}), **{k: v for k, v in point.items() if k != "lr"}}}
    miner = loss.pop("miner", None)
    overrides = [
        "data.name=folder", f"data.root={setting_root}", f"model.name={BACKBONE}", f"seed={seed}",
        f"protocol.seed={seed}", f"loss.name={loss['name']}", f"loss.args={json.dumps(loss['args'])}",
        f"optimizer.lr={point['lr']:.10f}", f"train.max_steps={steps}", f"train.eval_every={eval_every}",
        f"train.checkpoint_every={eval_every}", "train.time_budget=1000000", f"train.patience={steps}",
        # pooling and mirror averaging fixed: the recipe's measured choice costs more than a short run
        "model.pooling=avg", "model.flip_average=false", "protocol.val_class_fraction=0.2",
        "train.progress=false", f"train.num_threads={threads}", f"train.device={device}",
    ]
    if miner:
        overrides += [f"loss.miner.name={miner['name']}", f"loss.miner.args={json.dumps(miner.get('args', {}))}"]
    return overrides


def train_photo_run(setting: str, loss: dict, point: dict, seed: int, run_dir: Path, data_root: Path, out: Path,
                    steps: int, eval_every: int, threads: int, device: str, cap: int | None = None) -> dict:
    """Train one photo run (or resume it) from ``dmlkit train``'s default preset; returns the pieces of its record."""
    from dmlkit.cli.train import DEFAULT_PRESET
    from dmlkit.config import load_config
    from dmlkit.engine.trainer import Trainer
    from dmlkit.recipe import prepare_run

    root = seed_folder(data_root, setting, seed, out, cap)
    overrides = photo_overrides(root, loss, point, seed, steps, eval_every, threads, device)
    cfg = load_config(preset=DEFAULT_PRESET, overrides=overrides)
    start_path = run_dir.parent / f"{run_dir.name}.start.json"
    resume = (run_dir / LAST_CHECKPOINT).exists()
    trainer = Trainer(prepare_run(cfg, echo=lambda s: None), run_dir, resume=resume, echo=lambda s: None,
                      callbacks=[StartingPoint(start_path)])
    result = trainer.fit()
    start = json.loads(start_path.read_text())
    return {"result": result, "start": {"val": {"map_at_r": start["val"]["map_at_r"]},
                                        "test": {k: v for k, v in start["test"].items() if isinstance(v, (int, float))}},
            "test": {k: v for k, v in result.test_metrics.items() if isinstance(v, (int, float))},
            "test_classes": json.loads((root / "done").read_text())["test_classes"]}
