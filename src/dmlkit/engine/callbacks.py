"""User callbacks: code that runs at the training loop's events without editing the engine.

A callback subclasses :class:`Callback` and overrides the events it needs; each receives the
trainer (``trainer.model``, ``trainer.step``, ``trainer.schedule``: the steps and validation interval
as planned, ``trainer.cfg``: as asked, ``trainer.run_dir``...), and the step
and metrics of the event. Setting ``trainer.should_stop = True`` ends training after the current
step (the selected weights are still tested). A callback that holds state returns it from
``state_dict`` and takes it back in ``load_state_dict``: it is saved in every checkpoint, so a
resumed run continues it exactly (:class:`EarlyStopping`'s counter, a tracker's run id).

Events, in order: ``on_train_start`` (also after a resume), ``on_steps_timed`` (the first steps timed),
``on_step_end`` (every step), ``on_log`` (every ``log.jsonl`` record: training, evaluation, method records),
``on_evaluation_end`` (every validation), ``on_validation_timed`` (its seconds counted),
``on_checkpoint`` (``checkpoints/last.pt`` written), ``on_fit_end`` (after the test split is scored and
``metrics.json`` written). Decisions that watch the run are callbacks too: the recipe attaches its time budget
(:mod:`dmlkit.recipe.time_budget`) as the config attaches early stopping.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Iterable

from dmlkit.core.validation import Interval, Options, validate_params

if TYPE_CHECKING:
    from dmlkit.engine.trainer import Trainer, TrainResult


class Callback:
    """Does nothing at every event; subclasses override what they need."""

    def on_train_start(self, trainer: "Trainer") -> None:
        """Before the first step of this session (after the checkpoint is loaded on a resume)."""

    def on_step_end(self, trainer: "Trainer", step: int, metrics: dict) -> None:
        """After optimisation step ``step`` (1-based); ``metrics`` holds ``loss`` (a 0-dim tensor on the training
        device: reading it waits for the device's queued work) and ``lr``."""

    def on_steps_timed(self, trainer: "Trainer", step: int, step_seconds: float | None) -> None:
        """After the first steps of a session were timed (a warm-up step, then
        :data:`~dmlkit.engine.training.step_timing.CALIBRATION_STEPS` timed ones), and again each time the trainer
        times its steps anew (``trainer.time_steps_again()``); ``step_seconds``: their mean training seconds."""

    def on_log(self, trainer: "Trainer", record: dict) -> None:
        """Every record written to ``log.jsonl`` (``kind`` train / eval / projection / data, ``step``)."""

    def on_evaluation_end(self, trainer: "Trainer", step: int, metrics: dict) -> None:
        """After each validation at ``step``; ``metrics`` are the validation metrics (``map_at_r``...)."""

    def on_validation_timed(self, trainer: "Trainer", step: int) -> None:
        """After a validation during training that does not end it, its seconds counted (``trainer.eval_seconds``)."""

    def on_checkpoint(self, trainer: "Trainer", step: int) -> None:
        """After ``checkpoints/last.pt`` was written at ``step``."""

    def on_fit_end(self, trainer: "Trainer", result: "TrainResult") -> None:
        """After the test split is scored and ``metrics.json`` (and ``best.pt``) written."""

    def state_dict(self) -> dict:
        """State to save in checkpoints (tensors, numbers, strings, lists, dicts)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` on resume."""


class CallbackList:
    """The trainer's callbacks, called in order; their states are keyed by position and class name."""

    def __init__(self, callbacks: Iterable[Callback] = ()):
        self.callbacks = list(callbacks)

    def __iter__(self):
        return iter(self.callbacks)

    def call(self, event: str, *args: Any) -> None:
        for callback in self.callbacks:
            getattr(callback, event)(*args)

    @staticmethod
    def _key(i: int, callback: Callback) -> str:
        return f"{i}:{type(callback).__name__}"

    def state_dict(self) -> dict:
        return {self._key(i, c): c.state_dict() for i, c in enumerate(self.callbacks)}

    def load_state_dict(self, state: dict) -> None:
        for i, callback in enumerate(self.callbacks):
            saved = state.get(self._key(i, callback))
            if saved is not None:
                callback.load_state_dict(saved)


class EarlyStopping(Callback):
    """Stop after ``patience`` validations without improvement.

    ``monitor=None`` follows the trainer's own judgement of progress (a validation improves when it
    becomes ``best.pt``, a higher MAP@R; with a pretrained backbone when its MAP@R gain over the last
    validation that made progress, the untrained embedding at first, exceeds 2 standard errors of
    the paired per-query differences); this is ``train.patience``. A metric name (``"map_at_r"``,
    ``"precision_at_1"``...) watches that metric instead: an improvement is a value above the best
    so far by more than ``min_delta`` (``mode="min"``: below).
    """

    def __init__(self, patience: int, monitor: str | None = None, mode: str = "max", min_delta: float = 0.0):
        validate_params(type(self).__name__, {"patience": patience, "mode": mode, "min_delta": min_delta},
                        {"patience": [Interval(int, 1, None)], "mode": [Options(("max", "min"))],
                         "min_delta": [Interval(float, 0, None)]})
        self.patience, self.monitor, self.mode, self.min_delta = patience, monitor, mode, float(min_delta)
        self.best = -math.inf
        self.waited = 0

    def on_evaluation_end(self, trainer: "Trainer", step: int, metrics: dict) -> None:
        if self.monitor is None:
            improved = getattr(trainer, "last_eval_improved", None)
            if improved is None:  # a trainer without the progress flag: its best.pt choice
                improved = trainer.best_step == step and trainer.evals_since_best == 0
        else:
            value = float(metrics[self.monitor]) * (1.0 if self.mode == "max" else -1.0)
            improved = value > self.best + self.min_delta
            self.best = max(self.best, value)
        self.waited = 0 if improved else self.waited + 1
        if self.waited >= self.patience:
            trainer.should_stop = True

    def state_dict(self) -> dict:
        return {"best": self.best, "waited": self.waited}

    def load_state_dict(self, state: dict) -> None:
        self.best, self.waited = float(state["best"]), int(state["waited"])


__all__ = ["Callback", "CallbackList", "EarlyStopping"]
