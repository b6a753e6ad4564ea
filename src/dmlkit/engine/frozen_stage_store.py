"""A frozen prefix's outputs for every image of a photo set, computed once and shared by every run on disk.

Many runs that fine-tune the same pretrained backbone with the same frozen stages (a comparison of
losses over arms, seeds and grid points) would each run those stages over the same photos.
:class:`StageStore` runs them once per key: every image is decoded to its evaluation view
(:func:`~dmlkit.data.transforms.photo_view`: shorter side ``image_size * 256 / 224``, centre
crop), then :meth:`~dmlkit.engine.frozen_stage_cache.FrozenFeatureCache.build` runs
:meth:`~dmlkit.models.Embedder.prefix` on ``views`` random resized crops + flips of that view (the
photo pipeline's training crops; view ``v`` drawn from the stream of ``(seed, v)``) and on the view
itself. The result, ``[N, views + 1, h, w, C]`` in bf16 (the last view is the evaluation view), is
written atomically with a checksum under a name derived from :class:`StageKey` (backbone, a SHA-256
of the frozen stages' weights, frozen stages, size, views, seed, crops, and the images' and labels'
fingerprint, as :mod:`dmlkit.engine.pooled_feature_store` keys its files). Every later run with the
same key maps the file read-only (processes share its pages); a file that cannot be read or fails
its checksum is computed again, never used.

:meth:`StoredStages.training` and :meth:`StoredStages.evaluation` give map-style datasets of the
stored outputs (items ``([C, h, w] float32, label)``) that ``dmlkit.fit`` trains
:class:`~dmlkit.models.TrainedStages` on.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch import nn

from dmlkit.core.messages import messages
from dmlkit.engine.frozen_stage_cache import FrozenFeatureCache, format_size
from dmlkit.engine.pooled_feature_store import (
    images_fingerprint,
    key_digest,
    label_ids,
    load_keyed,
    save_keyed,
    weights_fingerprint,
)
from dmlkit.exceptions import DataError

log = logging.getLogger(__name__)

#: Files this process has read back and checked against their checksums: ``(path, size, mtime)``.
_CHECKED: set[tuple[str, int, int]] = set()

#: Area range of the training crops (the photo pipeline's random resized crop; aspect 3/4-4/3).
CROP_SCALE = (0.16, 1.0)


@dataclass(frozen=True)
class StageKey:
    """What a stored set of frozen-stage outputs depends on; equal keys mean equal outputs."""

    backbone: str
    weights: str
    frozen_through: str  # the last frozen step of the backbone's forward chain (``blocks.5``)
    image_size: int
    views: int
    seed: int
    crops: str
    images: str

    def filename(self) -> str:
        return (f"{self.backbone}-to-{self.frozen_through}-{self.image_size}px-v{self.views}-seed{self.seed}-"
                f"{key_digest(self)}.pt")


class _DecodedViews:
    """Photos decoded once as their evaluation view (uint8 ``[N, 3, S, S]``); batches normalised for the model."""

    def __init__(self, paths: Sequence[str], image_size: int, model: nn.Module):
        import numpy as np

        from dmlkit.data.base import decode_image
        from dmlkit.data.transforms import photo_view

        view = photo_view(image_size, str(model.pretrained_cfg.get("interpolation", "bilinear")))
        self.images = torch.stack([torch.from_numpy(np.asarray(view(decode_image(p, "RGB", f"image {i}")), dtype=np.uint8)
                                                    .copy()).permute(2, 0, 1) for i, p in enumerate(paths)])
        self.labels = torch.zeros(len(paths), dtype=torch.int64)  # the cache's builder reads them; unused here
        self.model = model

    def __len__(self) -> int:
        return len(self.images)

    def get_batch(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model.preprocess(torch.div(self.images[rows], 255.0)), self.labels[rows]


class StageOutputs(torch.utils.data.Dataset):
    """Stored frozen-stage outputs as a map-style dataset: item ``i`` is ``(storage[image_i, view_i] as
    [C, h, w] float32, label id)``; ``labels`` are int64 ids in sorted order of ``names`` (``class_names``)."""

    def __init__(self, storage: torch.Tensor, images: torch.Tensor, views: torch.Tensor, names: Sequence[str]):
        if not (len(images) == len(views) == len(names)):
            raise DataError(f"images has {len(images)} rows, views {len(views)} and names {len(names)}; expected equal.")
        self.storage, self.images, self.views, self.names = storage, images, views, list(names)
        self.class_names, self.labels = label_ids(self.names)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.storage[self.images[index], self.views[index]].permute(2, 0, 1).float(), int(self.labels[index])

    def get_batch(self, indices: Sequence[int] | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B, C, h, w]`` float32 (channels-last, as the trunk's next stage takes it) and labels ``[B]``."""
        rows = torch.as_tensor(indices, dtype=torch.int64)
        return self.storage[self.images[rows], self.views[rows]].permute(0, 3, 1, 2).float(), self.labels[rows]

    def sample_images(self, count: int) -> torch.Tensor:
        """Up to ``count`` evenly spaced items ``[n, C, h, w]`` (the recipe's first look at the data)."""
        step = max(1, len(self) // count)
        return self.get_batch(torch.arange(0, len(self), step)[:count])[0]


@dataclass
class StoredStages:
    """The frozen stages' outputs of every image: ``storage`` ``[N, views + 1, h, w, C]`` bf16 (the last view the
    evaluation view), with each image's ``paths`` and ``names`` (its label) in the order they were given."""

    storage: torch.Tensor
    paths: list[str]
    names: list[str]
    path: Path | None = None

    @property
    def views(self) -> int:
        """Training views per image (the evaluation view not counted)."""
        return int(self.storage.shape[1]) - 1

    def _rows(self, images: Sequence[int]) -> torch.Tensor:
        rows = torch.as_tensor(list(images), dtype=torch.int64)
        if len(rows) and (int(rows.min()) < 0 or int(rows.max()) >= len(self.paths)):
            raise DataError(f"image rows must lie in [0, {len(self.paths)}). Got {int(rows.min())}..{int(rows.max())}.")
        return rows

    def training(self, images: Sequence[int], names: Sequence[str] | None = None) -> StageOutputs:
        """Every training view of ``images`` as its own item (``views`` items an image, image-major), labelled
        ``names`` (one per image; default: the stored names)."""
        rows = self._rows(images)
        labels = [self.names[i] for i in rows.tolist()] if names is None else list(names)
        return StageOutputs(self.storage, rows.repeat_interleave(self.views), torch.arange(self.views).repeat(len(rows)),
                            [n for n in labels for _ in range(self.views)])

    def evaluation(self, images: Sequence[int], names: Sequence[str] | None = None) -> StageOutputs:
        """The evaluation view of ``images``, labelled ``names`` (default: the stored names)."""
        rows = self._rows(images)
        labels = [self.names[i] for i in rows.tolist()] if names is None else list(names)
        return StageOutputs(self.storage, rows, torch.full((len(rows),), self.views), labels)


def build_stage_outputs(model: nn.Module, paths: Sequence[str], *, image_size: int, views: int, seed: int,
                        echo: Callable[[str], None] | None = None) -> torch.Tensor:
    """``model.prefix`` on ``views`` training crops and on the evaluation view of every image: bf16
    ``[N, views + 1, h, w, C]`` (see the module docstring)."""
    from dmlkit.data.transforms import RandomResizedCropFlip

    was_training = model.training
    model.eval()
    try:
        images = _DecodedViews(paths, image_size, model)
        crops = FrozenFeatureCache.build(model, images, RandomResizedCropFlip(image_size, scale=CROP_SCALE),
                                         views=views, seed=seed, echo=echo)
        centre = FrozenFeatureCache.build(model, images, None, views=1, seed=seed, echo=echo)
    finally:
        model.train(was_training)
    return torch.cat([crops.storage, centre.storage], dim=1)


def _identity(path: Path) -> tuple[str, int, int]:
    try:
        stat = path.stat()
    except OSError:
        return (str(path), -1, -1)
    return (str(path), stat.st_size, stat.st_mtime_ns)


class StageStore:
    """A folder of stored frozen-stage outputs, one file per :class:`StageKey`."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def key(self, model: nn.Module, backbone: str, paths: Sequence[str], names: Sequence[str], *, image_size: int,
            views: int, seed: int) -> StageKey:
        """The key of ``model``'s frozen stages over ``paths`` (labelled ``names``) at ``image_size``."""
        problem = model.prefix_problem()
        if problem is not None:
            raise DataError(f"StageStore: the model's frozen stages cannot be stored: {problem}.")
        from dmlkit.data.transforms import RandomResizedCropFlip

        prefix = nn.ModuleList(model.trunk.split_modules()[0])
        return StageKey(backbone, weights_fingerprint(prefix), model.trunk.split_names()[0][-1], int(image_size),
                        int(views), int(seed), repr(RandomResizedCropFlip(image_size, scale=CROP_SCALE)),
                        images_fingerprint(list(paths), list(names)))

    def path(self, key: StageKey) -> Path:
        return self.root / key.filename()

    def outputs(self, model: nn.Module, backbone: str, paths: Sequence[str], names: Sequence[str], *, image_size: int,
                views: int, seed: int, echo: Callable[[str], None] | None = None) -> StoredStages:
        """The stored outputs of ``model.prefix`` for ``paths``: mapped from the store, or computed and stored once.

        A lock file beside the store makes processes asking for the same key at once wait for the first one's file.
        """
        key = self.key(model, backbone, paths, names, image_size=image_size, views=views, seed=seed)
        path, echo = self.path(key), messages(echo, log)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_name(path.name + ".lock"), "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                stored = load_keyed(path, key, mmap=True, check=_identity(path) not in _CHECKED)
                if stored is None:
                    start = time.process_time()
                    storage = build_stage_outputs(model, paths, image_size=image_size, views=views, seed=seed, echo=echo)
                    save_keyed(path, key, {"storage": storage})
                    echo(f"frozen stages: {len(paths)} images x {views + 1} views in {time.process_time() - start:.0f} "
                         f"CPU-s, {format_size(storage.numel() * storage.element_size())} stored in {path}")
                    stored = load_keyed(path, key, mmap=True)
                    if stored is None:
                        raise DataError(f"StageStore: {path} was written but cannot be read back.")
                _CHECKED.add(_identity(path))  # checked once a process: the file is never written in place
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        return StoredStages(stored["storage"], list(paths), list(names), path)


__all__ = ["CROP_SCALE", "StageKey", "StageOutputs", "StageStore", "StoredStages", "build_stage_outputs"]
