"""Pay for the frozen stages once (``train.feature_cache``).

With ``model.frozen_stages=k`` the stem and first ``k`` stages of a pretrained backbone never
change during a run, yet every training step would run them forward. :class:`FrozenFeatureCache`
runs them once, before training, on ``V`` augmented views of every training image (the random
resized crop + flip the run trains with, view ``v`` drawn from the stream
``derive_generator(seed, "feature cache view", v)``) and keeps their output in bf16; each training
step then takes one stored view per image and runs only the rest of the model
(:meth:`dmlkit.models.Embedder.forward_from_prefix`). Gradients are those of the full forward pass
on the same crops: the frozen stages get none either way. What changes is that an image is seen
through ``V`` fixed crops rather than a new crop at every epoch.

Whether a run uses it, and how many views, is the recipe's decision
(:func:`dmlkit.recipe.feature_cache_plan.plan_feature_cache`), handed to the engine as a :class:`CachePlan`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import nn

from dmlkit.core.messages import messages
from dmlkit.core.seeds import derive_generator
from dmlkit.models.inference_copy import chunk_for

log = logging.getLogger(__name__)

#: ``train.feature_cache``: ``auto`` (the recipe decides), ``on`` (a ConfigError where impossible), ``off``.
CACHE_MODES = ("auto", "on", "off")

#: Training images per forward pass of the frozen stages while the cache is built.
BUILD_BATCH = 64


def format_size(nbytes: int) -> str:
    """``1.23 GiB`` from 1 GiB up, else ``45.6 MiB``."""
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


@dataclass(frozen=True)
class CachePlan:
    """Whether the run trains from the cache, with how many views per image, and why."""

    enabled: bool
    views: int
    reason: str
    steps: int | None = None  # the training steps the views were planned for (the learning plan's), when it planned


class _StoredLabels:
    """The batch stream's source while training from the cache: labels only (no image is decoded)."""

    def __init__(self, labels: torch.Tensor):
        self.labels = labels

    def __len__(self) -> int:
        return len(self.labels)

    def get_batch(self, indices: Sequence[int] | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.as_tensor(indices, dtype=torch.int64)
        return rows, self.labels[rows]


class FrozenFeatureCache:
    """The frozen stages' output for ``V`` views of ``N`` images: one tensor ``[N, V, h, w, C]``.

    Stored channels-last (``[N, V, C, h, w]`` permuted), so a gathered batch is the channels-last
    ``[B, C, h, w]`` tensor the trunk's next stage takes, without a copy to another layout.
    """

    def __init__(self, storage: torch.Tensor, labels: torch.Tensor, build_seconds: float = 0.0):
        if storage.dim() != 5 or len(storage) != len(labels):
            raise ValueError(f"storage must be [N, V, h, w, C] with N = {len(labels)} labels. Got {tuple(storage.shape)}.")
        self.storage = storage.contiguous()
        self.labels = labels
        self.build_seconds = build_seconds

    @property
    def views(self) -> int:
        return int(self.storage.shape[1])

    @property
    def nbytes(self) -> int:
        return self.storage.numel() * self.storage.element_size()

    @classmethod
    def build(cls, model: nn.Module, dataset, augment: Callable | None, *, views: int, seed: int,
              autocast_dtype: torch.dtype | None = None, dtype: torch.dtype = torch.bfloat16,
              echo: Callable[[str], None] | None = None, progress: bool = False,
              out_of_time: Callable[[], bool] | None = None) -> "FrozenFeatureCache":
        """Run ``model.prefix`` on ``views`` augmented views of every image of ``dataset`` (``get_batch``).

        View ``v`` of all images is drawn from ``derive_generator(seed, "feature cache view", v)``
        in batches of :data:`BUILD_BATCH` rows, so the cache depends only on the seed (a resumed run
        rebuilds the same one). ``autocast_dtype`` is the training autocast; ``dtype`` the stored precision.
        Views are built one after the other; ``out_of_time(seconds)`` (the time budget's; ``seconds``: what the next
        view is expected to take, the mean so far) is asked after each, and a True keeps the views built so far (at
        least one).
        """
        n = len(dataset)
        device = next(model.parameters()).device
        generators = [derive_generator(seed, "feature cache view", v) for v in range(views)]
        autocast = (torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype is not None
                    else contextlib.nullcontext())
        echo = messages(echo, log)
        echo(f"feature cache: the frozen stages on {views} views of {n} training images ...")
        start = time.perf_counter()
        storage = None
        chunks = range(0, n, BUILD_BATCH)
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=views * len(chunks), desc="feature cache", unit="batch", leave=False, dynamic_ncols=True)
        per_pass = None  # images per pass of the frozen stages: on a CPU, chunks whose activations stay small
        built = 0
        for v, generator in enumerate(generators):  # view by view: each view's draws are those of the seed alone
            for lo in chunks:
                rows = torch.arange(lo, min(n, lo + BUILD_BATCH))
                images = dataset.get_batch(rows)[0]
                crops = augment(images, generator) if augment is not None else images
                crops = crops.to(device)
                with autocast:
                    if per_pass is None:
                        per_pass = (chunk_for(model, model.prefix, crops[:1], autocast_dtype)
                                    if device.type == "cpu" else BUILD_BATCH)
                    features = torch.cat([model.prefix(part) for part in crops.split(per_pass)])
                features = features.permute(0, 2, 3, 1)  # [b, h, w, C]
                if storage is None:
                    storage = torch.empty((n, views, *features.shape[1:]), dtype=dtype)
                storage[rows, v] = features.to("cpu", dtype)
                if bar is not None:
                    bar.update()
            built = v + 1
            if bar is None and built < views:  # a line a view, so a long build is never silent
                echo(f"feature cache: {built} of {views} views ({time.perf_counter() - start:.0f} s)")
            if built < views and out_of_time is not None and out_of_time((time.perf_counter() - start) / built):
                echo(f"feature cache: stopped after {built} of {views} views: the time budget needs the rest for "
                     "training")
                storage = storage[:, :built]
                break
        if bar is not None:
            bar.close()
        seconds = time.perf_counter() - start
        cache = cls(storage, dataset.labels, seconds)
        echo(f"feature cache: built in {seconds:.1f} s, {format_size(cache.nbytes)} ({str(dtype).removeprefix('torch.')} "
             f"[{n}, {cache.views}, {storage.shape[4]}, {storage.shape[2]}, {storage.shape[3]}])")
        return cache

    def features(self, indices: Sequence[int] | torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Stored features of ``indices``, one view per image drawn from ``generator``: ``[B, C, h, w]`` channels-last."""
        rows = torch.as_tensor(indices, dtype=torch.int64)
        views = torch.randint(self.views, (len(rows),), generator=generator)
        return self.storage[rows, views].permute(0, 3, 1, 2)

    def batch_source(self) -> _StoredLabels:
        """What the training batch stream reads instead of the images: their labels (row indices as the batch)."""
        return _StoredLabels(self.labels)
