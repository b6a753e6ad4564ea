"""A frozen backbone's pooled features, computed once per (backbone, weights, view, images) and kept on disk.

Comparisons of losses on photographs through a frozen ImageNet-pretrained backbone (linear probes,
head-only sweeps) run the same backbone over the
same images in every arm. :class:`FeatureStore` runs it once: :func:`pooled_features` embeds each
image at one view (``image_size`` px, shorter side resized to ``image_size / CROP_FRACTION`` then
centre-cropped, as the photo pipeline's evaluation view; ``views=2`` also its mirror image, the two
pooled features averaged) and the result is written atomically under a name derived from
:class:`FeatureKey` (backbone name, a SHA-256 of its weights, view, views, pooling, and a fingerprint
of the images and their labels), so any later run with the same key reads it back instead.

Training on them goes through the ordinary engine: :class:`FeatureDataset` is a map-style
``(features [F, 1, 1], label)`` dataset (a pooled feature is a ``1 x 1`` feature map of ``F``
channels), so ``dmlkit.fit(FeatureHead(F, D), loss, train, val_data=..., test_data=...)`` trains
only the embedding head (:class:`dmlkit.models.FeatureHead`) with every loss, miner, sampler, method
(ASAP), checkpoint and metric of a full run (docs/python-api.md, "Training on stored features").
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from dmlkit.core.messages import messages
from dmlkit.core.validation import InstanceOf, Interval, Options, validate_params
from dmlkit.engine.checkpoint_files import atomic_write_with
from dmlkit.exceptions import DataError

log = logging.getLogger(__name__)

#: Side of the centre crop over the side the shorter image side is resized to (the photo pipeline's 224 / 256).
CROP_FRACTION = 0.875

#: Images per forward pass of the backbone while features are computed.
FEATURE_BATCH = 32

#: ``views``: 1 the centre crop, 2 the centre crop and its mirror image (pooled features averaged).
VIEWS = (1, 2)


@dataclass(frozen=True)
class FeatureKey:
    """What a stored feature set depends on; equal keys mean equal features."""

    backbone: str
    weights: str
    image_size: int
    views: int
    pooling: str
    images: str

    def digest(self) -> str:
        """16 hex digits of the SHA-256 of the key's fields (the file name's suffix)."""
        return key_digest(self)

    def filename(self) -> str:
        return f"{self.backbone}-{self.image_size}px-v{self.views}-{self.pooling}-{self.digest()}.pt"


def key_digest(key) -> str:
    """16 hex digits of the SHA-256 of a key dataclass's fields (a stored file's name ends with it)."""
    return hashlib.sha256(json.dumps(asdict(key), sort_keys=True).encode()).hexdigest()[:16]


def tensor_digest(tensor: torch.Tensor) -> str:
    """SHA-256 of a tensor's shape, dtype and bytes (what a stored file is checked against when read back)."""
    digest = hashlib.sha256(f"{tuple(tensor.shape)}:{tensor.dtype};".encode())
    digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def save_keyed(path: str | os.PathLike, key, tensors: dict[str, torch.Tensor], **extra) -> Path:
    """Write ``tensors`` (with ``extra`` plain values) under the key dataclass ``key`` atomically, each tensor's
    :func:`tensor_digest` beside it; the file streams to a temporary name that is renamed when complete."""
    payload = {"key": asdict(key), **extra, **{name: t.contiguous() for name, t in tensors.items()},
               "digests": {name: tensor_digest(t) for name, t in tensors.items()}}
    path = Path(path)
    atomic_write_with(path, lambda f: torch.save(payload, f))
    return path


