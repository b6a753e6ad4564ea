"""Whether a run trains from cached frozen-stage features (``train.feature_cache``), and from how many views.

The cache itself is the engine's (:class:`dmlkit.engine.frozen_stage_cache.FrozenFeatureCache`: the frozen stages
run once on ``V`` augmented views of every training image). :func:`plan_feature_cache` decides whether a run uses it
(``auto``: when it is possible and fits in :func:`memory_cap`) and how many views (:data:`MAX_VIEWS` at most, about
one per planned epoch); under a time budget :func:`views_for_epochs` decides once the budget's first plan says how
many epochs the run trains (:class:`dmlkit.recipe.time_budget.TimeBudget`).
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any, Callable

import torch
from torch import nn

from dmlkit.core.messages import messages
from dmlkit.engine.frozen_stage_cache import CachePlan, format_size
from dmlkit.exceptions import ConfigError

log = logging.getLogger(__name__)

#: Views per image the recipe caches: about one per planned epoch, between these bounds. A view costs a
#: forward pass of the frozen stages, as a training step without the cache pays for it once per epoch,
#: so more views than epochs would cost more than they save; 8 views keep most of the crops' variety
#: (each image is seen through 8 crops) for long runs at 8x the memory of one.
MIN_VIEWS, MAX_VIEWS = 2, 8

#: Without a readable size of the physical memory, the cache's cap.
FALLBACK_CAP = 6 * 2**30

def memory_cap() -> int:
    """Bytes the cache may take: a quarter of the physical memory (:data:`FALLBACK_CAP` when unknown)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4
    except (ValueError, OSError, AttributeError):
        return FALLBACK_CAP


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
            problem = (f"{views} views of {len(dataset)} training images need {format_size(size)}, more than the cap of "
                       f"{format_size(cap)} (train.feature_cache's memory cap)"
                       + ("; set fewer train.cache_views" if t.cache_views is not None else ""))
    if problem is not None:
        if t.feature_cache == "on":
            raise ConfigError(f"train.feature_cache=on, but {problem}. Set train.feature_cache=auto (or off).")
        return _resolved(cfg, CachePlan(False, 0, problem), echo)
    if deferred:  # auto under a time budget: the first plan says whether the run trains long enough to gain
        reason = (f"possible: up to {views} views of {len(dataset)} training images ({format_size(size)} bf16); whether "
                  "it pays, and how many views, is decided from the epochs the time budget's first plan buys")
    else:
        reason = (f"the stem and {model.trunk.frozen_stages} frozen stages run once, on {views} augmented views of "
                  f"{len(dataset)} training images ({format_size(size)} bf16); training steps start after them")
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


__all__ = ["EPOCHS_PER_VIEW", "FALLBACK_CAP", "MAX_VIEWS", "MIN_VIEWS", "cache_choices", "memory_cap",
           "plan_feature_cache", "views_for_epochs"]
