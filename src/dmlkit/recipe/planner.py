"""The recipe's one entry point: a config as asked in, a finished config and the reasons for it out.

:func:`plan` reads the data, measures the machine (through :class:`~dmlkit.recipe.measurements.Measurements`,
kept and replayed) and decides every field the recipe owns (:data:`~dmlkit.recipe.rules.RECIPE_FIELDS`): the
backbone, its pooling and mirror, the view size, the frozen stages and cached views, the validation classes,
batches, steps and validations, ensemble members and their folds, learning rates, augmentation and precision.
It works on its own copy of the config and returns it finished (:class:`~dmlkit.engine.planned.PlannedRun`);
the config it was given is left as it was. What it builds to plan with goes with the plan, so the run builds
nothing twice: the device and process group, the random state the run starts from, the probe model (timed, and
embedding validation classes) as the model the run trains (``PlannedRun.model``: built from the seed alone, as
:func:`~dmlkit.engine.resolve.resolve_run` would build it from the finished config), and the splits it reads the
training split from (``PlannedRun.splits``, with what they were read with: the run builds on them where it would
read its data the same way, so image files are decoded once).

The steps run in the order they depend on each other:
survey of the data -> model rules -> backbone by budget -> probe model -> view size and pooling -> learning plan
-> probe splits -> data rules -> glyph plan (steps, members and validations from measured costs) -> member folds
-> feature cache.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import logging
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from dmlkit.config.schema import RunConfig, config_to_dict
from dmlkit.core.messages import SILENT, messages
from dmlkit.engine import distributed
from dmlkit.engine.augmentation import background_fill, build_batch_augmentation
from dmlkit.engine.device import device_and_processes, native_bf16
from dmlkit.engine.frozen_stage_cache import CachePlan
from dmlkit.engine.given import NOTHING_GIVEN, GivenObjects
from dmlkit.engine.model import build_model, model_arguments
from dmlkit.engine.objective import build_member_objective
from dmlkit.engine.planned import PlannedRun
from dmlkit.engine.rng_state import rng_state, seed_everything, set_rng_state
from dmlkit.engine.splits import build_splits, hold_out_validation_classes, split_reading
from dmlkit.engine.timing import work_since
from dmlkit.exceptions import ConfigError
from dmlkit.recipe import backbone_choice
from dmlkit.recipe import rules as recipe
from dmlkit.recipe.budget_planner import DEFAULT_TIME_BUDGET, MEASUREMENT_SHARE
from dmlkit.recipe.feature_cache_plan import cache_choices, plan_feature_cache
from dmlkit.recipe.glyph_plan import plan_glyph_steps as plan_glyphs_for_run
from dmlkit.recipe.learning_plan import plan_frozen_stages as plan_learning_for_run
from dmlkit.recipe.learning_plan import refit_to_recipe
from dmlkit.recipe.measurements import Measurements
from dmlkit.recipe.pooling_choice import is_embedder
from dmlkit.recipe.survey import survey_data
from dmlkit.recipe.view_size import measure_view_size

log = logging.getLogger(__name__)


def apply_model_recipe(cfg: RunConfig, survey, echo=None, *, accelerator: bool = False) -> dict:
    """Fill the model and image-size fields left to the recipe from a first look at the training split.

    Returns the choices (``{field: (value, reason)}``), said later with the rest of the recipe.
    """
    choices = recipe.resolve_model(cfg, recipe.profile_split(survey.train), accelerator=accelerator)
    recipe.apply(cfg, choices)
    return choices


@dataclass
class ResolvedRecipe:
    """The training split's profile and the values the recipe chose (``{field: (value, reason)}``)."""

    profile: recipe.DataProfile
    choices: dict


