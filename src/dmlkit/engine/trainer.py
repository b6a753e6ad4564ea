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

The trainer builds nothing: it receives a :class:`~dmlkit.engine.resolve.ResolvedRun`
(:func:`~dmlkit.engine.resolve.resolve_run`). This module is the loop; its other rooms are
``engine/training/``: checkpointing and resume, validation and selection, the schedule and the step timings.
Decisions that watch the run (the time budget, the step capture's ``auto``) are callbacks the recipe attaches.
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from dmlkit.config.schema import RunConfig, selects_by_significance
from dmlkit.core.json_files import read_json
from dmlkit.core.messages import SILENT, Messages, messages
from dmlkit.core.seeds import derive_generator
from dmlkit.engine import device_data, distributed
from dmlkit.engine.batches import BatchPosition, iterate_training_batches
from dmlkit.engine.callbacks import Callback, CallbackList
from dmlkit.engine.checkpoint_files import atomic_write_json
from dmlkit.engine.frozen_stage_cache import FrozenFeatureCache
from dmlkit.engine.resolve import SUMMARY_FILE, ResolvedRun
from dmlkit.engine.run_dir import RunDirectory
from dmlkit.engine.run_layout import TRAINING_RECORD_FILE
from dmlkit.engine.timing import synchronize
from dmlkit.engine.training.resume import CheckpointingMixin
from dmlkit.engine.training.schedule import Plan, TrainingSchedule
from dmlkit.engine.training.selection import (  # noqa: F401 - re-exported: the trainer's public names
    SELECTION_METRIC,
    SIGNIFICANT_ERRORS,
    SelectionMixin,
    TrainResult,
    _floats,
    own_rows,
    paired_gain,
    per_category_metrics,
)
from dmlkit.engine.training.step_capture import CaptureDecision, CapturedStep
from dmlkit.engine.training.step_checks import DeviceStepChecks, checks_stay_on_device
from dmlkit.engine.training.step_timing import StepTiming
from dmlkit.exceptions import NonFiniteError, RecordError
from dmlkit.methods.hooks import MethodHooks, overrides_hook

log = logging.getLogger(__name__)


class _OfTheRun:
    """A trainer attribute that is a part of its resolved run (``trainer.resolved.<field>``), read, never copied or
    written: the trainer holds the run it was given."""

    def __init__(self, field: str | None = None):
        self.field = field

    def __set_name__(self, owner: type, name: str) -> None:
        self.field = self.field or name

    def __get__(self, trainer: Any, owner: type | None = None) -> Any:
        return self if trainer is None else getattr(trainer.resolved, self.field)

    def __set__(self, trainer: Any, value: Any) -> None:
        raise AttributeError(f"Trainer.{self.field} is the resolved run's (trainer.resolved.{self.field}): the trainer "
                             "never replaces a part of its run; build the trainer from a run that holds another one.")


class Trainer(CheckpointingMixin, SelectionMixin):
    """Trains a resolved run into ``run_dir``; ``resume=True`` continues from ``run_dir``'s last checkpoint.

    ``resolved``: a :class:`~dmlkit.engine.resolve.ResolvedRun` (:func:`~dmlkit.engine.resolve.resolve_run`
    made every part: data, model, objective, optimiser, ...); :class:`dmlkit.recipe.Trainer` also takes a
    :class:`RunConfig`, planned and built first (``Trainer(cfg, run_dir, **objects)``).
    ``callbacks`` (:class:`~dmlkit.engine.callbacks.Callback`) run at the loop's events after the
    config's own (``train.patience``, ``train.loggers``), then those the plan attached (``resolved.plan_callbacks``:
    the time budget, the step capture's decision). The trainer offers mechanisms (follow a schedule, build the
    feature cache, start a capture, time its steps); what watches the run and decides is such a callback.
    ``evaluate_test=False``: the run ends after training and selection, without the test split (a sweep's trial).
    Messages go to this module's logger (``dmlkit.core.messages``), or every one to ``echo`` when given.
    """

    # the resolved run's parts, by the names methods, callbacks and tests read (``trainer.model``, ``trainer.cfg``)
    cfg = _OfTheRun()  # the finished config: read, never written
    device, dist = _OfTheRun(), _OfTheRun()
    splits, recipe, label_map = _OfTheRun(), _OfTheRun(), _OfTheRun()
    model, objective, optimizer, scheduler, sampler = _OfTheRun(), _OfTheRun(), _OfTheRun(), _OfTheRun(), _OfTheRun()
    member_folds = _OfTheRun()  # protocol.member_folds: each member validates on its own fold
    augment, autocast_dtype = _OfTheRun(), _OfTheRun()
    scaler = _OfTheRun()  # fp16 only: gradients underflow without loss scaling
    forward_model = _OfTheRun()  # DDP-wrapped under torchrun, compiled with train.compile
    fingerprint = _OfTheRun()
    _channels_last = _OfTheRun("channels_last")  # conv models on a GPU

    @property
    def autocast_device(self) -> str:
        return self.device.type

    @property
    def _to_device(self) -> bool:
        """Batches arrive on the CPU: anything else moves them."""
        return self.device.type != "cpu"

    def __init__(
        self,
        resolved: ResolvedRun,
        run_dir: str | Path,
        *,
        resume: bool = False,
        hooks: MethodHooks | None = None,
        echo: Callable[[str], None] | None = None,
        callbacks: Iterable[Callback] = (),
        evaluate_test: bool = True,
    ):
        if not isinstance(resolved, ResolvedRun):
            raise TypeError(f"The engine's Trainer trains a resolved run (dmlkit.recipe.prepare_run(cfg, ...)), not a "
                            f"{type(resolved).__name__}; dmlkit.Trainer (dmlkit.recipe.Trainer) also takes a config, "
                            "planned and built first.")
        # every part of the run, read where it is held (the attributes below that name a part are the run's own)
        run = self.resolved = resolved
        self.echo = echo if self.dist.is_main else SILENT
        self.run_dir = RunDirectory(run_dir)  # the run folder (its files and its log)
        if not self.dist.is_main:  # files are written once, by rank 0 (hooks log through self.run_dir too)
            self.run_dir.log = lambda record: None
        self.resume = resume
        self.evaluate_test = evaluate_test  # False: no test split at the end (a sweep's trial)
        self._pin = self.device.type == "cuda"  # page-locked host batches copy to the GPU asynchronously
        self.position = BatchPosition()
        self.step = 0
        self.best_score = -math.inf
        self.best_step = 0
        self.evals_since_best = 0
        self.stopped_early = False
        self.should_stop = False  # a callback sets it to end training after the current step
        self.elapsed = 0.0
        self.eval_seconds: list[float] = []  # wall time of each validation this session (the progress bar's ETA)
        self.clock: Callable[[], float] = time.perf_counter  # the training clock (a benchmark may use process_time)
        self.hooks = hooks if hooks is not None else run.method_hooks(self)  # a method's hooks see the trainer
        self.callbacks = CallbackList([*run.early_stopping, *callbacks, *run.loggers, *run.plan_callbacks])
        self.run_dir.listeners.append(lambda record: self.callbacks.call("on_log", self, record))
        # a fused optimiser skips a non-finite step on an accelerator: no host read per step (step_checks.py)
        self.step_checks = (DeviceStepChecks(self.device, stop=self.cfg.train.on_nonfinite == "stop")
                            if self.scaler is None and checks_stay_on_device(self.optimizer, self.device) else None)
        self.train_forward = self.forward_model  # the training steps' forward (the rest of the model, from the cache)
        # train.step_capture: forward, loss and backward compiled (CUDA graphs on a card); auto decides after timing
        self.step_capture = run.step_capture or CaptureDecision("off", "not resolved")
        # what this run did beyond what was resolved (training.json): resolved.json stays the resolution
        self.training_record: dict[str, Any] = {}
        if self.step_capture.mode != "off" and overrides_hook(self.hooks, "on_batch_embeddings"):
            self.capture_from_here(CaptureDecision("off", "the given hooks read each batch's embeddings on the host"))
        self.captured_step: CapturedStep | None = None
        if self.step_capture.mode == "compile":
            self.start_capture(self.step_capture)
        self.cache_deferred = run.cache_deferred  # auto under a time budget: the time budget decides after its first plan
        self.cache_views = 0 if self.cache_deferred or not run.cache_plan.enabled else run.cache_plan.views
        self.feature_cache: FrozenFeatureCache | None = None  # built by _train (again on resume: deterministic)
        self.pretrained_val_ap: torch.Tensor | None = None  # per-query validation AP@R of the untrained embedding
        self.reference_val_ap: torch.Tensor | None = None  # ... of the last significant gain (the stopping rule)
        self.last_eval_improved = False  # the last validation counted as progress (EarlyStopping reads it)
        # the steps and validation interval while training: the time budget re-plans them, not the config
        self.schedule = TrainingSchedule.from_config(self.cfg)
        self.scheduler.follow(self.schedule.horizon)  # the learning rate decays over the planned steps
        self.timing = StepTiming()  # the steps timed this session (on_steps_timed)
        # the progress bar's remaining time in seconds (a callback that predicts it sets it), else the bar's own
        self.remaining_seconds: Callable[[], float | None] | None = None
        self._bar = None
        self._batches = None
        self._best_state: dict | None = None

    # ------------------------------------------------------------------ loop

    def training_step(self, images: torch.Tensor, labels: torch.Tensor, indices: list[int] | None = None
                      ) -> torch.Tensor:
        """One optimisation step; returns the loss as a detached 0-dim tensor (NaN when a non-finite step was skipped).

        Reading the returned value (``float(...)``) waits for the device; the loop reads it only every
        ``train.log_every`` steps. When the optimiser skips updates on the device (PyTorch's fused
        Adam/AdamW/SGD, what a CUDA run uses) and no fp16 scaler is in play, the step's finite check
        (loss and gradient norm) stays on the device too (:mod:`~dmlkit.engine.training.step_checks`):
        no host synchronisation at all, and a non-finite step is reported (``skip``) or raised
        (``stop``) at the next read (:meth:`read_step_checks`). Otherwise loss and gradient norm are
        read together, once, before the update. Beyond a hand-written loop the engine adds one fused
        norm over all gradients (their finite check, and the clipping norm when ``grad_clip`` is set).

        With ``mixed_precision=fp16`` the loss is read before its scaled backward and the gradients are
        unscaled right after it (and the proxy all-reduce), so the method hook, the finite check
        and clipping all see true gradients. A non-finite gradient found by that unscale is an
        fp16 overflow: the scaler skips the update and lowers its scale, the step is not a
        non-finite stop (``on_nonfinite`` does not apply) and the loss value is returned. A
        non-finite loss, or a gradient made non-finite after the unscale (by a hook), is still
        handled by ``on_nonfinite``.
        """
        if not self.model.training:  # evaluation puts it back; the check saves a walk over every module
            self.model.train()
        loss = self._batch_loss(images, labels, indices)
        if self.scaler is not None:
            return self._scaled_step(loss)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.dist.enabled:
            distributed.allreduce_gradients_(self.objective.parameters())  # proxies: DDP wraps only the model
        self.hooks.after_backward(self)
        total = self._gradient_norm()
        if self.step_checks is not None:  # the update is skipped on the device when the step is not finite
            self.optimizer.found_inf = self.step_checks.queue(loss, total)
            try:
                self.optimizer.step()
            finally:
                del self.optimizer.found_inf
        else:
            value, norm = torch.stack([loss.detach().float(), total]).tolist()  # one read for both checks
            if not math.isfinite(value):
                return self._non_finite("loss", value)
            if not math.isfinite(norm):
                return self._non_finite("gradient norm", norm)
            self.optimizer.step()
        self.scheduler.step()
        return self._kept(loss)

    def _kept(self, loss: torch.Tensor) -> torch.Tensor:
        """The step's loss as the loop keeps it (a copy when captured: a graph replay reuses its output's memory)."""
        return loss.detach() if self.captured_step is None else self.captured_step.detached(loss)

    def _embed(self, images: torch.Tensor) -> torch.Tensor:
        """The training forward, under autocast when the run has one."""
        if self.autocast_dtype is None:
            return self.train_forward(images)
        with torch.autocast(self.autocast_device, dtype=self.autocast_dtype):
            return self.train_forward(images)

    def _forward_loss(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The objective on one process's batch: what ``train.step_capture`` compiles."""
        return self.objective(self._embed(images), labels)

    def _batch_loss(self, images: torch.Tensor, labels: torch.Tensor, indices: list[int] | None) -> torch.Tensor:
        """The objective on the batch's embeddings (batch on the device, autocast, all-gather, method hook)."""
        if self._to_device:  # (images already on the card stay: an in-memory split augmented there)
            images = device_data.to_device(images, self.device, self._pin)
            labels = device_data.to_device(labels, self.device, self._pin)
        if self._channels_last and images.dim() == 4:
            images = images.contiguous(memory_format=torch.channels_last)
        if self.captured_step is not None:  # one process, no hooks on the embeddings (plan_step_capture)
            return self.captured_step(images, labels)
        embeddings = self._embed(images)
        if self.dist.enabled:
            embeddings = distributed.all_gather_with_grad(embeddings)  # global batch [W*b, D]; local rows keep grad
            labels = distributed.all_gather_labels(labels)
        if indices is not None and overrides_hook(self.hooks, "on_batch_embeddings"):
            if self.dist.enabled:
                indices = distributed.all_gather_labels(torch.as_tensor(indices)).tolist()
            self.hooks.on_batch_embeddings(self, indices, embeddings.detach())
        return self.objective(embeddings, labels)

    def _scaled_step(self, loss: torch.Tensor) -> torch.Tensor:
        """fp16: the loss read first, its scaled backward, the unscale, then the scaler's step."""
        value = loss.item()
        if not math.isfinite(value):
            return self._non_finite("loss", value)
        scaler = self.scaler
        self.optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        if self.dist.enabled:
            distributed.allreduce_gradients_(self.objective.parameters())
        scaler.unscale_(self.optimizer)  # records whether the scaled backward overflowed
        self.hooks.after_backward(self)
        total = float(self._gradient_norm())
        if not math.isfinite(total):
            if self._scaler_backed_off():
                return self._skip_step(value)
            return self._non_finite("gradient norm", total)
        scaler.step(self.optimizer)
        scaler.update()
        self.scheduler.step()
        return self._kept(loss)

    def read_step_checks(self, loss: torch.Tensor) -> float:
        """``loss``'s value, after the device's pending finite checks are read (one host synchronisation).

        Skipped steps are reported (``train.on_nonfinite=skip``); a non-finite step under ``stop``
        raises :class:`~dmlkit.exceptions.NonFiniteError` naming it (every update from it on was skipped).
        """
        if self.step_checks is None:
            return float(loss)
        value, skipped = self.step_checks.read(loss)
        if skipped and self.step_checks.stop:
            first = self.step - skipped + 1
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteError(
                f"Non-finite loss or gradient norm at step {first}; training stopped, weights were not updated "
                f"from step {first} on; {self._last_good_checkpoint()}. "
                "Lower optimizer.lr, set optimizer.grad_clip, or set train.on_nonfinite=skip."
            )
        if skipped:
            self.echo.warning(f"warning: steps up to {self.step}: {skipped} non-finite step(s) skipped since the last log record")
        return value

    def _settle_step_checks(self, loss: torch.Tensor) -> None:
        """Read the device's finite checks when steps were queued since the last read (else nothing to wait for)."""
        if self.step_checks is not None and self.step_checks.queued:
            self.read_step_checks(loss)

    def _scaler_backed_off(self) -> bool:
        """Close the scaler's iteration after a non-finite gradient; True when it was an fp16 overflow.

        ``update()`` lowers the scale exactly when ``unscale_`` found inf/NaN in the scaled
        gradients; otherwise the non-finite value appeared later (a hook) and is a real problem.
        """
        before = self.scaler.get_scale()
        self.scaler.update()
        return self.scaler.get_scale() < before

    def _skip_step(self, value: float) -> torch.Tensor:
        """No update this step, but the schedule advances (it stays aligned with the step count)."""
        self.optimizer.zero_grad(set_to_none=True)
        with warnings.catch_warnings():  # a skipped step on purpose: no optimiser step before this scheduler step
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")
            self.scheduler.step()
        return torch.tensor(value)

    def _gradient_norm(self) -> torch.Tensor:
        """Total L2 norm of every gradient in one fused pass; clips to ``optimizer.grad_clip`` when set.

        The norm is the finite check: a NaN or infinite gradient anywhere makes it non-finite.
        """
        params = [p for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]
        if not params:
            return torch.zeros((), device=self.device)
        clip = self.cfg.optimizer.grad_clip
        if clip is not None:
            return torch.nn.utils.clip_grad_norm_(params, clip)
        return torch.nn.utils.get_total_norm([p.grad for p in params])  # the norm clipping would use, no clip

    def _non_finite(self, what: str, value: float) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        if self.cfg.train.on_nonfinite == "skip":
            self.echo.warning(f"warning: step {self.step + 1}: non-finite {what} ({value}); step skipped")
            return self._skip_step(float("nan"))
        raise NonFiniteError(
            f"Non-finite {what} ({value}) at step {self.step + 1}; training stopped, weights were not updated; "
            f"{self._last_good_checkpoint()}. Lower optimizer.lr, set optimizer.grad_clip, or set train.on_nonfinite=skip."
        )

    def _last_good_checkpoint(self) -> str:
        last = self.run_dir.last_checkpoint
        return f"the last good checkpoint is {last}" if last.exists() else "no checkpoint was written yet"

    @property
    def echo(self) -> Messages:
        """Where the run's messages go (:class:`dmlkit.core.messages.Messages`); a callable assigned takes every one."""
        return self._echo

    @echo.setter
    def echo(self, echo: Callable[[str], None] | Messages | None) -> None:
        self._echo = messages(echo, log)

    def fit(self) -> TrainResult:
        """Train until the step budget or early stopping, then evaluate the test split once."""
        cfg = self.cfg
        if self.resume:
            self.restore_last()  # engine/training/resume.py
        elif self.dist.is_main:
            weights = getattr(self.model, "pretrained_weights", None)
            if weights is not None:
                self.echo(f"pretrained weights: {weights.tag} from {weights.source} (SHA-256 {weights.sha256[:12]}...)")
            self.run_dir.prepare(cfg, self.splits, device=str(self.device),
                             weights=weights.record() if weights is not None else None)
            atomic_write_json(self.run_dir.path / SUMMARY_FILE, self.resolved.summary())  # beside config.yaml, once
            if self.training_record:
                self.write_training_record()
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

    def capture_from_here(self, decision: CaptureDecision) -> None:
        """Train with ``decision`` (``train.step_capture``) from the next step on, recorded in the training record's
        choices (``training.json``) beside what was resolved."""
        self.start_capture(decision)
        self.training_record.setdefault("choices", {})["train.step_capture"] = {
            "value": self.cfg.train.step_capture, "reason": decision.describe()}

    def write_training_record(self) -> None:
        """``training.json``: what the run did while training (:attr:`training_record`), kept with an earlier
        session's (a resumed run)."""
        path = self.run_dir.path / TRAINING_RECORD_FILE
        try:
            earlier = read_json(path) if path.is_file() else {}
        except (OSError, RecordError):
            earlier = {}
        choices = {**earlier.get("choices", {}), **self.training_record.get("choices", {})}
        atomic_write_json(path, {**earlier, **self.training_record, **({"choices": choices} if choices else {})})

    def _train(self) -> TrainResult:
        """The loop of :meth:`fit`, then :meth:`finish` on rank 0."""
        cfg = self.cfg
        self.hooks.on_train_start(self)
        self.callbacks.call("on_train_start", self)
        has_val = self.splits.val is not None
        self.cache_frozen_features()
        self._batches = self._training_batches()
        schedule = self.schedule
        stop = schedule.finished(self.step)
        if has_val and self.step == 0 and selects_by_significance(cfg):
            # the untrained pretrained embedding is a candidate like every checkpoint: training must beat it
            stop = self._timed_validation() or stop
        self.timing.restart(self.step, self.elapsed, self.clock())
        self._bar = _progress(cfg, schedule.max_steps, self.step, self._seconds_left) if self.dist.is_main else None
        bar = self._bar
        self.timing.pause(self.clock())
        running = None
        while not stop:
            indices, images, raw_labels, position = next(self._batches)
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
            if (self.timing.calibrating(self.step) or schedule.finished(self.step)
                    or has_val and schedule.validates_after(self.step)):
                synchronize(self.device)  # the steps timed (and the last before a validation) end on the card
            self.elapsed += self.timing.lap(self.clock())
            self.timing.observe(self.step, self.elapsed)
            if self.timing.calibrated(self.step):  # the plans attached (time budget, step capture) read the speed
                self.callbacks.call("on_steps_timed", self, self.step, self.timing.step_seconds(self.step, self.elapsed))
            lr = self.optimizer.param_groups[0]["lr"]
            if self.step % cfg.train.log_every == 0:  # the loss is read here only: one host synchronisation
                loss_value = self.read_step_checks(value)
                record = {"kind": "train", "step": self.step, "epoch": self.position.epoch, "time": self.elapsed,
                          "loss": loss_value, "lr": lr}
                if self.scaler is not None:  # fp16: a falling scale means overflowing (skipped) steps
                    record["grad_scale"] = self.scaler.get_scale()
                self.run_dir.log(record)
                if math.isfinite(loss_value):  # the bar's running loss: over the logged steps
                    running = loss_value if running is None else 0.9 * running + 0.1 * loss_value
                    if bar is not None:
                        bar.set_postfix(loss=f"{running:.4f}", refresh=False)
            self.callbacks.call("on_step_end", self, self.step, {"loss": value, "lr": lr})
            if bar is not None:
                bar.update(1)
            evaluated = False
            if has_val and schedule.validates_after(self.step):
                self._settle_step_checks(value)  # a non-finite step stops before it is validated
                stop = self._timed_validation()
                evaluated = True
                if not stop:  # the time budget re-plans at the speeds measured so far
                    self.callbacks.call("on_validation_timed", self, self.step)
                self.timing.pause(self.clock())  # evaluation time is not training time
            stop = stop or self.should_stop or schedule.finished(self.step)
            if stop or self.step % cfg.train.checkpoint_every == 0:
                self._settle_step_checks(value)  # nothing non-finite goes into a checkpoint or ends training unseen
            if self.dist.is_main and (evaluated or stop or self.step % cfg.train.checkpoint_every == 0):
                self.save()
        if bar is not None:
            bar.close()
        self._bar = None
        self.hooks.on_train_end(self)
        self.stopped_early = not schedule.finished(self.step)
        if not self.dist.is_main:  # evaluation and writing happen once, on rank 0
            return TrainResult({}, self.best_step, self.step, "rank 0", self.run_dir.path)
        return self.finish(has_val)

    # ------------------------------------------------------------------ mechanisms the attached plans call

    def _seconds_left(self) -> float | None:
        """The progress bar's remaining time: what :attr:`remaining_seconds` predicts, else None (the bar's own)."""
        return self.remaining_seconds() if self.remaining_seconds is not None else None

    def follow(self, plan: Plan) -> bool:
        """Train to ``plan``'s steps and validation interval from here (the progress bar's total too); True when
        they differ from the schedule's before."""
        changed = self.schedule.follow(plan)
        if self._bar is not None and self._bar.total != plan.max_steps:
            self._bar.total = plan.max_steps
            self._bar.refresh()
        return changed

    def time_steps_again(self) -> None:
        """The steps run another way from here (a feature cache built, the step captured): the batch stream starts
        again from the current position, the schedule's plan (made at the old speed) waits for new timings, and the
        next steps are timed anew (``on_steps_timed``); the time since the last step is not training time."""
        self._batches = self._training_batches()
        self.schedule.plan = None
        self.timing.restart(self.step, self.elapsed, self.clock())

    def cache_frozen_features(self, views: int | None = None,
                              out_of_time: Callable[[float], bool] | None = None) -> None:
        """Run the frozen stages once on ``views`` augmented views of every training image (``train.feature_cache``;
        None: the views the run holds, :attr:`cache_views`); the training steps then start from them.
        ``out_of_time(seconds of the next view)``: asked after each view; True keeps the views built so far
        (:attr:`cache_views` says how many)."""
        if views is not None:
            self.cache_views = views
        if not self.cache_views or self.feature_cache is not None:
            return
        self.feature_cache = FrozenFeatureCache.build(
            self.model, self.splits.train, self.augment, views=self.cache_views, seed=self.cfg.seed,
            autocast_dtype=self.autocast_dtype, echo=self.echo,
            progress=bool(self.cfg.train.progress and self.dist.is_main), out_of_time=out_of_time)
        self.cache_views = self.feature_cache.views
        self.train_forward = self.model.forward_from_prefix

    def start_capture(self, decision: CaptureDecision) -> None:
        """Take ``decision`` (``train.step_capture``) from the next step on: ``compile`` captures, else eager."""
        self.step_capture = decision
        self.captured_step = CapturedStep(self._forward_loss, self.device) if decision.mode == "compile" else None

    def _training_batches(self):
        """The batch stream from the current position: labels only once the cache holds the images' features."""
        source = (self.feature_cache.batch_source() if self.feature_cache
                  else device_data.resident_on(self.splits.train, self.device))  # in memory: on a GPU, moved there once
        return iterate_training_batches(source, self.sampler, self.position, self.cfg.data.num_workers,
                                        pin_memory=self._pin)


def _progress(cfg: RunConfig, total: int, initial: int, seconds_left: Callable[[], float | None] | None = None):
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

    return TrainingBar(total=total, initial=initial, desc="train", unit="step", dynamic_ncols=True,
                       leave=True)


def format_metrics_table(metrics: dict[str, Any], keys: list[str] | None = None) -> str:
    """A two-column text table of metrics."""
    keys = keys or [k for k in metrics if isinstance(metrics[k], float)]
    width = max(len(k) for k in keys)
    lines = [f"{'metric'.ljust(width)}  value", f"{'-' * width}  ------"]
    lines += [f"{k.ljust(width)}  {metrics[k]:.4f}" for k in keys if k in metrics]
    return "\n".join(lines)
