"""The run directory: resolved config, environment record, split manifest, logs, results.

Layout::

    RUN_DIR/config.yaml            resolved config
    RUN_DIR/env.json               versions, git commit, seed, command line
    RUN_DIR/manifest.json          paths and labels per split (audit which data was used), unreadable files
                                   skipped, eval_input (how evaluation reads an image: inference does the same)
    RUN_DIR/log.jsonl              one JSON object per line: kind = train | eval | projection | data (files skipped)
    RUN_DIR/tensorboard/           the same scalars as TensorBoard event files (train.tensorboard=true)
    RUN_DIR/mlruns/, RUN_DIR/wandb/  experiment trackers' local stores (train.loggers=[mlflow, wandb])
    RUN_DIR/metrics.json           final test metrics (selected_on says which split chose the weights)
    RUN_DIR/embeddings/test.npz    test embeddings, labels, proxies, thumbnails
    RUN_DIR/checkpoints/last.pt    full training state (resume)
    RUN_DIR/checkpoints/best.pt    selected weights
"""

from __future__ import annotations

import io
import json
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import numpy as np
import torch

from dmlkit.engine.checkpoint import atomic_write_bytes, atomic_write_json, atomic_write_text

PACKAGES = ("torch", "torchvision", "timm", "faiss-cpu", "numpy", "scikit-learn", "dmlkit")