def apply_recipe(cfg: RunConfig, splits, echo=None, *, bf16_native: bool = False, model: nn.Module | None = None,
                 model_choices: dict | None = None, accelerator: bool = False) -> ResolvedRecipe:
    """Fill the config fields left to the recipe from the training split (docs/recipes.md), say them.

    First the validation classes (``protocol.val_class_fraction``), then the rest from the split
    the model actually trains on. Values the user set are kept. ``bf16_native`` (the training
    device computes bf16 natively) resolves ``train.mixed_precision=auto``. ``model`` (the built
    model) gives the embedding size of a pretrained backbone that keeps its features;
    ``model_choices`` (:func:`apply_model_recipe`) are said with the rest.
    """
    full = recipe.profile_split(splits.train)
    p = cfg.protocol
    chosen: dict = dict(model_choices or {})
    if cfg.model.embedding_size is None and model is not None:
        size = int(model.embedding_size)
        cfg.model.embedding_size = size
        chosen["model.embedding_size"] = (size, "the backbone's own feature size")
    if p.val_class_fraction is None:
        warm = recipe.uses_pretrained_weights(cfg)
        fraction = recipe.val_class_fraction_for(full, warm) if (p.fold is None and p.val_fraction == 0) else 0.0
        held = full.num_classes - int(round((1.0 - fraction) * full.num_classes))
        reason = f"{full.num_classes} training classes" + (
            f": hold out {held} for checkpoint choice" if fraction == 0.2
            else f": hold out {held}, so held-out classes tell whether training beats the pretrained embedding"
            if fraction else ": too few for class-disjoint validation")
        fraction = round(fraction, 4)
        chosen["protocol.val_class_fraction"] = (fraction, reason)
        p.val_class_fraction = fraction
    if p.val_class_fraction and splits.val is None:
        hold_out_validation_classes(splits, p.val_class_fraction, p.seed)
    profile = recipe.profile_split(splits.train)
    choices = recipe.resolve(cfg, profile, bf16_native=bf16_native, accelerator=accelerator)
    recipe.apply(cfg, choices)
    chosen.update(choices)
    if chosen:
        say = messages(echo, log)  # the split in one line; each choice and its reason in detail (dmlkit train -v)
        say(f"recipe: training split: {profile.describe()}")
        say.detail(recipe.format_planned(chosen))
    _warn_without_positive_pairs(cfg)
    return ResolvedRecipe(profile, chosen)


def _warn_without_positive_pairs(cfg: RunConfig) -> None:
    """Warn when batches of distinct classes (``sampler.m=1``) meet a loss that learns only from positive pairs."""
    from dmlkit.losses import LOSSES

    if cfg.sampler.name != "m_per_class" or cfg.sampler.m != 1:
        return
    if "num_classes" in inspect.signature(LOSSES.get(cfg.loss.name)).parameters:
        return  # a proxy loss pulls each sample to its class's proxy: no pair of samples needed
    warnings.warn(f"sampler.m=1 gives batches of distinct classes: loss {cfg.loss.name!r} sees no positive pair and "
                  "learns nothing from them. Use a proxy loss or more images per class (sampler.m >= 2).",
                  UserWarning, stacklevel=2)


