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
``engine/training/``: checkpointing and resume, validation and selection, the time budget.
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from dmlkit._json_files import read_json
from dmlkit._messages import SILENT, Messages, messages
from dmlkit.config.schema import RunConfig, selects_by_significance
from dmlkit.engine import budget_planner as budget
from dmlkit.engine import device_data, distributed
from dmlkit.engine.batches import BatchPosition, iterate_training_batches
from dmlkit.engine.budget_planner import Speeds
from dmlkit.engine.callbacks import Callback, CallbackList
from dmlkit.engine.checkpoint_files import atomic_write_json
from dmlkit.engine.frozen_stage_cache import FrozenFeatureCache
from dmlkit.engine.plan_records import SEAL_KEY, seal
from dmlkit.engine.resolve import SUMMARY_FILE, ResolvedRun
from dmlkit.engine.run_dir import RunDirectory
from dmlkit.engine.run_layout import TRAINING_RECORD_FILE
from dmlkit.engine.timing import synchronize
from dmlkit.engine.training.resume import CheckpointingMixin
from dmlkit.engine.training.schedule import TrainingSchedule
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
from dmlkit.engine.training.step_capture import CaptureDecision, CapturedStep, worth_capturing
from dmlkit.engine.training.step_checks import DeviceStepChecks, checks_stay_on_device
from dmlkit.engine.training.time_budget import TimeBudgetMixin
from dmlkit.exceptions import NonFiniteError, RecordError
from dmlkit.methods.hooks import MethodHooks, overrides_hook
from dmlkit.seeds import derive_generator

log = logging.getLogger(__name__)