def load_keyed(path: str | os.PathLike, key, *, mmap: bool = False, check: bool = True) -> dict | None:
    """What :func:`save_keyed` wrote at ``path`` for ``key``; None when there is no file, it holds another key, it
    cannot be read or (``check``) a tensor differs from its digest: a damaged file is never used. ``mmap``: tensors
    map the file read-only instead of being read into memory (processes reading one file share its pages)."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        stored = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as exc:  # a truncated or overwritten file: any reader error means "not stored"
        log.warning("stored features %s cannot be read (%s: %s); computing them again", path, type(exc).__name__, exc)
        return None
    if not isinstance(stored, dict) or stored.get("key") != asdict(key):
        return None
    digests = stored.get("digests")
    if not isinstance(digests, dict) or check and any(
            not isinstance(stored.get(name), torch.Tensor) or tensor_digest(stored[name]) != digest
            for name, digest in digests.items()):
        log.warning("stored features %s do not match their checksums; computing them again", path)
        return None
    return stored


def weights_fingerprint(model: nn.Module) -> str:
    """SHA-256 of ``model``'s state dict (names, shapes, dtypes and values), in the order it lists them."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype};".encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def images_fingerprint(images: Sequence[str] | torch.Tensor, names: Sequence[str]) -> str:
    """SHA-256 of the images (file path, size and modification time; or a tensor's bytes) with their label names."""
    if len(images) != len(names):
        raise DataError(f"images has {len(images)} entries but names has {len(names)}.")
    digest = hashlib.sha256()
    if isinstance(images, torch.Tensor):
        digest.update(f"tensor:{tuple(images.shape)}:{images.dtype};".encode())
        digest.update(images.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    else:
        for path in images:
            stat = os.stat(path)
            digest.update(f"{os.path.abspath(path)}\t{stat.st_size}\t{stat.st_mtime_ns}\n".encode())
    digest.update("\n".join(names).encode())
    return digest.hexdigest()


def centre_view(image: torch.Tensor, image_size: int) -> torch.Tensor:
    """The evaluation view of one image ``[C, H, W]`` (uint8 or float in [0, 1]): float ``[3, S, S]`` in [0, 1].

    Shorter side resized to ``round(S / CROP_FRACTION)`` (bilinear, antialiased), then the centre
    ``S x S`` crop; a grey image is repeated over three channels.
    """
    x = image.float() / 255.0 if image.dtype == torch.uint8 else image.float()
    if x.shape[0] == 1:
        x = x.expand(3, -1, -1)
    h, w = x.shape[-2:]
    side = round(image_size / CROP_FRACTION)
    size = (side, max(side, round(w * side / h))) if h <= w else (max(side, round(h * side / w)), side)
    x = F.interpolate(x[None], size=size, mode="bilinear", align_corners=False, antialias=True)[0]
    top, left = (size[0] - image_size) // 2, (size[1] - image_size) // 2
    return x[:, top:top + image_size, left:left + image_size].clamp_(0.0, 1.0)


def _read(image: str | torch.Tensor) -> torch.Tensor:
    if isinstance(image, torch.Tensor):
        return image
    import numpy as np

    from dmlkit.data.base import load_image

    rgb = load_image(image).convert("RGB")
    return torch.from_numpy(np.asarray(rgb, dtype=np.uint8).copy()).permute(2, 0, 1)


@torch.no_grad()
def pooled_features(model: nn.Module, images: Sequence[str] | torch.Tensor, *, image_size: int, views: int = 1,
                    batch_size: int = FEATURE_BATCH, echo: Callable[[str], None] | None = None) -> torch.Tensor:
    """``model.features`` of every image's :func:`centre_view` (and its mirror, ``views=2``): fp32 ``[N, F]``.

    ``model`` is an :class:`~dmlkit.models.Embedder` (its ``preprocess`` and ``features``: trunk and
    pooling, in eval mode); ``images`` are file paths or a uint8 tensor ``[N, C, H, W]``.
    """
    validate_params("pooled_features", {"image_size": image_size, "views": views, "batch_size": batch_size},
                    {"image_size": [Interval(int, 8, None)], "views": [Options(VIEWS)],
                     "batch_size": [Interval(int, 1, None)]})
    was_training = model.training
    model.eval()
    device = next(iter(model.parameters()), torch.empty(0)).device
    out, start = [], time.perf_counter()
    try:
        for lo in range(0, len(images), batch_size):
            batch = torch.stack([centre_view(_read(images[i]), image_size)
                                 for i in range(lo, min(len(images), lo + batch_size))])
            x = model.preprocess(batch.to(device))
            features = model.features(x)
            if views == 2:
                features = (features + model.features(x.flip(-1))) / 2
            out.append(features.float().cpu())
    finally:
        model.train(was_training)
    features = torch.cat(out)
    messages(echo, log)(f"features: {len(images)} images at {image_size} px ({views} view{'s' if views > 1 else ''}) in "
         f"{time.perf_counter() - start:.1f} s, [{features.shape[0]}, {features.shape[1]}]")
    return features


def label_ids(names: Sequence[str]) -> tuple[list[str], torch.Tensor]:
    """``(class_names, labels)``: the sorted distinct ``names`` and each name's int64 id among them."""
    classes = sorted(set(names))
    index = {name: i for i, name in enumerate(classes)}
    return classes, torch.tensor([index[n] for n in names], dtype=torch.int64)


class FeatureDataset(Dataset):
    """Stored features as a map-style dataset: item ``i`` is ``(features[i] as [F, 1, 1], label name's id)``.

    ``labels`` are int64 ids ``0..C-1`` in sorted order of ``names`` (``class_names`` keeps them),
    so the engine reads them without a pass over the items.
    """

    def __init__(self, features: torch.Tensor, names: Sequence[str]):
        if features.dim() != 2:
            raise DataError(f"features must be [N, F]. Got shape {tuple(features.shape)}.")
        if len(features) != len(names):
            raise DataError(f"features has {len(features)} rows but names has {len(names)}.")
        self.features = features
        self.names = list(names)
        self.class_names, self.labels = label_ids(self.names)

    def __len__(self) -> int:
        return len(self.features)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.features[index][:, None, None], int(self.labels[index])

    def sample_images(self, count: int) -> torch.Tensor:
        """Up to ``count`` evenly spaced items as ``[n, F, 1, 1]`` (what the recipe's profile reads; nothing is resized)."""
        step = max(1, len(self) // count)
        return self.features[::step][:count, :, None, None].float()

    def subset(self, rows: Sequence[int] | torch.Tensor) -> "FeatureDataset":
        """The rows ``rows`` (labels renumbered over the classes they keep)."""
        rows = torch.as_tensor(rows, dtype=torch.int64)
        return FeatureDataset(self.features[rows], [self.names[i] for i in rows.tolist()])


class FeatureStore:
    """A folder of feature sets, one file per :class:`FeatureKey` (``torch.save`` of ``features``, ``key``)."""

    def __init__(self, root: str | os.PathLike):
        validate_params("FeatureStore", {"root": root}, {"root": [InstanceOf((str, os.PathLike))]})
        self.root = Path(root)

    def path(self, key: FeatureKey) -> Path:
        return self.root / key.filename()

    def load(self, key: FeatureKey) -> torch.Tensor | None:
        """The stored features of ``key`` (None when there are none, or the file holds another key)."""
        stored = load_keyed(self.path(key), key)
        return None if stored is None else stored["features"]

    def save(self, key: FeatureKey, features: torch.Tensor) -> Path:
        """Write ``features`` under ``key`` atomically (a temporary file renamed)."""
        return save_keyed(self.path(key), key, {"features": features})

    def features(self, model: nn.Module, backbone: str, images: Sequence[str] | torch.Tensor, names: Sequence[str], *,
                 image_size: int, views: int = 1, echo: Callable[[str], None] | None = None) -> FeatureDataset:
        """``images``' pooled features under ``model`` (named ``backbone``): read from the store, or computed and stored."""
        pooling = getattr(getattr(model, "pool", None), "pooling", "none")
        key = FeatureKey(backbone, weights_fingerprint(model), int(image_size), int(views), str(pooling),
                         images_fingerprint(images, names))
        features, echo = self.load(key), messages(echo, log)
        if features is None:
            features = pooled_features(model, images, image_size=image_size, views=views, echo=echo)
            echo(f"features: stored in {self.save(key, features)}")
        else:
            echo(f"features: read {self.path(key)} ([{features.shape[0]}, {features.shape[1]}])")
        return FeatureDataset(features, names)


__all__ = ["CROP_FRACTION", "FeatureDataset", "FeatureKey", "FeatureStore", "centre_view", "images_fingerprint",
           "key_digest", "load_keyed", "pooled_features", "save_keyed", "tensor_digest", "weights_fingerprint"]