def plan(
    cfg: RunConfig,
    given: GivenObjects = NOTHING_GIVEN,
    *,
    echo: Callable[[str], None] | None = None,
    started: float | None = None,
    measurements: Measurements | None = None,
    replan: bool = False,
) -> PlannedRun:
    """``cfg`` finished by the recipe (a new config; ``cfg`` is not written) with every choice and its reason.

    ``given`` (:class:`~dmlkit.engine.given.GivenObjects`): the objects the run will be given instead of the
    config's: the recipe reads them (a given model is measured, never changed; given splits are read through a
    copy) and leaves to them what they decide. The recipe's lines go to this module's
    logger (each choice with its reason at DEBUG), or to ``echo`` when given (``dmlkit.core.messages``).
    ``started`` (``time.perf_counter``; default: now) is when the run began. ``measurements``: the numbers the
    plans read, replayed (``dmlkit train --plan``); default: what this machine kept for this config, else measured
    now and kept (:mod:`dmlkit.recipe.measurements`; ``replan``: measured again). A run given objects measures
    and keeps nothing.
    """
    model, data = given.model, given.data
    request = config_to_dict(cfg)  # before the recipe fills it in
    cfg = copy.deepcopy(cfg)  # the recipe writes into its own copy
    started = time.perf_counter() if started is None else started
    # the device first (a ConfigError for a missing GPU comes before anything heavy); under torchrun it is this
    # rank's GPU, and the process group is joined before any measurement is shared
    device, dist = device_and_processes(cfg)
    echo = messages(echo, log) if dist.is_main else SILENT
    if measurements is None:
        measurements = _measurements_for(request, device, given=given, replan=replan)
    measurements.start()
    if measurements.progress is None:  # no silent minute: each measurement taken now is said before it runs
        measurements.progress = echo
    budget = cfg.train.time_budget
    if model is None and measurements.allowance is None:  # the budget is the user's wall time, planning included
        measurements.allowance = MEASUREMENT_SHARE * (budget if budget is not None else DEFAULT_TIME_BUDGET)
    if measurements.source:
        echo(f"plan: the machine's measurements {measurements.source}")
    elif measurements.allowance is not None and budget is not None:
        echo(f"plan: reading the data, then measuring this machine for at most {measurements.allowance:.0f} s "
             f"({MEASUREMENT_SHARE:.0%} of the {budget:.0f}-s budget) ...")
    seed_everything(cfg.seed)
    seeded = rng_state()  # the run's random state where it builds no model (a model given)
    survey = data if data is not None else survey_data(cfg)  # a first look: which model, which image size
    learning: list = []  # the learning plan, when the frozen stages were planned: the steps it predicts
    probe, model_choices, build = _plan_model(cfg, survey, model, device, echo, started=started,
                                              measurements=measurements, learning=learning, seeded=seeded)
    splits, resolved, read_as = _plan_on_splits(cfg, survey, data, probe, model_choices, device, echo)
    if learning:  # again from the same costs, with the batch and step ceiling the recipe chose: the steps run
        learning[0], refit = refit_to_recipe(cfg, probe, learning[0], splits, spent=measurements.spent(
            "seconds spent before the learning plan's refit", work_since(started)))
        if "train.cache_views" not in refit:
            resolved.choices.pop("train.cache_views", None)
        resolved.choices.update(refit)
        echo.detail(recipe.format_planned(refit))
        if learning[0].too_small:  # said before the budget is spent on a run that cannot train
            echo(f"plan: {learning[0].too_small}")
    augment = build_batch_augmentation(cfg, background_fill(splits, resolved.profile.background))
    embed_seconds = None
    if model is None:  # from scratch: steps, members and validations fitted to the time budget from measured costs
        embed_seconds = _fit_to_budget(cfg, splits, probe, resolved, device, echo, started=started, augment=augment,
                                       measurements=measurements,
                                       own_objective=given.loss is None and given.miner is None)
    # the member folds and the feature cache read the model the run will train
    probe, run_rng = (model, seeded) if build is None else _run_model(cfg, probe, build)
    unfolded = _member_folds(cfg, probe, splits, resolved.choices)
    if unfolded:
        resolved.choices.update(unfolded)
        echo.detail(recipe.format_planned(unfolded))
    cache_plan, cache_deferred = _plan_cache(cfg, probe, splits, augment, resolved.choices, dist, echo)
    if cache_plan.enabled and not cache_deferred and learning:  # the steps its views are for: a slower machine builds fewer
        cache_plan = dataclasses.replace(cache_plan, steps=_planned_steps(cfg, learning))
    bounded = measurements.bounded()
    if bounded:  # what the measuring allowance left to the recipe's rules
        echo(bounded)
    if budget is not None and model is None:  # the budget counts the planning: how much of it went there
        echo(f"plan: {time.perf_counter() - started:.0f} s of the {budget:.0f}-s budget spent reading the data and "
             "planning")
    shared = measurements.shared()
    if shared:  # the load the plan saw, in one line: its costs are CPU time, so the plan is an idle machine's
        echo(shared)
    _say_run(cfg, device, dist, echo)
    return PlannedRun(cfg=cfg, choices=resolved.choices, profile=resolved.profile, started=started,
                      cache_plan=cache_plan, cache_deferred=cache_deferred, request=request,
                      measurements=measurements, embed_seconds=embed_seconds, field_order=recipe.RECIPE_FIELDS,
                      splits=splits if read_as is not None else None, splits_read_as=read_as,
                      planned_steps=_planned_steps(cfg, learning), model=None if model is not None else probe,
                      rng=run_rng, device=device, dist=dist)


