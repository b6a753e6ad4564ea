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

:func:`plan_feature_cache` decides whether a run uses it (``auto``: when it is possible and fits
in :func:`memory_cap`) and how many views (:data:`MAX_VIEWS` at most, about one per planned epoch).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import nn

from dmlkit._messages import messages
from dmlkit.exceptions import ConfigError
from dmlkit.models.inference_copy import chunk_for
from dmlkit.seeds import derive_generator

log = logging.getLogger(__name__)

#: ``train.feature_cache``: ``auto`` (the recipe decides), ``on`` (a ConfigError where impossible), ``off``.
CACHE_MODES = ("auto", "on", "off")

#: Views per image the recipe caches: about one per planned epoch, between these bounds. A view costs a
#: forward pass of the frozen stages, as a training step without the cache pays for it once per epoch,
#: so more views than epochs would cost more than they save; 8 views keep most of the crops' variety
#: (each image is seen through 8 crops) for long runs at 8x the memory of one.
MIN_VIEWS, MAX_VIEWS = 2, 8

#: Without a readable size of the physical memory, the cache's cap.
FALLBACK_CAP = 6 * 2**30

#: Training images per forward pass of the frozen stages while the cache is built.
BUILD_BATCH = 64


def memory_cap() -> int:
    """Bytes the cache may take: a quarter of the physical memory (:data:`FALLBACK_CAP` when unknown)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4
    except (ValueError, OSError, AttributeError):
        return FALLBACK_CAP


def _size(nbytes: int) -> str:
    """``1.23 GiB`` from 1 GiB up, else ``45.6 MiB``."""
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


@dataclass(frozen=True)
class CachePlan:
    """Whether the run trains from the cache, with how many views per image, and why."""

    enabled: bool
    views: int
    reason: str


def plan_feature_cache(cfg, model: nn.Module, dataset, augment: Callable | None, *, distributed: bool = False,
                       cap: int | None = None, echo: Callable[[str], None] | None = None,
                       deferred: bool = False) -> CachePlan:
    """Resolve ``train.feature_cache`` (and ``train.cache_views``) for this run, say it as a recipe line (DEBUG).

    ``auto`` is on when ``model`` is one :class:`~dmlkit.models.Embedder` whose frozen stages split
    off (:meth:`~dmlkit.models.Embedder.prefix_problem`), the training split is held in memory, its
    batch augmentation is ``crop`` or ``none``, the run is one process, and the cache fits ``cap``
    (:func:`memory_cap`); otherwise off, with the reason. ``on`` where any of this fails is a
    ConfigError naming why. ``cfg`` is read, never written: :func:`cache_choices` gives the resolved values,
    which the recipe writes into the config it finishes (so ``config.yaml`` and a resume use them).
    """
    t = cfg.train
    if t.feature_cache == "off":
        return CachePlan(False, 0, "train.feature_cache=off")
    problem = _impossible(cfg, model, dataset, distributed)
    if problem is None:
        per_image = _bytes_per_view(model, dataset, augment) * len(dataset)  # one view of every image
        cap = memory_cap() if cap is None else cap
        views = t.cache_views
        if views is None:  # the recipe's number, fewer where the memory asks for it
            views = max(min(_views_for_epochs(cfg, len(dataset)), cap // per_image), MIN_VIEWS)
        size = per_image * views
        if size > cap:
            problem = (f"{views} views of {len(dataset)} training images need {_size(size)}, more than the cap of "
                       f"{_size(cap)} (train.feature_cache's memory cap)"
                       + ("; set fewer train.cache_views" if t.cache_views is not None else ""))
    if problem is not None:
        if t.feature_cache == "on":
            raise ConfigError(f"train.feature_cache=on, but {problem}. Set train.feature_cache=auto (or off).")
        return _resolved(cfg, CachePlan(False, 0, problem), echo)
    if deferred:  # auto under a time budget: the first plan says whether the run trains long enough to gain
        reason = (f"possible: up to {views} views of {len(dataset)} training images ({_size(size)} bf16); whether "
                  "it pays, and how many views, is decided from the epochs the time budget's first plan buys")
    else:
        reason = (f"the stem and {model.trunk.frozen_stages} frozen stages run once, on {views} augmented views of "
                  f"{len(dataset)} training images ({_size(size)} bf16); training steps start after them")
    return _resolved(cfg, CachePlan(True, views, reason), echo)


#: Epochs of training each cached view must serve for the cache to be built under a time budget: a view
#: costs one pass of the frozen stages over the images, which the steps without a cache pay once an epoch,
#: so a cache of V views saves (epochs - V) of those passes; at 3 epochs a view it saves two thirds.
EPOCHS_PER_VIEW = 3


def views_for_epochs(epochs: float, most: int) -> int:
    """Views worth caching for a run of ``epochs`` epochs: one per :data:`EPOCHS_PER_VIEW` epochs, at most
    ``most``; 0 (no cache) when that is fewer than :data:`MIN_VIEWS` (the cache would save little crop variety's worth)."""
    views = min(most, int(epochs // EPOCHS_PER_VIEW))
    return views if views >= MIN_VIEWS else 0


def _resolved(cfg, plan: CachePlan, echo: Callable[[str], None] | None) -> CachePlan:
    messages(echo, log).detail(f"recipe:   train.feature_cache = {'on' if plan.enabled else 'off'}  ({plan.reason})")
    return plan


def cache_choices(cfg, plan: CachePlan) -> dict[str, tuple[Any, str]]:
    """The config values ``plan`` resolves (``{field: (value, reason)}``; none for ``train.feature_cache=off``):
    ``train.feature_cache`` on or off and, when on, ``train.cache_views``."""
    if cfg.train.feature_cache == "off":
        return {}
    chosen: dict[str, tuple[Any, str]] = {"train.feature_cache": ("on" if plan.enabled else "off", plan.reason)}
    if plan.enabled:
        chosen["train.cache_views"] = (plan.views, plan.reason)
    return chosen


def _impossible(cfg, model: nn.Module, dataset, distributed: bool) -> str | None:
    """Why this run cannot train from cached features (None: it can)."""
    from dmlkit.models import Embedder

    members = getattr(model, "members", None)  # an EmbedderEnsemble: what its members have in common first
    first = members[0] if members else model
    if not isinstance(first, Embedder):
        return f"the model ({type(first).__name__}) is not a dmlkit Embedder with a frozen prefix"
    problem = first.prefix_problem()
    if problem is not None:
        return problem
    if members is not None or (cfg.model.ensemble or 1) > 1:
        return f"model.ensemble={cfg.model.ensemble or len(members)}: each member has its own frozen stages"
    if getattr(dataset, "images", None) is None or not hasattr(dataset, "get_batch"):
        return "the training images are not held in memory (image files are decoded per item)"
    if cfg.data.augment not in ("crop", "none"):
        return f"data.augment={cfg.data.augment}: only random crops + flips (crop) or none are cached"
    if distributed:
        return "a torchrun run: DistributedDataParallel synchronises gradients of the whole model's forward"
    return None


def _views_for_epochs(cfg, num_images: int) -> int:
    """About one view per planned epoch (``train.max_steps`` x batch / images), in [MIN_VIEWS, MAX_VIEWS]."""
    steps, batch = cfg.train.max_steps, cfg.sampler.batch_size
    if steps is None or batch is None:
        return MAX_VIEWS
    return int(max(MIN_VIEWS, min(MAX_VIEWS, math.ceil(steps * batch / max(num_images, 1)))))


def _bytes_per_view(model: nn.Module, dataset, augment: Callable | None) -> int:
    """bf16 bytes of the frozen stages' output for one training view (one image through them)."""
    image = dataset.get_batch([0])[0]
    if augment is not None:
        image = augment(image, torch.Generator().manual_seed(0))
    device = next(model.parameters()).device
    return model.prefix(image.to(device)).numel() * 2


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
        echo(f"feature cache: built in {seconds:.1f} s, {_size(cache.nbytes)} ({str(dtype).removeprefix('torch.')} "
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
