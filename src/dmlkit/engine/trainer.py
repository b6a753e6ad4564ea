"""The training engine: one loop for every loss, miner, memory and ASAP.

Data flow of a step: batch sampler -> index batch -> images + labels (mapped to 0..C-1)
-> ``train.device`` (on a GPU an in-memory split already lives there and is augmented there;
other batches come in pinned, non-blocking copies: ``engine/device_data.py``) -> model
(optionally under bf16/fp16 autocast) -> embeddings -> objective (miner / memory / loss,
accumulated in fp32) -> backward (fp16: of the scaled loss, then
unscaled) -> method hook (ASAP's proximal gradient) -> finite check -> gradient clipping ->
optimiser (fp16: through the gradient scaler) and schedule step. Every ``eval_every`` steps the
validation fold is embedded and scored (MAP@R selects the checkpoint); the test split is
evaluated once, at the end, with the selected weights.
"""

from __future__ import annotations

import copy
import math
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import torch
from torch import nn

from dmlkit.config.recipe import selects_by_significance
from dmlkit.config.schema import RunConfig, config_to_dict
from dmlkit.engine import backbone_choice, budget, builders, device_data, distributed
from dmlkit.engine.budget import Plan, Speeds
from dmlkit.engine.callbacks import Callback, CallbackList, EarlyStopping
from dmlkit.engine.checkpoint import (
    atomic_write_json,
    config_fingerprint,
    load_checkpoint,
    save_checkpoint,
)
from dmlkit.engine.feature_cache import (
    EPOCHS_PER_VIEW,
    MIN_VIEWS,
    FrozenFeatureCache,
    plan_feature_cache,
    views_for_epochs,
)
from dmlkit.engine.learning_plan import plan_for_run
from dmlkit.engine.loggers import build_loggers
from dmlkit.engine.optim import build_optimizer, build_scheduler
from dmlkit.engine.run_dir import RunDirectory
from dmlkit.engine.seeding import rng_state, seed_everything, set_rng_state
from dmlkit.engine.timing import synchronize
from dmlkit.engine.view_size import measure_view_size
from dmlkit.evaluation.embed import autocast_dtype, embed_dataset
from dmlkit.evaluation.metrics import SELECTION_METRIC
from dmlkit.evaluation.retrieval import map_at_r_per_query, paired_gain
from dmlkit.exceptions import CheckpointError, NonFiniteError
from dmlkit.methods import build_method_hooks, enabled_methods
from dmlkit.methods.hooks import MethodHooks, overrides_hook
from dmlkit.seeds import derive_generator


@dataclass
class TrainResult:
    """What :meth:`Trainer.fit` returns."""

    test_metrics: dict
    best_step: int
    steps: int
    selected_on: str
    run_dir: Path
    val_history: list = field(default_factory=list)