def _measurements_for(request: dict, device: torch.device, *, given: GivenObjects, replan: bool) -> Measurements:
    """Live numbers for a run given objects (nothing kept); else what this machine kept for ``request``."""
    return Measurements.live() if given.read_by_the_plan else \
        Measurements.for_request(request, device, replan=replan)


def _planned_steps(cfg: RunConfig, learning: list) -> int | None:
    """The steps the learning plan predicts the budget buys, when it planned and they are fewer than the ceiling."""
    if not learning or cfg.train.max_steps is None:
        return None
    return min(int(learning[0].steps), int(cfg.train.max_steps))


@dataclass
class _ProbeBuild:
    """How the probe was built: with ``arguments`` (``model_arguments``) as ``ensemble`` members, from the
    seed alone (``seeded``: nothing drew from the random generators before it), the random state after it (``rng``),
    its buffers then (``buffers``: the running statistics the plan's measurements move) and which of its parameters
    trained (``trainable``: the frozen stages the plan measures move)."""

    arguments: dict
    ensemble: int
    seeded: bool
    rng: dict
    buffers: dict[str, torch.Tensor]
    trainable: list[bool]


def _build_probe(cfg: RunConfig, seeded: dict) -> tuple[nn.Module, _ProbeBuild]:
    """The probe, built as the run builds its model (on the CPU, from the seed), and how it was built."""
    fresh = _same_state(rng_state(), seeded)
    probe = build_model(cfg)
    buffers = {name: buffer.detach().clone() for name, buffer in probe.named_buffers()}
    return probe, _ProbeBuild(model_arguments(cfg), int(cfg.model.ensemble or 1), fresh, rng_state(), buffers,
                              [param.requires_grad for param in probe.parameters()])


def _same_state(a: dict, b: dict) -> bool:
    """Whether two :func:`~dmlkit.engine.rng_state.rng_state` captures are the same state."""
    def same(x, y) -> bool:
        if isinstance(x, torch.Tensor):
            return isinstance(y, torch.Tensor) and torch.equal(x, y)
        if isinstance(x, (list, tuple)):
            return isinstance(y, (list, tuple)) and len(x) == len(y) and all(map(same, x, y))
        return x == y

    return a.keys() == b.keys() and all(same(a[key], b[key]) for key in a)


def _plan_model(cfg: RunConfig, survey, model: nn.Module | None, device: torch.device, echo, *, started: float,
                measurements: Measurements, learning: list,
                seeded: dict) -> tuple[nn.Module, dict, _ProbeBuild | None]:
    """The model rules, the backbone the budget buys, the view size and the frozen stages: the probe model they
    were measured with (``model`` when given), the choices (``{field: (value, reason)}``) and how the probe was
    built (None for a given model); the learning plan appended to ``learning`` when the frozen stages were
    planned."""
    model_choices = {} if model is not None else apply_model_recipe(
        cfg, survey, echo, accelerator=device.type == "cuda")
    embed_cost = backbone_choice.choose_for_run(  # Lite0/1/2 by what is left of the budget
        cfg, survey, model_choices, device, measurements=measurements,
        spent=lambda: measurements.spent("seconds spent before the backbone choice", work_since(started)))
    probe, build = (model, None) if model is not None else _build_probe(cfg, seeded)
    model_choices.update(measurements.counted(  # its embedding is measuring too (photos; kept outside the tape)
        lambda: measure_view_size(cfg, survey, probe, model_choices, device=device, progress=measurements.progress,
                                  afford=measurements.affords), device))
    model_choices.update(plan_learning_for_run(cfg, survey, probe, model_choices, device=device,  # frozen stages
                                               spent=work_since(started), measurements=measurements,
                                               planned=learning, embed_cost=embed_cost))
    return probe, model_choices, build


