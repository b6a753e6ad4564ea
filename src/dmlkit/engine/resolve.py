"""A planned run built: a finished config (plus any objects the caller brings) turned into everything it trains with.

:func:`resolve_run` is the one way into the engine: ``dmlkit train``, ``dmlkit.fit``, ``sweep``, ``crossval`` and
the claims runner plan a run with :func:`dmlkit.recipe.planner` (which decides every field left to the recipe), then
call it; :class:`~dmlkit.engine.trainer.Trainer` receives its :class:`ResolvedRun` and builds nothing. It reads the
config and never writes to it, takes over what the plan built (device and process group, the model, the random
state after the seed and the model's build, the splits) and builds every other object once, in the order the parts
depend on each other (and the order the global RNG is drawn in, so the same seed gives the same numbers):

(device -> process group) -> loggers -> (seed -> model) -> splits -> batch augmentation -> label map -> objective
-> optimiser and schedule -> sampler -> autocast -> DDP / compile -> fingerprint.

``ResolvedRun.choices`` holds every value the recipe (and the measurements behind it) chose, with the
reason; :meth:`ResolvedRun.format` prints them with the objects (``dmlkit train --dry-run``) and
:meth:`ResolvedRun.summary` is the JSON-able record written to the run folder as ``resolved.json``.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable

import torch
from torch import nn

from dmlkit.config.schema import RunConfig, config_to_dict
from dmlkit.core.messages import messages
from dmlkit.engine import device_data, distributed, lazy_dynamo
from dmlkit.engine.augmentation import background_fill, build_batch_augmentation
from dmlkit.engine.batches import LabelMap, build_batch_sampler
from dmlkit.engine.callbacks import Callback, EarlyStopping
from dmlkit.engine.checkpoint_files import config_fingerprint
from dmlkit.engine.device import device_and_processes
from dmlkit.engine.frozen_stage_cache import CachePlan
from dmlkit.engine.given import NOTHING_GIVEN, GivenObjects
from dmlkit.engine.loggers import build_loggers
from dmlkit.engine.member_folds import MemberFolds, apply_member_folds
from dmlkit.engine.model import build_model
from dmlkit.engine.objective import build_objective
from dmlkit.engine.optim import build_optimizer, build_scheduler
from dmlkit.engine.plan_records import SEAL_KEY, seal
from dmlkit.engine.planned import PlannedRun
from dmlkit.engine.rng_state import seed_everything, set_rng_state
from dmlkit.engine.run_layout import RESOLVED_FILE
from dmlkit.engine.splits import build_splits, hold_out_validation_classes, split_reading
from dmlkit.engine.training.step_capture import CaptureDecision
from dmlkit.evaluation.embed import autocast_dtype as autocast_dtype_of
from dmlkit.methods import enabled_methods
from dmlkit.methods.hooks import MethodHooks

if TYPE_CHECKING:  # the recipe's record, held and handed on: the engine never imports the recipe
    from dmlkit.recipe.measurements import Measurements

#: The file :meth:`ResolvedRun.summary` is written to, next to ``config.yaml``.
SUMMARY_FILE = RESOLVED_FILE

log = logging.getLogger(__name__)


@dataclass
class ResolvedRun:
    """Every object a run trains with and every choice made for it (``choices``: ``{field: (value, reason)}``).

    ``cfg`` is the finished config (what ``config.yaml`` saves); ``recipe`` what the recipe recorded choosing it;
    ``started`` the wall clock (``time.perf_counter``) when planning began: ``train.time_budget`` counts from it.
    """

    cfg: RunConfig
    started: float
    device: torch.device
    dist: distributed.DistInfo
    loggers: list[Callback]
    splits: Any
    recipe: PlannedRun
    model: nn.Module
    channels_last: bool
    label_map: LabelMap
    objective: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    sampler: Any
    early_stopping: list[Callback]
    augment: Callable | None
    autocast_dtype: torch.dtype | None
    scaler: torch.amp.GradScaler | None
    forward_model: nn.Module
    cache_deferred: bool
    cache_plan: CachePlan
    fingerprint: str
    method: type[MethodHooks]
    member_folds: MemberFolds | None = None  # protocol.member_folds: each member's own fold (engine/member_folds.py)
    embed_seconds: float | None = None  # an embedded image as measured before training (the glyph plan), if it was
    request: dict | None = None  # the config as asked, before the recipe: what `dmlkit train --plan` starts from
    measurements: Measurements | None = None  # the machine's numbers the plans read (recipe/measurements.py)
    step_capture: CaptureDecision | None = None  # train.step_capture as the recipe resolved it (recipe/step_capture_plan.py)
    # callbacks the plan attached (dmlkit.recipe.prepare_run: the time budget, the step capture's decision), which
    # the trainer calls after the config's own
    plan_callbacks: tuple[Callback, ...] = ()

    def method_hooks(self, trainer) -> MethodHooks:
        """The enabled method's hooks on ``trainer`` (they read its documented state), or plain training's."""
        return MethodHooks() if self.method is MethodHooks else self.method(trainer)

    @property
    def choices(self) -> dict[str, tuple[Any, str]]:
        """What the recipe chose (model, data, batches, budget, ...) and the feature cache's resolution, with reasons."""
        chosen = dict(self.recipe.choices)
        if self.step_capture is not None:
            chosen["train.step_capture"] = (self.cfg.train.step_capture, self.step_capture.describe())
        return chosen

    def parts(self) -> dict[str, str]:
        """One line per object of the run: what it is and its main settings."""
        cfg, splits = self.cfg, self.splits
        parameters = sum(p.numel() for p in self.model.parameters())
        trainable = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        objective = self.objective
        loss = getattr(objective, "loss", None)
        miner = getattr(objective, "miner", None)
        memory = getattr(objective, "memory", None)
        groups = ", ".join(f"{len(g['params'])} tensors at lr {g['lr']:g}" for g in self.optimizer.param_groups)
        return {
            "device": f"{self.device}" + (f" (rank {self.dist.rank} of {self.dist.world_size})"
                                           if self.dist.enabled else "") + f"; train.device={cfg.train.device}",
            "data": f"{cfg.data.name}" + (f" at {cfg.data.root}" if cfg.data.root else "") + "; " + splits.describe(),
            "model": f"{cfg.model.name} ({type(self.model).__name__}), embedding size {cfg.model.embedding_size}, "
                     f"{parameters:,} parameters ({trainable:,} trained)"
                     + ("; channels_last" if self.channels_last else ""),
            "objective": f"{type(loss).__name__ if loss is not None else type(objective).__name__}"
                         + (f" + miner {type(miner).__name__}" if miner is not None else "")
                         + (f" + memory {type(memory).__name__}" if memory is not None else "")
                         + f" over {len(self.label_map)} training classes",
            "optimizer": f"{type(self.optimizer).__name__} ({groups}); schedule {type(self.scheduler).__name__}",
            "sampler": f"{type(self.sampler).__name__}, batch size {cfg.sampler.batch_size}"
                       + (f", m={cfg.sampler.m}" if cfg.sampler.name == "m_per_class" else ""),
            "steps": self._steps_line(),
            "augmentation": f"data.augment={cfg.data.augment}"
                            + (f" ({type(self.augment).__name__})" if self.augment is not None else ""),
            "precision": f"train.mixed_precision={cfg.train.mixed_precision}"
                         + (f" (autocast {self.autocast_dtype})" if self.autocast_dtype is not None else ""),
            "feature cache": ("on" if self.cache_plan.enabled else "off")
                             + (" (built if the budget's first plan buys the epochs)"
                                if self.cache_deferred and self.cache_plan.enabled else ""),
            "method": self.method.__name__,
            "fingerprint": self.fingerprint,
        }

    def _steps_line(self) -> str:
        """The steps the run will take: the plan's, where it predicted fewer than the ceiling, with the ceiling."""
        cfg, planned = self.cfg, getattr(self.recipe, "planned_steps", None)
        asked = (f"train.max_steps={cfg.train.max_steps}, train.eval_every={cfg.train.eval_every}, "
                 f"train.time_budget={cfg.train.time_budget}")
        if planned is None or cfg.train.max_steps is None:
            return asked
        budget = "the default budget" if cfg.train.time_budget is None else f"the {cfg.train.time_budget:.0f}-s budget"
        if planned >= cfg.train.max_steps:
            return f"{cfg.train.max_steps} steps (the ceiling; {budget} affords them at the measured costs), {asked}"
        if planned == 0:
            return (f"no training step fits {budget}: the pretrained backbone is "
                    f"evaluated alone ({asked}: the ceiling, if the first steps run faster than measured)")
        return (f"about {planned} steps (what {budget} buys at the measured costs; "
                f"the trainer fits them to the steps it times), ceiling {asked}")

    def format(self) -> str:
        """The resolved run as text: its objects, then what the recipe chose and why."""
        parts = self.parts()
        width = max(len(name) for name in parts)
        lines = [f"resolved run: {self.cfg.name}"]
        lines += [f"  {name.ljust(width)}  {text}" for name, text in parts.items()]
        lines.append(f"what the recipe chose and why (training split: {self.recipe.profile.describe()}):")
        chosen = self.choices
        ordered = [path for path in self.recipe.field_order if path in chosen]
        ordered += [path for path in chosen if path not in ordered]
        lines += [f"  {path} = {chosen[path][0]}  ({chosen[path][1]})" for path in ordered]
        return "\n".join(lines)

    def summary(self) -> dict:
        """A JSON-able record of :meth:`parts` and :attr:`choices` (``resolved.json`` in the run folder)."""
        record = self.measurements.record() if self.measurements is not None else None
        return {
            "name": self.cfg.name,
            "parts": self.parts(),
            "training_split": self.recipe.profile.describe(),
            "choices": {path: {"value": _plain(value), "reason": reason}
                        for path, (value, reason) in self.choices.items()},
            "request": self.request,
            "measurements": record,
            SEAL_KEY: seal(self.request, record["tape"] if record is not None else None),  # an edit is said on replay
        }


