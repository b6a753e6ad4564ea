"""Embed new images exactly as a run embedded its test split (``RunEmbedder.from_run``).

A run's evaluation preprocessing is data about its data: whether the splits were decoded into
memory (and at which size, resized how), or read per file with the data set's evaluation
transform at ``data.image_size``. :func:`dmlkit.data.splits.build_splits` records it in the run's
``manifest.json`` (``eval_input``); :func:`dmlkit.data.splits.query_split` reads it back and
prepares new images the same way, and :func:`dmlkit.evaluation.embed.embed_dataset` (the one
embedding loop) runs the model under the run's autocast. Shift averaging and ensembles live in the
model. So a gallery image embedded here equals its row of ``embeddings/test.npz``.

Code written against pytorch-metric-learning's ``utils.inference`` imports its classes from here under
the same names (``InferenceModel``, ``MatchFinder``, ``FaissKNN``, ``CustomKNN``, ``FaissKMeans``; they live in
:mod:`dmlkit.index`).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

from dmlkit.engine.trained_model import read_eval_input
from dmlkit.exceptions import ConfigError, DataError
from dmlkit.index.inference_model import InferenceModel, MatchFinder
from dmlkit.index.knn_funcs import CustomKNN, FaissKMeans, FaissKNN

ImageLike = Any  # a path, a PIL image, a numpy array [H, W] / [H, W, C], or a tensor [C, H, W]


class RunEmbedder:
    """A trained run's model with its evaluation preprocessing: images in, embeddings ``[N, D]`` out.

    Build it with :meth:`from_run` (``dmlkit.load`` does, and returns its ``model``, whose ``embed`` is
    this one's). ``embed(images)`` takes image files, PIL images, numpy arrays (``[H, W]``, ``[H, W, C]``;
    ``[N, H, W, C]`` for many) or tensors (``[C, H, W]``; ``[N, C, H, W]`` for many) of pixels (uint8
    0-255 or float in [0, 1]; read as 8-bit pixels, as image files are), one or a list of them;
    ``embed_dataset(split)`` embeds one of the run's splits.
    ``fingerprint`` identifies the model (config fingerprint and weights digest), which an
    :class:`dmlkit.index.Index` checks before it answers queries.
    """

    def __init__(self, model: nn.Module, cfg, eval_input: dict[str, Any] | None, *, fingerprint: dict[str, str],
                 progress: bool = False, batch_size: int | None = None):
        from dmlkit.evaluation.embed import autocast_dtype

        self.model = model.eval()
        self.run_dir: Path | None = None  # set by from_run
        self.cfg = cfg
        self.eval_input = None if eval_input is None else dict(eval_input)
        self.fingerprint = dict(fingerprint)
        self.progress = progress
        self.batch_size = int(batch_size or cfg.eval.batch_size)
        self.autocast_dtype = autocast_dtype(cfg.train.mixed_precision)
        self._copy: tuple[nn.Module, nn.Module] | None = None  # (model, its inference copy), made once

    @classmethod
    def from_run(cls, run_dir: str | os.PathLike, checkpoint: str = "best", *, device: str = "auto",
                 progress: bool = False, batch_size: int | None = None, overrides: Sequence[str] = (),
                 token: str | None = None) -> "RunEmbedder":
        """The run's model (``checkpoint`` = ``"best"`` or ``"last"``) and evaluation preprocessing.

        ``run_dir`` may also be a shared model: ``"hf://user/name"`` (``token``: the Hub's, if not the
        logged-in one) or a folder of ``dmlkit push --local``. The model keeps this embedder as
        ``model.run_embedder``, so ``model.embed(images)`` is :meth:`embed`."""
        from dmlkit.engine.device import resolve_device
        from dmlkit.engine.trained_model import load_run
        from dmlkit.sharing import HF_PREFIX, download, is_shared_folder, load_shared, shared_identity

        if isinstance(run_dir, str) and run_dir.startswith(HF_PREFIX):
            run_dir = download(run_dir, token=token)
        run_dir = Path(run_dir)
        if is_shared_folder(run_dir):
            cfg, model = load_shared(run_dir, overrides)
            eval_input, fingerprint = shared_identity(run_dir)
        else:
            cfg, model = load_run(run_dir, checkpoint, overrides)
            eval_input, fingerprint = read_eval_input(run_dir), run_fingerprint(run_dir, checkpoint)
        model.to(resolve_device(device))
        embedder = cls(model, cfg, eval_input, fingerprint=fingerprint, progress=progress, batch_size=batch_size)
        embedder.run_dir = run_dir.resolve()
        model.run_embedder = embedder
        return embedder

    def __getstate__(self) -> dict[str, Any]:
        """Pickled or deep-copied (with its model) without the inference copy, which is made again when needed."""
        return {**self.__dict__, "_copy": None}

    @property
    def input_size(self) -> tuple[int, int, int]:
        """``(C, H, W)`` of the model's input as the run evaluated it (not the model's nominal size;
        that only for runs that did not record it)."""
        if self.eval_input is None:
            return tuple(int(v) for v in self.model.pretrained_cfg["input_size"])
        return tuple(int(v) for v in self.eval_input["input_size"])

    @property
    def embedding_size(self) -> int:
        """``D``, the size of the embeddings (one probe forward pass)."""
        with torch.no_grad():
            return int(self.model(torch.zeros(1, *self.input_size, device=self._device())).shape[1])

    def _device(self) -> torch.device:
        return next(self.model.parameters(), torch.empty(0)).device

    def dataset(self, images: Sequence[ImageLike] | torch.Tensor):
        """``images`` as a split prepared like the run's test split (labels -1)."""
        from dmlkit.data.splits import query_split

        if self.eval_input is None:
            raise ConfigError(
                f"{self.run_dir}/manifest.json does not record the run's evaluation preprocessing (eval_input): the "
                "run was trained by an older dmlkit; `dmlkit embed` and `evaluate` still embed its splits, but new "
                "images need a run trained by this version."
            )
        items = as_image_list(images)
        if not items:
            raise DataError("no images to embed (got an empty list).")
        return query_split(items, self.cfg.data.name, self.eval_input, getattr(self.model, "pretrained_cfg", None))

    def embed(self, images: Sequence[ImageLike] | torch.Tensor) -> torch.Tensor:
        """Embeddings ``[N, D]`` (float32, CPU) of image files, PIL images or pixel tensors, in order."""
        return self.embed_dataset(self.dataset(images))[0]

    def embed_dataset(self, dataset) -> tuple[torch.Tensor, torch.Tensor]:
        """Embeddings ``[N, D]`` and labels ``[N]`` of a split, as the trainer embeds its test split.

        The model's inference copy (:func:`dmlkit.models.inference_copy.inference_copy`) is made at the
        first call and kept: later calls (one query at a time, for example) only run it.
        """
        from dmlkit.evaluation.embed import embed_dataset, first_images
        from dmlkit.models.inference_copy import inference_copy

        if len(dataset) and (self._copy is None or self._copy[0] is not self.model):
            self.model.eval()
            probe = first_images(dataset).to(self._device())
            self._copy = (self.model, inference_copy(self.model, probe, self.autocast_dtype))
        runner = self.model if self._copy is None else self._copy[1]
        return embed_dataset(runner, dataset, self.batch_size, self.cfg.data.num_workers, self.autocast_dtype,
                             progress=self.progress)