def _plan_on_splits(cfg: RunConfig, survey, data, probe: nn.Module, model_choices: dict, device: torch.device,
                    echo) -> tuple[Any, ResolvedRecipe, dict | None]:
    """The splits read for the probe, the recipe's data rules applied from them (:func:`apply_recipe`), and what the
    splits were read with when the run may build on them (else None)."""
    # transforms follow the model's preprocessing; given splits are read through a copy (the run holds them out)
    splits = copy.copy(data) if data is not None else build_splits(cfg, probe, survey)
    read_before = split_reading(cfg, probe)
    resolved = apply_recipe(cfg, splits, echo, bf16_native=native_bf16(device), model=probe,
                            model_choices=model_choices, accelerator=device.type == "cuda")
    # the validation classes the recipe chose are held out of them now, as build_splits holds out a given fraction:
    # they are what the finished config reads, unless the recipe changed anything else they were read with
    read_as = split_reading(cfg, probe)
    if data is not None or {**read_as, "val_class_fraction": None} != {**read_before, "val_class_fraction": None}:
        read_as = None
    return splits, resolved, read_as


def _fit_to_budget(cfg: RunConfig, splits, probe: nn.Module, resolved: ResolvedRecipe, device: torch.device, echo,
                   *, started: float, augment, measurements: Measurements, own_objective: bool) -> float | None:
    """The glyph plan of a model from scratch (steps, members and validations from measured costs) written into
    ``resolved.choices``; the seconds an embedded image took, as measured."""
    member_objective = (None if not own_objective else  # a member's step is timed with it
                        lambda classes: build_member_objective(cfg, classes))
    planned, embed_seconds = plan_glyphs_for_run(cfg, splits, probe, resolved, device=device,
                                                 spent=work_since(started), objective=member_objective,
                                                 augment=augment, measurements=measurements)
    resolved.choices.update(planned)
    if planned:
        echo.detail(recipe.format_planned(planned))
    return embed_seconds


def _run_model(cfg: RunConfig, probe: nn.Module, build: _ProbeBuild) -> tuple[nn.Module, dict]:
    """The model the run trains, and the random state the run starts from (the seed's, after the model was built).

    It is the probe where the finished config builds it from the seed: the probe was built from the seed alone and
    with the finished config's arguments, but for what the plan set on it since (pooling and mirror, read from the
    probe itself), what is set without weights (shift averaging, more frozen stages) and the embedding size the
    recipe read from it. Its buffers and trainable parameters go back to what they were built as (then its frozen
    stages frozen, as ``create_model`` freezes them), and the recipe's further ensemble members are built beside it
    (from their own seeds, as ``engine.model.build_model`` builds them). Anything else (the recipe changed an argument
    the probe cannot take on) is built again from the seed, as the run would build it.
    """
    final = model_arguments(cfg)
    ensemble = int(cfg.model.ensemble or 1)
    as_built = {**build.arguments, **_set_on_probe(probe, build, final)}
    if build.ensemble == 1:  # an attribute read in eval mode: no weights, no random draw
        as_built["shift_average"] = final["shift_average"]
    if build.seeded and as_built == final and build.ensemble in (1, ensemble):
        with torch.no_grad():
            for name, buffer in probe.named_buffers():  # the running statistics as built, before any measurement
                buffer.copy_(build.buffers[name])
        for param, trainable in zip(probe.parameters(), build.trainable):
            param.requires_grad_(trainable)
        if final["frozen_stages"]:  # on the flags as built: the stages frozen then, and those up to this one
            probe.trunk.freeze_stages(final["frozen_stages"])
        if build.ensemble == 1:
            probe.shift_average = final["shift_average"]
            probe = build_model(cfg, first_member=probe)  # the recipe's members beside it
        return probe, build.rng
    planning = rng_state()
    seed_everything(cfg.seed)
    model = build_model(cfg)
    run_rng = rng_state()
    set_rng_state(planning)
    return model, run_rng