def _plain(value: Any) -> Any:
    """``value`` as JSON has it (tuples as lists; anything else unknown to JSON as its ``repr``)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return repr(value)


def resolve_run(
    planned: PlannedRun,
    given: GivenObjects = NOTHING_GIVEN,
    *,
    echo: Callable[[str], None] | None = None,
) -> ResolvedRun:
    """Build the run ``planned`` describes (:func:`dmlkit.recipe.planner`); objects given replace what the config
    would build.

    ``given`` (:class:`~dmlkit.engine.given.GivenObjects`: a model, loss, miner, the user's splits, an optimiser)
    replaces the config's objects: the same objects the plan was made with. The
    finished config ``planned.cfg`` is read, never written; each object is built once: the device, process group
    and model the plan built (``planned.device``, ``planned.model``) are the run's, which draws on from the random
    state the plan left it (``planned.rng``); a plan without them has them built here. The splits the plan read
    (``planned.splits``) are the run's when this config and model read them the same way
    (:func:`~dmlkit.engine.splits.split_reading`); otherwise the config's data is read here.
    """
    cfg = planned.cfg
    device, dist = (planned.device, planned.dist) if planned.device is not None and planned.dist is not None \
        else device_and_processes(cfg)
    loggers = build_loggers(cfg) if dist.is_main else []
    built = _run_model(planned, given.model)
    splits = _run_splits(planned, built, given.data)
    # the run keeps its own splits and model, never a second reference beside them
    planned = replace(planned, splits=None, model=None, rng=None)
    # the warp fills with the background as the model sees it: after the split's normalisation
    augment = build_batch_augmentation(cfg, background_fill(splits, planned.profile.background))
    built, channels_last = _on_device(built, device)
    member_folds = _fold_members(cfg, splits, built) if cfg.protocol.member_folds else None
    train_labels = splits.train.labels
    label_map = LabelMap(train_labels)
    objective = build_objective(cfg, num_classes=len(label_map), loss=given.loss, miner=given.miner,
                                member_folds=member_folds).to(device)
    optimizer = given.optimizer if given.optimizer is not None else build_optimizer(built, objective, cfg.optimizer)
    # read at every step: a run planned to its time budget learns its step count after the first steps
    scheduler = build_scheduler(optimizer, cfg.optimizer, cfg.train.max_steps)  # the trainer's schedule from step 1
    sampler = build_batch_sampler(cfg, train_labels, rank=dist.rank, world_size=dist.world_size,
                                  member_folds=member_folds)
    methods = enabled_methods(cfg)
    patience = [EarlyStopping(cfg.train.patience)] if cfg.train.patience and not methods else []
    # fp16 gradients underflow without loss scaling; bf16 has fp32's range and needs none
    scaler = torch.amp.GradScaler(device.type) if cfg.train.mixed_precision == "fp16" else None
    forward_model = _forward_model(cfg, built, dist)
    if dist.is_main:  # before the first step: which classes and how many images train, validate and test
        messages(echo, log)(f"split: {splits.describe()}")
    return ResolvedRun(
        cfg=cfg, started=planned.started, device=device, dist=dist, loggers=loggers, splits=splits, recipe=planned,
        model=built, channels_last=channels_last, label_map=label_map, objective=objective, optimizer=optimizer,
        scheduler=scheduler, sampler=sampler, early_stopping=patience, augment=augment,
        autocast_dtype=autocast_dtype_of(cfg.train.mixed_precision), scaler=scaler, forward_model=forward_model,
        cache_deferred=planned.cache_deferred, cache_plan=planned.cache_plan,
        fingerprint=config_fingerprint(config_to_dict(cfg)), method=methods[0] if methods else MethodHooks,
        embed_seconds=planned.embed_seconds, member_folds=member_folds, request=planned.request,
        measurements=planned.measurements,
    )


def _run_model(planned: PlannedRun, model: nn.Module | None) -> nn.Module:
    """The run's model (the one given, else the plan's), with the global random state after the seed and the model's
    build; a plan without them builds it here, from the seed (on the CPU: the same weights anywhere)."""
    if model is None and planned.model is None:
        seed_everything(planned.cfg.seed)
        return build_model(planned.cfg)
    if planned.rng is not None:
        set_rng_state(planned.rng)
    else:
        seed_everything(planned.cfg.seed)
    return model if model is not None else planned.model


def _run_splits(planned: PlannedRun, built: nn.Module, data) -> Any:
    """The run's splits: the user's (with the recipe's validation classes held out), the plan's where this config and
    model read them the same way, else read here."""
    cfg = planned.cfg
    if data is not None:  # the user's splits: the validation classes the recipe chose are held out here
        splits = data
        if cfg.protocol.val_class_fraction and splits.val is None:
            hold_out_validation_classes(splits, cfg.protocol.val_class_fraction, cfg.protocol.seed)
        return splits
    if planned.splits is not None and planned.splits_read_as == split_reading(cfg, built):
        # what the plan read is what this config reads: each image is decoded once; the run's own holder of the
        # same datasets, so what it reassigns (member folds) leaves the plan's splits as they were
        splits = copy.copy(planned.splits)
        splits.info = dict(splits.info)
        return splits
    return build_splits(cfg, built)  # transforms follow the model's preprocessing


def _on_device(built: nn.Module, device: torch.device) -> tuple[nn.Module, bool]:
    """The model moved to ``device``, and whether it went channels-last (conv models on a GPU)."""
    built = built.to(device)
    channels_last = device_data.uses_channels_last(built, device)
    if channels_last:
        built.to(memory_format=torch.channels_last)
    return built, channels_last


def _fold_members(cfg: RunConfig, splits, built: nn.Module) -> MemberFolds:
    """``protocol.member_folds``: each ensemble member's own fold of every training class, applied to ``splits``; the
    model then takes a batch per member."""
    label_map = LabelMap(splits.before_holdout.labels)  # every training class: members split them
    member_folds = apply_member_folds(splits, label_map, int(cfg.model.ensemble), cfg.protocol.val_class_fraction,
                                      cfg.protocol.seed)
    built.member_batches = True
    return member_folds


def _forward_model(cfg: RunConfig, built: nn.Module, dist: distributed.DistInfo) -> nn.Module:
    """What the training step calls: the model under DDP (itself in one process), compiled when ``train.compile``."""
    ddp_model = distributed.wrap_model(built, dist)  # the model itself in one process
    if cfg.train.compile:
        lazy_dynamo.restore()  # the optimisers' own dynamo wrappers, before anything compiles
    return torch.compile(ddp_model) if cfg.train.compile else ddp_model


__all__ = ["SUMMARY_FILE", "ResolvedRun", "resolve_run"]