class Trainer(CheckpointingMixin, SelectionMixin, TimeBudgetMixin):
    """Trains a resolved run into ``run_dir``; ``resume=True`` continues from ``run_dir``'s last checkpoint.

    ``resolved``: a :class:`~dmlkit.engine.resolve.ResolvedRun` (:func:`~dmlkit.engine.resolve.resolve_run`
    made every part: data, model, objective, optimiser, ...); :class:`dmlkit.recipe.Trainer` also takes a
    :class:`RunConfig`, planned and built first (``Trainer(cfg, run_dir, **objects)``).
    ``callbacks`` (:class:`~dmlkit.engine.callbacks.Callback`) run at the loop's events after the
    config's own (``train.patience``, ``train.loggers``). ``evaluate_test=False``: the run ends after
    training and selection, without the test split (a sweep's trial). Messages go to this module's logger
    (``dmlkit._messages``), or every one to ``echo`` when given.
    """

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
        run = self.resolved = resolved  # every part of the run (self.run is its directory)
        self.cfg = run.cfg
        self.wall_clock: Callable[[], float] = time.perf_counter  # the time budget's clock (train.time_budget)
        self.started = run.started  # ... counting from the start of the run's resolution
        self.device, self.dist = run.device, run.dist
        self.echo = echo if self.dist.is_main else SILENT
        self.run = RunDirectory(run_dir)
        if not self.dist.is_main:  # files are written once, by rank 0 (hooks log through self.run too)
            self.run.log = lambda record: None
        self.resume = resume
        self.evaluate_test = evaluate_test  # False: no test split at the end (a sweep's trial)
        self.splits, self.recipe, self.label_map = run.splits, run.recipe, run.label_map
        self.model, self._channels_last = run.model, run.channels_last  # channels_last: conv models on a GPU
        self.objective, self.optimizer, self.scheduler = run.objective, run.optimizer, run.scheduler
        self._to_device = self.device.type != "cpu"  # batches arrive on the CPU
        self._pin = self.device.type == "cuda"  # page-locked host batches copy to the GPU asynchronously
        self.sampler = run.sampler
        self.member_folds = run.member_folds  # protocol.member_folds: each member validates on its own fold
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
        self.callbacks = CallbackList([*run.early_stopping, *callbacks, *run.loggers])
        self.run.listeners.append(lambda record: self.callbacks.call("on_log", self, record))
        self.augment = run.augment
        self.autocast_dtype = run.autocast_dtype
        self.autocast_device = self.device.type
        self.scaler = run.scaler  # fp16 only: gradients underflow without loss scaling
        # a fused optimiser skips a non-finite step on an accelerator: no host read per step (step_checks.py)
        self.step_checks = (DeviceStepChecks(self.device, stop=self.cfg.train.on_nonfinite == "stop")
                            if self.scaler is None and checks_stay_on_device(self.optimizer, self.device) else None)
        self.forward_model = run.forward_model  # DDP-wrapped under torchrun, compiled with train.compile
        self.train_forward = self.forward_model  # the training steps' forward (the rest of the model, from the cache)
        # train.step_capture: forward, loss and backward compiled (CUDA graphs on a card); auto decides after timing
        self.step_capture = run.step_capture or CaptureDecision("off", "not resolved")
        # what this run did beyond what was resolved (training.json): resolved.json stays the resolution
        self.training_record: dict[str, Any] = {}
        if self.step_capture.mode != "off" and overrides_hook(self.hooks, "on_batch_embeddings"):
            self._note_capture(CaptureDecision("off", "the given hooks read each batch's embeddings on the host"))
        self.captured_step: CapturedStep | None = None
        if self.step_capture.mode == "compile":
            self.start_capture(self.step_capture)
        self.cache_deferred = run.cache_deferred  # auto under a time budget: decided after the first plan
        self.cache_plan = run.cache_plan
        self.cache_views = 0 if self.cache_deferred or not self.cache_plan.enabled else self.cache_plan.views
        self.feature_cache: FrozenFeatureCache | None = None  # built by _train (again on resume: deterministic)
        self.fingerprint = run.fingerprint
        self.pretrained_val_ap: torch.Tensor | None = None  # per-query validation AP@R of the untrained embedding
        self.reference_val_ap: torch.Tensor | None = None  # ... of the last significant gain (the stopping rule)
        self.last_eval_improved = False  # the last validation counted as progress (EarlyStopping reads it)
        # the steps and validation interval while training: the time budget re-plans them, not the config
        self.schedule = TrainingSchedule.from_config(self.cfg)
        self.scheduler.follow(self.schedule.horizon)  # the learning rate decays over the planned steps
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
        last = self.run.last_checkpoint
        return f"the last good checkpoint is {last}" if last.exists() else "no checkpoint was written yet"

    @property
    def echo(self) -> Messages:
        """Where the run's messages go (:class:`dmlkit._messages.Messages`); a callable assigned takes every one."""
        return self._echo

    @echo.setter
    def echo(self, echo: Callable[[str], None] | Messages | None) -> None:
        self._echo = messages(echo, log)

    def fit(self) -> TrainResult:
        """Train until the step budget or early stopping, then evaluate the test split once."""
        cfg = self.cfg
        tape = getattr(self.resolved, "measurements", None)
        if self.resume:
            self.restore_last()  # engine/training/resume.py
            if tape is not None:  # a resumed run plans from its own speeds and keeps nothing
                tape.stop_replaying("a resumed run", quietly=True)
                tape.forgo("a resumed run")
        elif self.dist.is_main:
            weights = getattr(self.model, "pretrained_weights", None)
            if weights is not None:
                self.echo(f"pretrained weights: {weights.tag} from {weights.source} (SHA-256 {weights.sha256[:12]}...)")
            self.run.prepare(cfg, self.splits, device=str(self.device),
                             weights=weights.record() if weights is not None else None)
            atomic_write_json(self.run.path / SUMMARY_FILE, self.resolved.summary())  # beside config.yaml, once
            if self.training_record:
                self._write_training_record()
        distributed.barrier()
        finished = False
        try:
            result = self._train()
            finished = True
            if tape is not None and self.dist.is_main:  # kept for the next run of this config here; recorded
                self.echo(tape.keep())
                self._record_measurements(tape)
            return result
        finally:
            if not finished:  # trackers mark their run failed; a resume continues it
                for callback in self.callbacks:
                    getattr(callback, "close", lambda: None)()

    def _record_measurements(self, tape) -> None:
        """Every number the plans read, the time budget's while training included, with the request they answer
        (``resolved.json``'s), into the run's training record: a replay (``--plan RUN``) starts from them."""
        try:
            request = read_json(self.run.path / SUMMARY_FILE)["request"]
        except (OSError, RecordError, KeyError, TypeError):  # a resumed run of an older dmlkit: no request to replay
            return
        measurements = tape.record()
        self.training_record.update(request=request, measurements=measurements,
                                    **{SEAL_KEY: seal(request, measurements["tape"])})
        self._write_training_record()

    def _note_capture(self, decision: CaptureDecision) -> None:
        """Train with ``decision`` (``train.step_capture``) from here on, recorded beside what was resolved."""
        self.start_capture(decision)
        self.training_record.setdefault("choices", {})["train.step_capture"] = {
            "value": self.cfg.train.step_capture, "reason": decision.describe()}

    def _write_training_record(self) -> None:
        """``training.json``: what the run did while training (:attr:`training_record`), kept with an earlier
        session's (a resumed run)."""
        path = self.run.path / TRAINING_RECORD_FILE
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
        batches = self._training_batches()
        schedule = self.schedule
        stop = schedule.finished(self.step)
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
            return budget.seconds_left(self.step, schedule.max_steps, schedule.eval_every, measured, has_val=has_val)

        bar = _progress(cfg, schedule.max_steps, self.step, seconds_left) if self.dist.is_main else None
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
            if (self.step <= start_step + 1 + budget.CALIBRATION_STEPS or schedule.finished(self.step)
                    or has_val and schedule.validates_after(self.step)):
                synchronize(self.device)  # the steps the plan times (and the last before a validation) end on the card
            now = self.clock()
            self.elapsed += now - t_last
            t_last = now
            if self.step == start_step + 1:
                timed.update(step=self.step, elapsed=self.elapsed)
            if schedule.plan is None and self.step == start_step + 1 + budget.CALIBRATION_STEPS:
                self._plan_to_budget(speeds(), has_val, bar)
                # steps are faster from here (features cached, or the step captured): time them again and re-plan
                if self._cache_after_first_plan() or self._capture_after_first_plan(speeds()):
                    batches = self._training_batches()
                    schedule.plan, start_step, start_elapsed = None, self.step, self.elapsed
                    timed.clear()
                    t_last = self.clock()  # building the cache is not training time (the budget's clock counts it)
            lr = self.optimizer.param_groups[0]["lr"]
            if self.step % cfg.train.log_every == 0:  # the loss is read here only: one host synchronisation
                loss_value = self.read_step_checks(value)
                record = {"kind": "train", "step": self.step, "epoch": self.position.epoch, "time": self.elapsed,
                          "loss": loss_value, "lr": lr}
                if self.scaler is not None:  # fp16: a falling scale means overflowing (skipped) steps
                    record["grad_scale"] = self.scaler.get_scale()
                self.run.log(record)
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
                if schedule.plan is not None and not stop and speeds() is not None:  # re-plan at the speeds measured so far
                    self._plan_to_budget(speeds(), has_val, bar)
                t_last = self.clock()  # evaluation time is not training time
            stop = stop or self.should_stop or schedule.finished(self.step)
            if stop or self.step % cfg.train.checkpoint_every == 0:
                self._settle_step_checks(value)  # nothing non-finite goes into a checkpoint or ends training unseen
            if self.dist.is_main and (evaluated or stop or self.step % cfg.train.checkpoint_every == 0):
                self.save()
        if bar is not None:
            bar.close()
        self.hooks.on_train_end(self)
        self.stopped_early = not schedule.finished(self.step)
        if not self.dist.is_main:  # evaluation and writing happen once, on rank 0
            return TrainResult({}, self.best_step, self.step, "rank 0", self.run.path)
        return self.finish(has_val)

    def _capture_after_first_plan(self, speeds: Speeds | None) -> bool:
        """``train.step_capture=auto``: capture when the steps left at the measured speed pay the compilation back."""
        if self.step_capture.mode != "pending" or speeds is None:
            return False
        self._note_capture(worth_capturing(self.cfg.train.max_steps - self.step, speeds.step_seconds))
        self.echo(f"step capture: {self.step_capture.describe()}")
        if self.dist.is_main:  # the decision is recorded beside the resolved choices, which stay as resolved
            self._write_training_record()
        return self.captured_step is not None

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
