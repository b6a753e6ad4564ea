"""What the recipe hands the engine: a finished config and the record of how it was chosen.

:func:`dmlkit.recipe.planner` makes a :class:`PlannedRun`; :func:`~dmlkit.engine.resolve.resolve_run` builds the
run's objects from it and never writes to its config. The engine reads the record only to report it
(``choices``, the training split's ``profile``), to fill the batch augmentation's background
(``profile.background``), to size the feature cache (``cache_plan``), to hand on what the recipe's time budget reads
while the run trains (``started``, ``measurements``, ``embed_seconds``: :class:`dmlkit.recipe.time_budget.TimeBudget`)
and to take over what the plan built rather than build it again: the device and process group (``device``,
``dist``), the model (``model``), the random state the run starts from (``rng``) and the splits (``splits``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from dmlkit.config.schema import RunConfig
from dmlkit.engine.distributed import DistInfo
from dmlkit.engine.frozen_stage_cache import CachePlan

if TYPE_CHECKING:  # the recipe's record, held and handed on: the engine never imports the recipe
    from dmlkit.recipe.measurements import Measurements


@dataclass(frozen=True)
class PlannedRun:
    """A finished config (no ``auto`` or None left in the fields the recipe decides) and the recipe's record.

    ``choices``: ``{field: (value, reason)}`` in the order the recipe prints them; ``profile``: the training split
    as the recipe read it (``describe()``, ``background``); ``request``: the config as asked, before the recipe
    (what ``dmlkit train --plan`` starts from); ``started``: the wall clock (``time.perf_counter``) when planning
    began, which ``train.time_budget`` counts from; ``measurements``: the machine's numbers the plan read
    (kept and replayed); ``embed_seconds``: an embedded image as the glyph plan measured it, if it did;
    ``cache_plan`` / ``cache_deferred``: the feature cache's resolution, and whether it waits for the time budget's
    first plan; ``splits`` / ``splits_read_as``: the splits the plan read from the config's data (none for a user's
    data) and what they were read with: the run builds on them when it would read them the same way, so the images
    are decoded once; ``model``: the model the run trains, built from the finished config and the seed (None when
    the user gave one); ``rng``: the random state (:func:`~dmlkit.engine.rng_state.rng_state`) the run starts from:
    the seed's, after the model was built; ``device`` / ``dist``: the run's device and process group, joined.
    """

    cfg: RunConfig
    choices: dict[str, tuple[Any, str]]
    profile: Any
    started: float
    cache_plan: CachePlan
    cache_deferred: bool = False
    request: dict | None = None
    measurements: Measurements | None = None
    embed_seconds: float | None = None
    field_order: tuple[str, ...] = ()  # the order the recipe prints its fields in (others after them)
    splits: Any = None  # the splits the plan read from the config's data (not a user's), validation held out
    splits_read_as: dict | None = None  # what they were read with (engine.splits.split_reading)
    planned_steps: int | None = None  # the steps the recipe's plan expects the time budget to buy (train.max_steps
    # is then their ceiling; the trainer fits the steps to the budget from the speeds it times)
    model: nn.Module | None = None  # the run's model, built once (the probe the plan measured, where it is that model)
    rng: dict | None = None  # the random state after the seed and the model's build: the run draws on from it
    device: torch.device | None = None  # the run's device (under torchrun this rank's GPU)
    dist: DistInfo | None = None  # the process group, joined


__all__ = ["PlannedRun"]