def as_image_list(images: Sequence[ImageLike] | ImageLike) -> list:
    """One image or many as a list of paths and PIL images: paths and PIL images as given, pixel tensors
    ``[N, C, H, W]`` / ``[C, H, W]`` and numpy arrays ``[N, H, W, C]`` / ``[H, W, C]`` / ``[H, W]`` as PIL images."""
    import numpy as np
    from PIL import Image

    if isinstance(images, (str, os.PathLike, Image.Image)):
        return [images]
    if isinstance(images, torch.Tensor):
        batch = images[None] if images.dim() == 3 else images
        if batch.dim() != 4 or batch.shape[1] not in (1, 3):
            raise DataError(f"image tensors must be [N, C, H, W] or [C, H, W] with C = 1 or 3. Got {tuple(images.shape)}.")
        return [tensor_to_pil(x) for x in batch]
    if isinstance(images, np.ndarray):
        return [array_to_pil(x) for x in images] if images.ndim == 4 else [array_to_pil(images)]
    if not isinstance(images, Sequence):
        raise DataError(f"images must be a path, a PIL image, a numpy array, a tensor or a list of them. "
                        f"Got {type(images).__name__}.")
    items = []
    for i, item in enumerate(images):
        if isinstance(item, torch.Tensor):
            if item.dim() != 3 or item.shape[0] not in (1, 3):
                raise DataError(f"image {i}: a tensor must be [C, H, W] with C = 1 or 3. Got {tuple(item.shape)}.")
            item = tensor_to_pil(item)
        elif isinstance(item, np.ndarray):
            item = array_to_pil(item, f"image {i}")
        elif not isinstance(item, (str, os.PathLike, Image.Image)):
            raise DataError(f"image {i}: expected a path, a PIL image, a numpy array or a tensor. Got {type(item).__name__}.")
        items.append(item)
    return items


def tensor_to_pil(image: torch.Tensor):
    """A ``[C, H, W]`` uint8 (0-255) or float ([0, 1]) tensor as an 8-bit PIL image."""
    from PIL import Image

    if image.dtype != torch.uint8:
        image = (image.detach().float().clamp(0, 1) * 255).round().to(torch.uint8)
    arr = image.cpu().permute(1, 2, 0).numpy()
    return Image.fromarray(arr[..., 0], mode="L") if arr.shape[2] == 1 else Image.fromarray(arr, mode="RGB")


def array_to_pil(image, what: str = "a numpy image"):
    """An ``[H, W]`` or ``[H, W, C]`` (C = 1 or 3) numpy array, uint8 (0-255) or float ([0, 1]), as an 8-bit PIL image."""
    pixels = torch.tensor(image[..., None] if image.ndim == 2 else image)  # a copy: np.asarray(PIL image) is read-only
    if pixels.dim() != 3 or pixels.shape[2] not in (1, 3):
        raise DataError(f"{what} must be [H, W] or [H, W, C] with C = 1 or 3 (channels last, as PIL and OpenCV "
                        f"store them). Got {tuple(image.shape)}.")
    return tensor_to_pil(pixels.permute(2, 0, 1))


def run_fingerprint(run_dir: str | os.PathLike, checkpoint: str = "best") -> dict[str, str]:
    """What identifies a run's model: its config fingerprint and a digest of the checkpoint's bytes."""
    from dmlkit.config.schema import config_to_dict
    from dmlkit.engine.checkpoint_files import config_fingerprint
    from dmlkit.engine.run_layout import checkpoint_file
    from dmlkit.engine.trained_model import load_run_config

    run_dir = Path(run_dir)
    digest = hashlib.sha256((run_dir / checkpoint_file(checkpoint)).read_bytes()).hexdigest()[:16]
    return {"config": config_fingerprint(config_to_dict(load_run_config(run_dir))), "weights": digest}


__all__ = ["CustomKNN", "FaissKMeans", "FaissKNN", "ImageLike", "InferenceModel", "MatchFinder", "RunEmbedder",
           "array_to_pil", "as_image_list", "run_fingerprint", "tensor_to_pil"]
