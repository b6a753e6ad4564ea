"""Plan, then build: a config (and any objects) to a :class:`~dmlkit.engine.resolve.ResolvedRun` in one call."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from dmlkit.config.schema import RunConfig
from dmlkit.engine import trainer as engine_trainer
from dmlkit.engine.given import NOTHING_GIVEN, GivenObjects
from dmlkit.engine.resolve import ResolvedRun, resolve_run
from dmlkit.recipe.measurements import Measurements
from dmlkit.recipe.planner import plan
from dmlkit.recipe.step_capture_plan import resolved_step_capture
from dmlkit.recipe.time_budget import plan_callbacks


def prepare_run(
    cfg: RunConfig,
    *,
    model: nn.Module | None = None,
    loss: nn.Module | None = None,
    miner: nn.Module | None = None,
    data=None,
    optimizer: torch.optim.Optimizer | None = None,
    echo: Callable[[str], None] | None = None,
    started: float | None = None,
    measurements: Measurements | None = None,
    replan: bool = False,
) -> ResolvedRun:
    """:func:`~dmlkit.recipe.planner.plan` then :func:`~dmlkit.engine.resolve.resolve_run` with the same objects
    (``model``, ``loss``, ``miner``, ``data``, ``optimizer``: :class:`~dmlkit.engine.given.GivenObjects`); the run
    holds the callbacks that watch it while it trains (:func:`~dmlkit.recipe.time_budget.plan_callbacks`)."""
    given = GivenObjects(model=model, loss=loss, miner=miner, data=data, optimizer=optimizer)
    return prepare(cfg, given, echo=echo, started=started, measurements=measurements, replan=replan)


def prepare(cfg: RunConfig, given: GivenObjects = NOTHING_GIVEN, *, echo: Callable[[str], None] | None = None,
            started: float | None = None, measurements: Measurements | None = None, replan: bool = False) -> ResolvedRun:
    """:func:`prepare_run` with the given objects as one record."""
    planned = plan(cfg, given, echo=echo, started=started, measurements=measurements, replan=replan)
    resolved = resolve_run(planned, given, echo=echo)
    # what watches the run and decides from its timings is attached here, as the config attaches early stopping
    return dataclasses.replace(resolved, step_capture=resolved_step_capture(resolved),
                               plan_callbacks=plan_callbacks(resolved))


class Trainer(engine_trainer.Trainer):
    """The engine's :class:`~dmlkit.engine.trainer.Trainer`, which also takes a config: ``Trainer(cfg, run_dir,
    **objects)`` is ``Trainer(prepare_run(cfg, **objects), run_dir)``."""

    def __init__(self, run: ResolvedRun | RunConfig, run_dir: str | Path, *, echo: Callable[[str], None] | None = None,
                 model: nn.Module | None = None, loss: nn.Module | None = None, miner: nn.Module | None = None,
                 data=None, optimizer: torch.optim.Optimizer | None = None, **options):
        given = GivenObjects(model=model, loss=loss, miner=miner, data=data, optimizer=optimizer)
        if isinstance(run, ResolvedRun) and given.names():
            raise TypeError(f"Trainer got a resolved run and {', '.join(given.names())}: objects are given to "
                            "prepare_run(cfg, ...), whose run already holds every part.")
        if not isinstance(run, ResolvedRun):
            run = prepare(run, given, echo=echo, started=time.perf_counter())
        super().__init__(run, run_dir, echo=echo, **options)


__all__ = ["Trainer", "prepare_run"]