def environment_record(seed: int) -> dict:
    """Package versions, git commit of dmlkit, platform, seed and command line."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    commit = None
    src = Path(__file__).resolve().parents[3]
    if (src / ".git").exists():
        try:
            commit = subprocess.run(
                ["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=False
            ).stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            commit = None
    return {
        "versions": versions,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "threads": torch.get_num_threads(),
        "git_commit": commit,
        "seed": seed,
        "command": sys.argv,
    }


class RunDirectory:
    """Writes the files of one run; every write of results is atomic."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        #: called with every record :meth:`log` writes (the trainer's callbacks: trackers, TensorBoard)
        self.listeners: list = []

    @property
    def last_checkpoint(self) -> Path:
        return self.path / "checkpoints" / "last.pt"

    @property
    def best_checkpoint(self) -> Path:
        return self.path / "checkpoints" / "best.pt"

    @property
    def log_path(self) -> Path:
        return self.path / "log.jsonl"

    def prepare(self, cfg, splits) -> None:
        """Create the directory and write config, environment and split manifest."""
        from dmlkit.config.loading import dump_config

        (self.path / "checkpoints").mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.path / "config.yaml", dump_config(cfg))
        atomic_write_json(self.path / "env.json", environment_record(cfg.seed))
        atomic_write_json(self.path / "manifest.json", split_manifest(splits))
        atomic_write_text(self.log_path, "")
        skipped = getattr(splits, "info", {}).get("skipped_images", [])
        if skipped:  # data.skip_bad_images left these files out
            self.log({"kind": "data", "step": 0, "skipped_images": len(skipped), "paths": list(skipped)})

    def record_skipped_images(self, paths, step: int) -> list[str]:
        """Count unreadable files found while the run read images per item (``data.skip_bad_images``).

        The ones ``manifest.json`` does not name yet (those left out at decode time are there from
        :meth:`prepare`) get one ``{"kind": "data", "skipped_images": N, "paths": [...]}`` line in
        ``log.jsonl`` and join ``skipped_images`` in ``manifest.json`` (rewritten atomically).
        Returns those new paths.
        """
        manifest_path = self.path / "manifest.json"
        manifest = json.loads(manifest_path.read_text(encoding="utf-8")) if manifest_path.exists() else {}
        known = list(manifest.get("skipped_images", {}).get("paths", []))
        new = sorted({str(p) for p in paths} - set(known))
        if not new:
            return []
        self.log({"kind": "data", "step": step, "skipped_images": len(new), "paths": new})
        everything = known + new
        manifest["skipped_images"] = {"count": len(everything), "paths": everything}
        atomic_write_json(manifest_path, manifest)
        return new

    def log(self, record: dict) -> None:
        """Append one JSON line (flushed) to ``log.jsonl``."""
        with open(self.log_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
        for listener in self.listeners:
            listener(record)

    def read_log(self) -> list[dict]:
        """Every complete record of ``log.jsonl`` (a torn last line is dropped)."""
        if not self.log_path.exists():
            return []
        out = []
        for line in self.log_path.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return out

    def truncate_log_after(self, step: int) -> None:
        """Drop log records newer than ``step`` (they will be replayed after a resume)."""
        kept = [r for r in self.read_log() if int(r.get("step", 0)) <= step]
        atomic_write_text(self.log_path, "".join(json.dumps(r) + "\n" for r in kept))

    def save_embeddings(self, split: str, emb: torch.Tensor, labels: torch.Tensor, dataset, objective, cfg) -> Path:
        """Write ``embeddings/<split>.npz``: the split's embeddings, labels, proxies and small thumbnails."""
        arrays = {"embeddings": emb.numpy().astype(np.float32), "labels": labels.numpy().astype(np.int64)}
        proxies = getattr(objective, "proxies", None)
        if isinstance(proxies, torch.Tensor):
            arrays["proxies"] = proxies.detach().float().cpu().numpy()
            k = getattr(objective.loss, "proxies_per_class", 1)
            k = int(k) if float(k).is_integer() and k >= 1 else 1
            arrays["proxy_labels"] = np.repeat(np.arange(proxies.shape[0] // k), k).astype(np.int64)
        thumbs = getattr(dataset, "thumbnails", None)
        if callable(thumbs):
            t = thumbs()
            if t is not None:
                arrays["thumbnails"] = t
        paths = getattr(dataset, "paths", None)
        if paths:
            arrays["paths"] = np.asarray([str(p) for p in paths])
        class_names = getattr(dataset, "class_names", None)
        if class_names:
            arrays["class_names"] = np.asarray(display_class_names(class_names, cfg))
        buf = io.BytesIO()
        np.savez_compressed(buf, **arrays)
        out = self.path / "embeddings" / f"{split}.npz"
        atomic_write_bytes(out, buf.getvalue())
        return out


def display_class_names(class_names, cfg) -> list[str]:
    """Class names as a report shows them: bare numbers get their label kind (``digit 7``), others stay."""
    names = [str(c) for c in class_names]
    if not all(n.isdigit() for n in names):
        return names
    kind = cfg.data.eval_label or cfg.data.label
    if kind == "class":
        from dmlkit.data import get_dataset_spec

        try:
            kind = get_dataset_spec(cfg.data.name).label_kinds[0]
        except Exception:  # an unregistered name: keep the generic word
            kind = "class"
    return [f"{kind} {n}" for n in names]


def split_manifest(splits) -> dict:
    """Paths (when the data set has files), labels and class names of each split (label ``i`` is
    ``class_names[i]``), unreadable files skipped, and under ``eval_input`` how the evaluation splits
    read images (:func:`dmlkit.data.splits.query_split` prepares new images so)."""
    out = {}
    for name in ("train", "val", "test", "query", "gallery"):
        ds = getattr(splits, name, None)
        if ds is None:
            continue
        labels = ds.labels.tolist() if hasattr(ds.labels, "tolist") else list(ds.labels)
        entry = {"size": len(labels), "classes": len(set(labels)), "labels": labels,
                 "class_names": [str(c) for c in getattr(ds, "class_names", [])]}
        paths = getattr(ds, "paths", None)
        if paths:
            entry["paths"] = [str(p) for p in paths]
        out[name] = entry
    info = getattr(splits, "info", None) or {}
    skipped = info.get("skipped_images", [])
    if skipped:
        out["skipped_images"] = {"count": len(skipped), "paths": [str(p) for p in skipped]}
    if "eval_input" in info:
        out["eval_input"] = info["eval_input"]
    return out