def _set_on_probe(probe: nn.Module, build: _ProbeBuild, final: dict) -> dict:
    """The model arguments of a built single Embedder that the plan sets on it, or that it can take on without being
    built again: its pooling and mirror as it now has them; no embedding size as its backbone's feature size (what
    ``create_model`` makes of None); the finished config's frozen stages where they are at least those it was built
    with (freezing more of it is what ``create_model`` does)."""
    if build.ensemble != 1 or not is_embedder(probe):
        return {}
    now = {"pooling": probe.pool.pooling, "flip_average": bool(probe.flip_average)}
    if build.arguments["embedding_size"] is None:
        now["embedding_size"] = int(probe.trunk.num_features)
    built, frozen = build.arguments["frozen_stages"], final["frozen_stages"]
    if hasattr(probe.trunk, "freeze_stages") and frozen >= built and (frozen or not getattr(probe.trunk,
                                                                                            "frozen_stages", 0)):
        now["frozen_stages"] = frozen
    return now


def _plan_cache(cfg: RunConfig, probe: nn.Module, splits, augment, choices: dict, dist: distributed.DistInfo,
                echo) -> tuple[CachePlan, bool]:
    """``train.feature_cache`` resolved (recorded in ``choices``): the cache plan, and whether it waits for the first
    budget plan."""
    # auto under a time budget: built after the first plan, when the epochs it buys make the cache pay
    cache_deferred = cfg.train.feature_cache == "auto" and cfg.train.time_budget is not None \
        and cfg.train.cache_views is None  # views the learning plan chose are built before the first step
    cache_plan = plan_feature_cache(cfg, probe, splits.train, augment, distributed=dist.enabled, echo=echo,
                                    deferred=cache_deferred)
    recipe.apply(cfg, cache_choices(cfg, cache_plan))
    choices["train.feature_cache"] = (cfg.train.feature_cache, cache_plan.reason)
    return cache_plan, cache_deferred


def _say_run(cfg: RunConfig, device: torch.device, dist: distributed.DistInfo, echo) -> None:
    """One line: the model, its embedding, the loss, the device and the precision."""
    precision = "fp32" if cfg.train.mixed_precision == "none" else cfg.train.mixed_precision
    processes = f", {dist.world_size} processes" if dist.enabled else ""
    echo(f"run: {cfg.model.name} ({cfg.model.embedding_size}-D embedding), loss {cfg.loss.name}, on {device} "
         f"({precision}{processes})")


def uses_member_folds(cfg, model, splits) -> bool:
    """Whether the run trains its ensemble's members on their own folds (``protocol.member_folds``): asked for,
    an ensemble built from the config, and validation classes held out of the training split."""
    from dmlkit.models.ensemble import EmbedderEnsemble

    return bool(cfg.protocol.member_folds) and isinstance(model, EmbedderEnsemble) \
        and splits.val is not None and splits.before_holdout is not None \
        and distributed.torchrun_local_rank() is None  # an all-gathered batch would mix the members' blocks


def _member_folds(cfg: RunConfig, probe: nn.Module, splits, choices: dict) -> dict[str, tuple[Any, str]]:
    """``protocol.member_folds`` turned off (the recipe's choice) where the run has nothing to fold; a ConfigError
    where the user asked for folds the run cannot give."""
    if not cfg.protocol.member_folds or uses_member_folds(cfg, probe, splits):
        return {}
    if "protocol.member_folds" not in choices and (cfg.model.ensemble or 1) > 1:
        raise ConfigError("protocol.member_folds=true needs an ensemble built from the config "
                          "(model.ensemble > 1) in one process, with validation classes held out of the "
                          "training split (protocol.val_class_fraction > 0; not a validation split given).")
    unfolded = {"protocol.member_folds": (False, "one model, or no validation classes held out of the training "
                                                 "split: no folds to give")}
    recipe.apply(cfg, unfolded)
    return unfolded


__all__ = ["ResolvedRecipe", "apply_model_recipe", "apply_recipe", "plan", "uses_member_folds"]
