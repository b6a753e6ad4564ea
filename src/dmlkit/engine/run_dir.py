"""The run directory: claiming its folder, and writing the resolved config, environment record, split
manifest, log and embeddings (the file names: :mod:`dmlkit.engine.run_layout`)."""

from __future__ import annotations

import errno
import io
import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import numpy as np
import torch

from dmlkit.core.json_files import parse_json, read_json
from dmlkit.engine import run_layout as layout
from dmlkit.engine.checkpoint_files import (
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    open_for_append,
    raise_if_out_of_space,
)
from dmlkit.engine.run_layout import CLAIM_FILE
from dmlkit.exceptions import ConfigError, RecordError

#: What a folder written before claims existed holds when it is a run of each kind (so it may be resumed):
#: any one of the groups, each group's files all present.
_LEGACY_MARKS = {"train": ((layout.CONFIG_FILE, layout.ENV_FILE, layout.MANIFEST_FILE),
                           (layout.CONFIG_FILE, layout.LAST_CHECKPOINT)),
                 "sweep": ((layout.SWEEP_STUDY_FILE,),),
                 "crossval": ((layout.CROSSVAL_SUMMARY_FILE,), ("seed0",))}
_held_locks: dict[str, int] = {}  # folder -> open descriptor holding its lock until the command ends

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


def _listing(path: Path, limit: int = 5) -> str:
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir() if p.name != CLAIM_FILE)
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _lock(path: Path) -> None:
    """Hold an exclusive ``fcntl`` lock on the folder until :func:`release_locks` or the end of the process."""
    import fcntl

    key = str(path.resolve())
    if key in _held_locks:
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        os.close(fd)
        if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise ConfigError(f"{str(path)!r} is being written by another dmlkit process; wait for it to finish "
                              "or choose another --out.") from None
        raise
    _held_locks[key] = fd


def release_locks() -> None:
    """Drop the folder locks this process holds (the end of a command run in-process; exiting drops them too)."""
    while _held_locks:
        os.close(_held_locks.popitem()[1])


class Claim:
    """A folder claimed by :func:`claim_directory`; :meth:`release` undoes a fresh claim (nothing was written)."""

    def __init__(self, path: Path, fresh: bool, created: bool):
        self.path, self.fresh, self.created = path, fresh, created

    def release(self) -> None:
        """Undo a fresh claim when nothing but the claim file was written: remove it, and the folder when this
        claim created it. A folder the command has written into stays claimed (it can be resumed)."""
        if not self.fresh or not self.path.is_dir() or any(p.name != CLAIM_FILE for p in self.path.iterdir()):
            return
        (self.path / CLAIM_FILE).unlink(missing_ok=True)
        if self.created:
            self.path.rmdir()