class Trainer:
    """Trains into ``run_dir``; ``resume=True`` continues from ``run_dir``'s last checkpoint.

    The one engine of both ways in. From a config, ``Trainer(cfg, run_dir)`` builds every part
    (data, model, loss, miner, optimiser) from ``cfg``. From objects, any of ``model`` (an
    ``nn.Module`` from images ``[B, C, H, W]`` to embeddings ``[B, D]``), ``loss`` and ``miner``
    (dmlkit's or pytorch-metric-learning's), ``data`` (:func:`dmlkit.data.user.user_splits` of the
    user's datasets) and ``optimizer`` replace what the config would build; the recipe fills the
    fields nobody set, as for a config (``dmlkit.fit`` is the short way). ``callbacks``
    (:class:`~dmlkit.engine.callbacks.Callback`) run at the loop's events after the config's own
    (``train.patience``, ``train.loggers``).
    """

    def __init__(
        self,
        cfg: RunConfig,
        run_dir: str | Path,
        *,
        resume: bool = False,
        hooks: MethodHooks | None = None,
        echo: Callable[[str], None] = print,
        model: nn.Module | None = None,
        loss: nn.Module | None = None,
        miner: nn.Module | None = None,
        data=None,
        optimizer: torch.optim.Optimizer | None = None,
        callbacks: Iterable[Callback] = (),
    ):
        self.cfg = cfg
        self.wall_clock: Callable[[], float] = time.perf_counter  # the time budget's clock (train.time_budget)
        self.started = self.wall_clock()  # ... counting from here
        # the device first (a ConfigError for a missing GPU comes before anything heavy); under
        # torchrun it is this rank's GPU, cuda:LOCAL_RANK, and it picks the backend: nccl for CUDA, else gloo
        self.device = builders.resolve_device(cfg.train.device, local_rank=distributed.torchrun_local_rank())
        self.dist = distributed.init_distributed(backend="nccl" if self.device.type == "cuda" else "gloo")
        self.echo = echo if self.dist.is_main else (lambda _message: None)
        self.run = RunDirectory(run_dir)
        if not self.dist.is_main:  # files are written once, by rank 0 (hooks log through self.run too)
            self.run.log = lambda record: None
        self.resume = resume
        if cfg.train.num_threads:
            torch.set_num_threads(cfg.train.num_threads)
        # the config's loggers first: a missing package fails here, before anything heavy
        loggers = build_loggers(cfg) if self.dist.is_main else []
        seed_everything(cfg.seed)
        survey = data if data is not None else builders.survey_data(cfg)  # a first look: which model, which image size
        model_choices = {} if model is not None else builders.apply_model_recipe(
            cfg, survey, self.echo, accelerator=self.device.type == "cuda")
        backbone_choice.choose_for_run(cfg, survey, model_choices, self.device)  # Lite0/1/2 by the time budget
        built = model if model is not None else builders.build_model(cfg)  # seeded on the CPU: same weights anywhere
        model_choices.update(measure_view_size(cfg, survey, built, model_choices, device=self.device))  # photos
        model_choices.update(plan_for_run(cfg, survey, built, model_choices, device=self.device,
                                          spent=self.wall_clock() - self.started))  # frozen stages, cached views
        # transforms follow the model's preprocessing
        self.splits = data if data is not None else builders.build_splits(cfg, built, survey)
        self.recipe = builders.apply_recipe(cfg, self.splits, self.echo, bf16_native=builders.native_bf16(self.device),
                                            model=built, model_choices=model_choices,
                                            accelerator=self.device.type == "cuda")
        chose = {key: value for key, (value, _) in self.recipe.choices.items()}
        if model is None and (chose.get("model.ensemble", 1) > 1 or chose.get("model.shift_average", 0)):
            seed_everything(cfg.seed)  # the recipe asked for more
            built = builders.build_model(cfg)
        self.model = built.to(self.device)
        self._channels_last = device_data.uses_channels_last(self.model, self.device)  # conv models on a GPU
        if self._channels_last:
            self.model.to(memory_format=torch.channels_last)
        train_labels = self.splits.train.labels
        self.label_map = builders.LabelMap(train_labels)
        self.objective = builders.build_objective(cfg, num_classes=len(self.label_map), loss=loss,
                                                  miner=miner).to(self.device)
        self._to_device = self.device.type != "cpu"  # batches arrive on the CPU
        self._pin = self.device.type == "cuda"  # page-locked host batches copy to the GPU asynchronously
        self.optimizer = optimizer if optimizer is not None else build_optimizer(self.model, self.objective,
                                                                                 cfg.optimizer)
        # read at every step: a run planned to its time budget learns its step count after the first steps
        self.scheduler = build_scheduler(self.optimizer, cfg.optimizer, lambda: self.cfg.train.max_steps)
        self.sampler = builders.build_batch_sampler(cfg, train_labels, rank=self.dist.rank, world_size=self.dist.world_size)
        self.position = builders.BatchPosition()
        self.step = 0
        self.best_score = -math.inf
        self.best_step = 0
        self.evals_since_best = 0
        self.stopped_early = False
        self.should_stop = False  # a callback sets it to end training after the current step
        self.elapsed = 0.0
        self.eval_seconds: list[float] = []  # wall time of each validation this session (the progress bar's ETA)
        self.clock: Callable[[], float] = time.perf_counter  # the training clock (a benchmark may use process_time)
        self.hooks = hooks if hooks is not None else build_method_hooks(cfg, self)
        patience = [EarlyStopping(cfg.train.patience)] if cfg.train.patience and not enabled_methods(cfg) else []
        self.callbacks = CallbackList([*patience, *callbacks, *loggers])
        self.run.listeners.append(lambda record: self.callbacks.call("on_log", self, record))
        # the warp fills with the background as the model sees it: after the split's normalisation
        background = torch.tensor(self.recipe.profile.background).view(1, -1, 1, 1)
        transform = self.splits.train.transform
        fill = (transform(background) if getattr(transform, "batched", False) else background).flatten().tolist()
        self.augment = builders.build_batch_augmentation(cfg, fill)
        self.autocast_dtype = autocast_dtype(cfg.train.mixed_precision)
        self.autocast_device = self.device.type
        # fp16 gradients underflow without loss scaling; bf16 has fp32's range and needs none
        self.scaler = torch.amp.GradScaler(self.device.type) if cfg.train.mixed_precision == "fp16" else None
        ddp_model = distributed.wrap_model(self.model, self.dist)  # self.model itself in one process
        self.forward_model = torch.compile(ddp_model) if cfg.train.compile else ddp_model
        self.train_forward = self.forward_model  # the training steps' forward (the rest of the model, from the cache)
        # auto under a time budget: built after the first plan, when the epochs it buys make the cache pay
        self.cache_deferred = cfg.train.feature_cache == "auto" and cfg.train.time_budget is not None \
            and cfg.train.cache_views is None  # views the learning plan chose are built before the first step
        self.cache_plan = plan_feature_cache(cfg, self.model, self.splits.train, self.augment,
                                             distributed=self.dist.enabled, echo=self.echo,
                                             deferred=self.cache_deferred)
        self.cache_views = 0 if self.cache_deferred or not self.cache_plan.enabled else self.cache_plan.views
        self.feature_cache: FrozenFeatureCache | None = None  # built by _train (again on resume: deterministic)
        self.fingerprint = config_fingerprint(config_to_dict(cfg))
        self.pretrained_val_ap: torch.Tensor | None = None  # per-query validation AP@R of the untrained embedding
        self.reference_val_ap: torch.Tensor | None = None  # ... of the last significant gain (the stopping rule)
        self.last_eval_improved = False  # the last validation counted as progress (EarlyStopping reads it)
        self.plan: Plan | None = None  # the time budget's plan (engine/budget.py), once made
        self._recipe_schedule: tuple[int, int] | None = None  # the recipe's steps and interval, before any plan
        self._best_state: dict | None = None

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict:
        """Everything needed to continue exactly (weights_only-loadable)."""
        return {
            "format": "dmlkit-checkpoint-1",
            "fingerprint": self.fingerprint,
            "config": config_to_dict(self.cfg),
            "step": self.step,
            "epoch": self.position.epoch,
            "batch_in_epoch": self.position.batch_in_epoch,
            "model": self.model.state_dict(),
            "objective": self.objective.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": rng_state(),
            "best_score": self.best_score,
            "best_step": self.best_step,
            "evals_since_best": self.evals_since_best,
            "elapsed": self.elapsed,
            "hooks": self.hooks.state_dict(),
            "callbacks": self.callbacks.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else {},
            "pretrained_val_ap": self.pretrained_val_ap,
            "reference_val_ap": self.reference_val_ap,
            "planned": {"max_steps": self.cfg.train.max_steps, "eval_every": self.cfg.train.eval_every,
                        "made": self.plan is not None, "recipe": self._recipe_schedule,
                        "cache_views": self.cache_views, "cache_deferred": self.cache_deferred},
        }

    def load_state_dict(self, state: dict, source: str = "checkpoint") -> None:
        """Restore :meth:`state_dict`; refuses a checkpoint of another configuration."""
        if state.get("fingerprint") != self.fingerprint:
            raise CheckpointError(
                f"{source} was written by a different configuration (data, model, loss or optimiser differ); "
                "it cannot be resumed with this config."
            )
        try:
            self.model.load_state_dict(state["model"])
            self.objective.load_state_dict(state["objective"])
        except RuntimeError as exc:
            raise CheckpointError(f"{source} does not fit this model: {exc}") from None
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        set_rng_state(state["rng"])
        self.step = int(state["step"])
        self.position = builders.BatchPosition(int(state["epoch"]), int(state["batch_in_epoch"]))
        self.best_score = float(state["best_score"])
        self.best_step = int(state["best_step"])
        self.evals_since_best = int(state["evals_since_best"])
        self.elapsed = float(state["elapsed"])
        self.hooks.load_state_dict(state["hooks"])
        self.callbacks.load_state_dict(state.get("callbacks", {}))
        if self.scaler is not None and state.get("scaler"):  # the loss scale and its growth counter
            self.scaler.load_state_dict(state["scaler"])
        self.pretrained_val_ap = state.get("pretrained_val_ap")
        self.reference_val_ap = state.get("reference_val_ap")
        planned = state.get("planned")
        if planned:  # a resumed run keeps the steps its time budget planned
            self.cfg.train.max_steps, self.cfg.train.eval_every = planned["max_steps"], planned["eval_every"]
            if planned.get("made"):
                self.plan = Plan(planned["max_steps"], planned["eval_every"], math.nan, True, "resumed")
                self._recipe_schedule = tuple(planned["recipe"]) if planned.get("recipe") else None
            self.cache_views = planned.get("cache_views", self.cache_views)
            self.cache_deferred = planned.get("cache_deferred", self.cache_deferred)

    def weights_state(self) -> dict:
        """Model and objective weights only (the best checkpoint, export, evaluation)."""
        return {
            "format": "dmlkit-checkpoint-1",
            "fingerprint": self.fingerprint,
            "config": config_to_dict(self.cfg),
            "step": self.step,
            "model": copy.deepcopy(self.model.state_dict()),
            "objective": copy.deepcopy(self.objective.state_dict()),
        }

    def save(self) -> None:
        """Write ``checkpoints/last.pt`` atomically (then ``on_checkpoint``: TensorBoard flushes up to this step)."""
        save_checkpoint(self.run.last_checkpoint, self.state_dict())
        self.callbacks.call("on_checkpoint", self, self.step)

    # ------------------------------------------------------------------ loop

    def training_step(self, images: torch.Tensor, labels: torch.Tensor, indices: list[int] | None = None) -> float:
        """One optimisation step; returns the loss value (NaN when a non-finite step was skipped).

        Per-step work beyond a hand-written loop is kept to what the engine promises: one
        ``.item()`` of the loss (its finite check and the returned value), one fused norm over
        all gradients (their finite check, and the clipping norm when ``grad_clip`` is set).

        With ``mixed_precision=fp16`` the loss is scaled before backward and the gradients are
        unscaled right after it (and the proxy all-reduce), so the method hook, the finite check
        and clipping all see true gradients. A non-finite gradient found by that unscale is an
        fp16 overflow: the scaler skips the update and lowers its scale, the step is not a
        non-finite stop (``on_nonfinite`` does not apply) and the loss value is returned. A
        non-finite loss, or a gradient made non-finite after the unscale (by a hook), is still
        handled by ``on_nonfinite``.
        """
        if not self.model.training:  # evaluation puts it back; the check saves a walk over every module
            self.model.train()
        if self._to_device:  # (images already on the card stay: an in-memory split augmented there)
            images = device_data.to_device(images, self.device, self._pin)
            labels = device_data.to_device(labels, self.device, self._pin)
        if self._channels_last and images.dim() == 4:
            images = images.contiguous(memory_format=torch.channels_last)
        if self.autocast_dtype is None:
            embeddings = self.train_forward(images)
        else:
            with torch.autocast(self.autocast_device, dtype=self.autocast_dtype):
                embeddings = self.train_forward(images)
        if self.dist.enabled:
            embeddings = distributed.all_gather_with_grad(embeddings)  # global batch [W*b, D]; local rows keep grad
            labels = distributed.all_gather_labels(labels)
        if indices is not None and overrides_hook(self.hooks, "on_batch_embeddings"):
            if self.dist.enabled:
                indices = distributed.all_gather_labels(torch.as_tensor(indices)).tolist()
            self.hooks.on_batch_embeddings(self, indices, embeddings.detach())
        loss = self.objective(embeddings, labels)
        value = loss.item()
        if not math.isfinite(value):
            return self._non_finite("loss", value)
        self.optimizer.zero_grad(set_to_none=True)
        scaler = self.scaler
        if scaler is None:
            loss.backward()
        else:
            scaler.scale(loss).backward()
        if self.dist.enabled:
            distributed.allreduce_gradients_(self.objective.parameters())  # proxies: DDP wraps only the model
        if scaler is not None:
            scaler.unscale_(self.optimizer)  # records whether the scaled backward overflowed
        self.hooks.after_backward(self)
        total = self._gradient_norm()
        if not math.isfinite(total):
            if scaler is not None and self._scaler_backed_off():
                return self._skip_step(value)
            return self._non_finite("gradient norm", total)
        if scaler is None:
            self.optimizer.step()
        else:
            scaler.step(self.optimizer)
            scaler.update()
        self.scheduler.step()
        return value

    def _scaler_backed_off(self) -> bool:
        """Close the scaler's iteration after a non-finite gradient; True when it was an fp16 overflow.

        ``update()`` lowers the scale exactly when ``unscale_`` found inf/NaN in the scaled
        gradients; otherwise the non-finite value appeared later (a hook) and is a real problem.
        """
        before = self.scaler.get_scale()
        self.scaler.update()
        return self.scaler.get_scale() < before

    def _skip_step(self, value: float) -> float:
        """No update this step, but the schedule advances (it stays aligned with the step count)."""
        self.optimizer.zero_grad(set_to_none=True)
        with warnings.catch_warnings():  # a skipped step on purpose: no optimiser step before this scheduler step
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")
            self.scheduler.step()
        return value

    def _gradient_norm(self) -> float:
        """Total L2 norm of every gradient in one fused pass; clips to ``optimizer.grad_clip`` when set.

        The norm is the finite check: a NaN or infinite gradient anywhere makes it non-finite.
        """
        params = [p for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]
        if not params:
            return 0.0
        clip = self.cfg.optimizer.grad_clip
        if clip is not None:
            return float(torch.nn.utils.clip_grad_norm_(params, clip))
        return float(torch.nn.utils.get_total_norm([p.grad for p in params]))  # the norm clipping would use, no clip

    def _non_finite(self, what: str, value: float) -> float:
        self.optimizer.zero_grad(set_to_none=True)
        if self.cfg.train.on_nonfinite == "skip":
            self.echo(f"warning: step {self.step + 1}: non-finite {what} ({value}); step skipped")
            return self._skip_step(float("nan"))
        last = self.run.last_checkpoint
        where = f"the last good checkpoint is {last}" if last.exists() else "no checkpoint was written yet"
        raise NonFiniteError(
            f"Non-finite {what} ({value}) at step {self.step + 1}; training stopped, weights were not updated; {where}. "
            "Lower optimizer.lr, set optimizer.grad_clip, or set train.on_nonfinite=skip."
        )

    def embed(self, dataset, progress: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Embeddings and labels of a whole split with the current weights, under the training autocast
        (as ``dmlkit evaluate`` and ``dmlkit embed`` embed a run's splits, so they reproduce the metrics)."""
        return embed_dataset(self.model, device_data.resident_on(dataset, self.device), self.cfg.eval.batch_size,
                             self.cfg.data.num_workers, self.autocast_dtype, progress=progress)

    def score(self, embeddings: torch.Tensor, labels: torch.Tensor, *, clustering: bool,
              reference: tuple[torch.Tensor, torch.Tensor] | None = None,
              own_reference: torch.Tensor | None = None) -> dict:
        """Retrieval, verification (and optionally clustering) metrics; ``reference`` is a separate gallery (In-Shop),
        ``own_reference`` the gallery row that is each query itself (-1: none; a CSV row both query and gallery).

        Verification and clustering see every embedding of the split once (queries and gallery together)."""
        from dmlkit.evaluation import clustering_metrics, query_gallery_union, retrieval_metrics, verification_metrics

        gallery, gallery_labels = reference if reference is not None else (None, None)
        searched = self._searched(embeddings)  # on a GPU, the exact k-NN and retrieval metrics run on the card
        metrics = retrieval_metrics(searched, labels, reference=None if gallery is None else self._searched(gallery),
                                    reference_labels=gallery_labels, ks=tuple(self.cfg.eval.ks),
                                    backend=self.cfg.eval.backend, own_reference=own_reference)
        everything, everything_labels = (embeddings, labels) if gallery is None else query_gallery_union(
            embeddings, labels, gallery, gallery_labels, own_reference)
        metrics.update(verification_metrics(everything, everything_labels, seed=self.cfg.seed))
        if clustering:
            metrics.update(clustering_metrics(everything, everything_labels, over_cluster=self.cfg.eval.over_cluster,
                                              seed=self.cfg.seed))
        return metrics

    def _searched(self, embeddings: torch.Tensor) -> torch.Tensor:
        """Embeddings where the k-NN metrics search them: the training GPU (``evaluation.knn_device``), else as given."""
        return embeddings.to(self.device) if self.device.type == "cuda" else embeddings

    def evaluate_split(self, dataset, *, clustering: bool) -> dict:
        """Embed a split and compute retrieval, verification (and optionally clustering) metrics."""
        return self.score(*self.embed(dataset), clustering=clustering)

    def _timed_validation(self) -> bool:
        start = self.clock()
        try:
            return self.validate()
        finally:
            self.eval_seconds.append(self.clock() - start)

    def validate(self) -> float:
        """Score the validation fold; track the best weights; returns MAP@R."""
        # Rank 0 scores; every rank does the same bookkeeping and hooks, so ranks stay identical (ASAP).
        compare = selects_by_significance(self.cfg)
        result = None
        if self.dist.is_main:
            embeddings, labels = self.embed(self.splits.val)
            per_query = (map_at_r_per_query(self._searched(embeddings), labels, backend=self.cfg.eval.backend)
                         if compare else None)
            result = (self.score(embeddings, labels, clustering=False), per_query)
        metrics, per_query = distributed.broadcast_object(result)
        score = float(metrics[SELECTION_METRIC])
        improved = score > self.best_score
        progress = improved
        if compare and self.step == 0:
            self.pretrained_val_ap = self.reference_val_ap = per_query  # the untrained embedding: what training must beat
        elif compare and self.pretrained_val_ap is not None:
            gain, error = paired_gain(per_query, self.pretrained_val_ap)
            metrics = {**metrics, "gain_over_pretrained": gain, "gain_standard_error": error}
            improved = improved and gain > SIGNIFICANT_ERRORS * error
            # the stopping rule: progress is a significant gain over the last validation that made one
            step_gain, step_error = paired_gain(per_query, self.reference_val_ap)
            progress = step_gain > SIGNIFICANT_ERRORS * step_error
            if progress:
                self.reference_val_ap = per_query
            metrics = {**metrics, "gain_over_reference": step_gain, "reference_standard_error": step_error}
        self.last_eval_improved = progress
        if improved:
            self.best_score, self.best_step, self.evals_since_best = score, self.step, 0
            if self.dist.is_main:
                save_checkpoint(self.run.best_checkpoint, self.weights_state())
        else:
            self.evals_since_best += 1
        self.run.log({"kind": "eval", "split": "val", "step": self.step, "time": self.elapsed, **_floats(metrics)})
        stop = self.hooks.on_evaluation(self, score, improved)
        self.callbacks.call("on_evaluation_end", self, self.step, metrics)
        return stop or self.should_stop

    def measured_speeds(self, step_seconds: float, has_val: bool) -> Speeds:
        """This run's speeds: a training step (given), a validation and the test split's evaluation.

        Before the first validation, an embedded image is taken to cost a third of a trained one
        (forward only) times the views the model averages (mirror, shifts).
        """
        num_val = len(self.splits.val) if has_val else 0
        test = self.splits.test if self.splits.test is not None else getattr(self.splits, "query", None)
        num_test = len(test) if test is not None else 0
        if getattr(self.splits, "gallery", None) is not None:
            num_test += len(self.splits.gallery)
        if self.eval_seconds:
            per_eval = sum(self.eval_seconds) / len(self.eval_seconds)
            test_seconds = budget.estimate_test_seconds(per_eval, num_val, num_test)
        else:
            per_image = step_seconds / max(self.cfg.sampler.batch_size or 1, 1) / 3.0 * _views(self.cfg)
            per_eval, test_seconds = num_val * per_image, num_test * per_image
        return Speeds(step_seconds, per_eval if has_val else 0.0, test_seconds)

    def _plan_to_budget(self, speeds: Speeds | None, has_val: bool, bar=None) -> None:
        """Fit ``train.max_steps`` and ``train.eval_every`` into ``train.time_budget`` (engine/budget.py)."""
        cfg = self.cfg
        if cfg.train.time_budget is None or speeds is None:
            return
        first = self.plan is None
        if self._recipe_schedule is None:  # what the recipe asked for: a plan never trains more
            self._recipe_schedule = (cfg.train.max_steps, cfg.train.eval_every)
        ceiling, interval = self._recipe_schedule
        plan = budget.plan_run(cfg.train.time_budget, self.wall_clock() - self.started, self.step, ceiling, interval,
                               speeds, has_val=has_val, interval=None if first else cfg.train.eval_every)
        plan = distributed.broadcast_object(plan)  # every rank trains the same steps
        changed = (plan.max_steps, plan.eval_every) != (cfg.train.max_steps, cfg.train.eval_every)
        self.plan = plan
        cfg.train.max_steps, cfg.train.eval_every = plan.max_steps, plan.eval_every
        if first or changed:
            self.run.log({"kind": "plan", "step": self.step, "time": self.elapsed, "max_steps": plan.max_steps,
                          "eval_every": plan.eval_every, "predicted_seconds": round(plan.seconds, 1),
                          "step_seconds": speeds.step_seconds, "eval_seconds": speeds.eval_seconds,
                          "test_seconds": speeds.test_seconds})
        if first:
            self.echo(f"time budget: {plan.reason}")
        if bar is not None and bar.total != plan.max_steps:
            bar.total = plan.max_steps
            bar.refresh()

    def val_history(self) -> list[tuple[int, float]]:
        """``(step, validation MAP@R)`` of every validation evaluation logged so far."""
        return [(int(r["step"]), float(r[SELECTION_METRIC])) for r in self.run.read_log()
                if r.get("kind") == "eval" and r.get("split") == "val" and SELECTION_METRIC in r]

    def fit(self) -> TrainResult:
        """Train until the step budget or early stopping, then evaluate the test split once."""
        cfg = self.cfg
        if self.resume:
            state = load_checkpoint(self.run.last_checkpoint)
            self.load_state_dict(state, source=str(self.run.last_checkpoint))
            if self.dist.is_main:
                self.run.truncate_log_after(self.step)
            for stale in self.run.last_checkpoint.parent.glob(".*.pt.*.tmp"):  # writes cut short by a crash
                stale.unlink(missing_ok=True)
            self.echo(f"resumed from step {self.step} ({self.run.last_checkpoint})")
        elif self.dist.is_main:
            weights = getattr(self.model, "pretrained_weights", None)
            if weights is not None:
                self.echo(f"pretrained weights: {weights.tag} from {weights.source} (SHA-256 {weights.sha256[:12]}...)")
            self.run.prepare(cfg, self.splits, device=str(self.device),
                             weights=weights.record() if weights is not None else None)
        distributed.barrier()
        finished = False
        try:
            result = self._train()
            finished = True
            return result
        finally:
            if not finished:  # trackers mark their run failed; a resume continues it
                for callback in self.callbacks:
                    getattr(callback, "close", lambda: None)()

    def _train(self) -> TrainResult:
        """The loop of :meth:`fit`, then :meth:`finish` on rank 0."""
        cfg = self.cfg
        self.hooks.on_train_start(self)
        self.callbacks.call("on_train_start", self)
        has_val = self.splits.val is not None
        self.build_feature_cache()
        batches = self._training_batches()
        stop = self.step >= cfg.train.max_steps
        if has_val and self.step == 0 and selects_by_significance(cfg):
            # the untrained pretrained embedding is a candidate like every checkpoint: training must beat it
            stop = self._timed_validation() or stop
        start_step, start_elapsed = self.step, self.elapsed
        timed = {}  # the training clock after the first (warm-up) step of this session: the speed the plans use

        def speeds() -> Speeds | None:
            if "step" not in timed or self.step <= timed["step"]:
                return None
            return self.measured_speeds((self.elapsed - timed["elapsed"]) / (self.step - timed["step"]), has_val)

        def seconds_left() -> float | None:
            """Training steps, the validations still to come and the test split, at this session's measured speeds."""
            if self.step == start_step:
                return None
            measured = speeds() or self.measured_speeds((self.elapsed - start_elapsed) / (self.step - start_step),
                                                        has_val)
            return budget.seconds_left(self.step, cfg.train.max_steps, cfg.train.eval_every, measured, has_val=has_val)

        bar = _progress(cfg, initial=self.step, seconds_left=seconds_left) if self.dist.is_main else None
        t_last = self.clock()
        running = None
        while not stop:
            indices, images, raw_labels, position = next(batches)
            labels = self.label_map(raw_labels)
            if self.feature_cache is not None:  # a stored view of each image: the frozen stages' output
                g = derive_generator(self.cfg.seed, "feature cache batch", position.epoch, position.batch_in_epoch)
                images = self.feature_cache.features(indices, g)
            elif self.augment is not None:  # seeded by (seed, epoch, batch): resumes replay it exactly
                g = derive_generator(self.cfg.seed, "batch augmentation", position.epoch, position.batch_in_epoch)
                # on a GPU the batch is augmented there (its random numbers still drawn on the CPU from g)
                images = self.augment(device_data.to_device(images, self.device, self._pin), g)
            value = self.training_step(images, labels, indices)
            self.step += 1
            self.position = position
            if (self.step <= start_step + 1 + budget.CALIBRATION_STEPS or self.step >= cfg.train.max_steps
                    or has_val and self.step % cfg.train.eval_every == 0):
                synchronize(self.device)  # the steps the plan times (and the last before a validation) end on the card
            now = self.clock()
            self.elapsed += now - t_last
            t_last = now
            if self.step == start_step + 1:
                timed.update(step=self.step, elapsed=self.elapsed)
            if self.plan is None and self.step == start_step + 1 + budget.CALIBRATION_STEPS:
                self._plan_to_budget(speeds(), has_val, bar)
                if self._cache_after_first_plan():  # steps are faster from here: time them again and re-plan
                    batches = self._training_batches()
                    self.plan, start_step, start_elapsed = None, self.step, self.elapsed
                    timed.clear()
                    t_last = self.clock()  # building the cache is not training time (the budget's clock counts it)
            if math.isfinite(value):
                running = value if running is None else 0.9 * running + 0.1 * value
            lr = self.optimizer.param_groups[0]["lr"]
            if self.step % cfg.train.log_every == 0:
                record = {"kind": "train", "step": self.step, "epoch": self.position.epoch, "time": self.elapsed,
                          "loss": value, "lr": lr}
                if self.scaler is not None:  # fp16: a falling scale means overflowing (skipped) steps
                    record["grad_scale"] = self.scaler.get_scale()
                self.run.log(record)
            self.callbacks.call("on_step_end", self, self.step, {"loss": value, "lr": lr})
            if bar is not None:
                bar.update(1)
                if running is not None:
                    bar.set_postfix(loss=f"{running:.4f}", refresh=False)
            evaluated = False
            if has_val and (self.step % cfg.train.eval_every == 0 or self.step >= cfg.train.max_steps):
                stop = self._timed_validation()
                evaluated = True
                if self.plan is not None and not stop and speeds() is not None:  # re-plan at the speeds measured so far
                    self._plan_to_budget(speeds(), has_val, bar)
                t_last = self.clock()  # evaluation time is not training time
            stop = stop or self.should_stop or self.step >= cfg.train.max_steps
            if self.dist.is_main and (evaluated or stop or self.step % cfg.train.checkpoint_every == 0):
                self.save()
        if bar is not None:
            bar.close()
        self.hooks.on_train_end(self)
        self.stopped_early = self.step < cfg.train.max_steps
        if not self.dist.is_main:  # evaluation and writing happen once, on rank 0
            return TrainResult({}, self.best_step, self.step, "rank 0", self.run.path)
        return self.finish(has_val)

    def _training_batches(self):
        """The batch stream from the current position: labels only once the cache holds the images' features."""
        source = (self.feature_cache.batch_source() if self.feature_cache
                  else device_data.resident_on(self.splits.train, self.device))  # in memory: on a GPU, moved there once
        return builders.iterate_training_batches(source, self.sampler, self.position, self.cfg.data.num_workers,
                                                 pin_memory=self._pin)

    def _cache_after_first_plan(self) -> bool:
        """Under a time budget (``feature_cache=auto``): build the cache when the planned epochs make it pay
        (:func:`~dmlkit.engine.feature_cache.views_for_epochs`); True when it was built."""
        if not (self.cache_deferred and self.cache_plan.enabled) or self.feature_cache is not None:
            return False
        self.cache_deferred = False
        epochs = self.cfg.train.max_steps * (self.cfg.sampler.batch_size or 1) / max(len(self.splits.train), 1)
        self.cache_views = views_for_epochs(epochs, self.cache_plan.views)
        if not self.cache_views:
            self.echo(f"feature cache: not built: the budget buys about {epochs:.1f} epochs, too few for cached views "
                      f"to save more than they cost ({EPOCHS_PER_VIEW} epochs a view, at least {MIN_VIEWS} views)")
            return False
        self.build_feature_cache()
        return True

    def build_feature_cache(self) -> None:
        """Run the frozen stages once on the cached views (``train.feature_cache``); steps then start from them."""
        if not self.cache_views or self.feature_cache is not None:
            return
        self.feature_cache = FrozenFeatureCache.build(
            self.model, self.splits.train, self.augment, views=self.cache_views, seed=self.cfg.seed,
            autocast_dtype=self.autocast_dtype, echo=self.echo,
            progress=bool(self.cfg.train.progress and self.dist.is_main))
        self.train_forward = self.model.forward_from_prefix

    def finish(self, has_val: bool) -> TrainResult:
        """Load the selected weights, evaluate the test split once, write the results."""
        kept_pretrained = None
        if has_val and self.run.best_checkpoint.exists():
            best = load_checkpoint(self.run.best_checkpoint)
            self.model.load_state_dict(best["model"])
            self.objective.load_state_dict(best["objective"])
            selected_on = "val"
            if selects_by_significance(self.cfg):
                kept_pretrained = self.best_step == 0
                self.echo(_selection_message(self.val_history(), self.best_step))
        else:
            save_checkpoint(self.run.best_checkpoint, self.weights_state())
            self.best_step = self.step
            selected_on = "last"
        clustering = self.cfg.eval.clustering
        # In-Shop style (query_gallery): queries retrieve from a separate gallery, saved as "gallery"
        if getattr(self.splits, "eval_mode", "leave_one_out") == "query_gallery":
            embedded = {"test": self.splits.query, "gallery": self.splits.gallery}
        else:
            embedded = {"test": self.splits.test} if self.splits.test is not None else {}  # objects: test optional
        progress = bool(self.cfg.train.progress and self.dist.is_main)  # the test split: a bar with its own ETA
        embedded = {split: (dataset, *self.embed(dataset, progress)) for split, dataset in embedded.items()}
        reference = embedded["gallery"][1:] if "gallery" in embedded else None
        own = own_rows(self.splits) if reference is not None else None
        metrics = self.score(*embedded["test"][1:], clustering=clustering, reference=reference,
                             own_reference=own) if embedded else {}
        metrics = _floats(metrics)
        result = dict(metrics)
        categories = getattr(self.splits, "categories", None)
        if embedded and categories is not None:  # a CSV 'category' column: each category's queries, whole gallery
            result["per_category"] = per_category_metrics(*embedded["test"][1:], categories, reference, own,
                                                          self.cfg.eval.ks, self.cfg.eval.backend)
        result.update(selected_on=selected_on, best_step=self.best_step, steps=self.step,
                      train_seconds=round(self.elapsed, 3))
        if kept_pretrained is not None:
            result["kept_pretrained"] = kept_pretrained
        if embedded:
            self.run.log({"kind": "eval", "split": "test", "step": self.step, "time": self.elapsed, **metrics})
        # data.skip_bad_images: files found unreadable while reading per item (in this process; see ImageFileDataset)
        skipped = self.run.record_skipped_images(self.splits.skipped_per_item(), self.step)
        if skipped:
            self.echo(f"skipped {len(skipped)} unreadable image(s) read per item; listed in manifest.json and log.jsonl")
        atomic_write_json(self.run.path / "metrics.json", result)
        if self.cfg.eval.save_embeddings:  # the embeddings just scored, not a second pass
            for split, (dataset, embeddings, labels) in embedded.items():
                self.run.save_embeddings(split, embeddings, labels, dataset, self.objective, self.cfg)
        result = TrainResult(metrics, self.best_step, self.step, selected_on, self.run.path,
                             val_history=self.val_history())
        self.callbacks.call("on_fit_end", self, result)
        return result


def per_category_metrics(embeddings: torch.Tensor, labels: torch.Tensor, categories: list[str],
                         reference: tuple[torch.Tensor, torch.Tensor] | None, own: torch.Tensor | None,
                         ks, backend: str) -> dict[str, dict]:
    """``metrics.json``'s ``per_category``: retrieval metrics of each category's queries against the whole
    gallery (``reference``; None: leave-one-out over the split)."""
    from dmlkit.evaluation import retrieval_metrics_per_group

    gallery, gallery_labels = reference if reference is not None else (None, None)
    per_group = retrieval_metrics_per_group(embeddings, labels, categories, reference=gallery,
                                            reference_labels=gallery_labels, ks=tuple(ks), backend=backend,
                                            own_reference=own)
    return {name: _floats(values) for name, values in per_group.items()}


def own_rows(splits) -> torch.Tensor | None:
    """The gallery row that is each query itself (same image path; -1: none), for a query/gallery split
    whose rows may be both (a CSV with ``is_query``/``is_gallery``); None when the splits have no paths."""
    from dmlkit.evaluation import own_reference_rows

    query, gallery = splits.query, splits.gallery
    if getattr(query, "paths", None) is None or getattr(gallery, "paths", None) is None:
        return None
    return own_reference_rows(query.paths, gallery.paths)


#: A fine-tuned checkpoint replaces the pretrained embedding only when its validation MAP@R gain, paired
#: per query, exceeds this many standard errors (a one-sided test at about 2 %): with few validation
#: classes a gain of a few thousandths is noise, and keeping it would make the run worse than the backbone.
SIGNIFICANT_ERRORS = 2.0


def _selection_message(history: list[tuple[int, float]], best_step: int) -> str:
    """What the run kept: the pretrained embedding (best at step 0) or a fine-tuned checkpoint."""
    scores = dict(history)
    start, best = scores.get(0), scores.get(best_step)
    if best_step == 0:
        last_step, last = max(history) if history else (0, start)
        return (f"kept the pretrained embedding: no fine-tuned checkpoint beat its validation MAP@R {start:.4f} "
                f"by more than {SIGNIFICANT_ERRORS:g} standard errors (step {last_step}: {last:.4f}); training did "
                "not help on the held-out classes")
    gain = "" if start is None else f", against {start:.4f} for the pretrained embedding at step 0"
    return f"kept the fine-tuned checkpoint of step {best_step}: validation MAP@R {best:.4f}{gain}"


def _views(cfg: RunConfig) -> int:
    """Forward passes per embedded image: the mirror (``model.flip_average``) and the shifts (``model.shift_average``)."""
    shifts = (2 * (cfg.model.shift_average or 0) + 1) ** 2
    return (2 if cfg.model.flip_average else 1) * shifts


def _floats(metrics: dict) -> dict:
    out = {}
    for k, v in metrics.items():
        if isinstance(v, (int, float, np.floating, np.integer)) and not isinstance(v, bool):
            out[k] = float(v) if not isinstance(v, (int, np.integer)) else int(v)
    return out


def _progress(cfg: RunConfig, initial: int, seconds_left: Callable[[], float | None] | None = None):
    """The training bar; its remaining time is ``seconds_left()`` (steps and validations to come) when known."""
    if not cfg.train.progress:
        return None
    from tqdm.auto import tqdm

    class TrainingBar(tqdm):
        @property
        def format_dict(self):
            d = super().format_dict
            left = seconds_left() if seconds_left is not None else None
            if left and d.get("total") and d["total"] > d["n"]:  # the rate that makes tqdm show this remaining time
                d["rate"] = (d["total"] - d["n"]) / left
            return d

    return TrainingBar(total=cfg.train.max_steps, initial=initial, desc="train", unit="step", dynamic_ncols=True,
                       leave=True)


def format_metrics_table(metrics: dict[str, Any], keys: list[str] | None = None) -> str:
    """A two-column text table of metrics."""
    keys = keys or [k for k in metrics if isinstance(metrics[k], float)]
    width = max(len(k) for k in keys)
    lines = [f"{'metric'.ljust(width)}  value", f"{'-' * width}  ------"]
    lines += [f"{k.ljust(width)}  {metrics[k]:.4f}" for k in keys if k in metrics]
    return "\n".join(lines)