def claim_directory(path: str | Path, kind: str, *, resume: bool = False, option: str = "--out") -> Claim:
    """Claim ``path`` for one ``kind`` of command (``train``, ``sweep``, ``crossval``) before anything is written.

    A folder is written into only when it is new (absent or empty) or already claimed by the same
    kind of command being resumed (``resume=True``; a sweep or cross-validation rerun resumes); a
    folder of the same kind written before claims existed counts as claimed. Anything else — a file,
    a folder of the user's files, a run of another kind, a finished or running run without
    ``resume`` — is a :class:`ConfigError` naming the folder and what is in it, and nothing is touched.
    The claim is the file :data:`CLAIM_FILE`, written atomically while an exclusive ``fcntl`` lock on the
    folder is held; the lock is kept until the command ends (:func:`release_locks`, called by the CLI) or
    the process exits, so two processes never write one folder.
    """
    path = Path(path)
    if os.environ.get("RANK", "0") != "0":  # under torchrun, rank 0 claims the folder for every rank
        return Claim(path, fresh=False, created=False)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{option} {str(path)!r} is a file, not a folder; choose a folder name.")
    created = not path.exists()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"{option} {str(path)!r}: cannot create the folder ({err.strerror}).") from None
    _lock(path)
    marker = path / CLAIM_FILE
    entries = [p for p in path.iterdir() if p.name != CLAIM_FILE]
    claimed = None
    if marker.is_file():
        try:
            claimed = read_json(marker).get("kind")
        except (RecordError, OSError):
            claimed = "unreadable"
        if claimed != kind:
            raise ConfigError(f"{option} {str(path)!r} holds a {claimed} folder, not a {kind} run "
                              f"({_listing(path)}); choose another {option}.")
    elif entries and not any(all((path / name).exists() for name in group) for group in _LEGACY_MARKS[kind]):
        raise ConfigError(f"{option} {str(path)!r} is not empty and is not a dmlkit {kind} run: it holds "
                          f"{_listing(path)}. dmlkit writes only into a new folder or one of its own runs being "
                          f"resumed; choose another {option}.")
    if entries and not resume:
        hint = f"use --resume {path} to continue it" if kind == "train" else "rerun the same command to resume it"
        raise ConfigError(f"{option} {str(path)!r} already holds a run; {hint} or choose another {option} "
                          f"(it holds {_listing(path)}).")
    if claimed is None:
        try:
            atomic_write_json(marker, {"kind": kind, "pid": os.getpid(), "command": sys.argv})
        except OSError as err:  # a read-only mount, a folder of another user
            raise_if_out_of_space(err, marker)
            raise ConfigError(f"{option} {str(path)!r}: cannot write there ({err.strerror or err}); choose a folder "
                              f"this user can write, e.g. {option} runs/NAME.") from None
    return Claim(path, fresh=not entries, created=created)


class RunDirectory:
    """Writes the files of one run; every write of results is atomic."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        #: called with every record :meth:`log` writes (the trainer's callbacks: trackers, TensorBoard)
        self.listeners: list = []

    @property
    def last_checkpoint(self) -> Path:
        return self.path / layout.LAST_CHECKPOINT

    @property
    def best_checkpoint(self) -> Path:
        return self.path / layout.BEST_CHECKPOINT

    @property
    def log_path(self) -> Path:
        return self.path / layout.LOG_FILE

    def prepare(self, cfg, splits, device: str | None = None, weights: dict | None = None) -> None:
        """Create the directory and write config, environment (with the ``device`` trained on) and split manifest.

        ``weights``: the pretrained weights the model started from (tag, source, path, SHA-256;
        :class:`dmlkit.models.hub.PretrainedWeights`), kept as ``manifest.json``'s ``pretrained_weights``.
        """
        from dmlkit.config.loading import dump_config

        (self.path / layout.CHECKPOINTS_DIR).mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.path / layout.CONFIG_FILE, dump_config(cfg))
        environment = environment_record(cfg.seed)
        if device is not None:
            environment["device"] = device
        atomic_write_json(self.path / layout.ENV_FILE, environment)
        manifest = split_manifest(splits)
        if weights is not None:
            manifest["pretrained_weights"] = weights
        atomic_write_json(self.path / layout.MANIFEST_FILE, manifest)
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
        manifest_path = self.path / layout.MANIFEST_FILE
        manifest = read_json(manifest_path) if manifest_path.exists() else {}
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
        line = json.dumps(record) + "\n"
        try:
            with open_for_append(self.log_path) as f:  # never through a link
                f.write(line)
                f.flush()
        except OSError as err:
            raise_if_out_of_space(err, self.log_path, len(line))
            raise
        for listener in self.listeners:
            listener(record)

    def read_log(self) -> list[dict]:
        """Every complete record of ``log.jsonl`` (a torn last line is dropped)."""
        if not self.log_path.exists():
            return []
        out = []
        for line in self.log_path.read_text(encoding="utf-8").splitlines():
            try:
                out.append(parse_json(line, repr(str(self.log_path))))
            except RecordError:
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
        out = self.path / layout.embeddings_file(split)
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
    if "class_split" in info:  # how a folder's classes were divided (the classes are each split's class_names)
        out["class_split"] = info["class_split"]
    return out


