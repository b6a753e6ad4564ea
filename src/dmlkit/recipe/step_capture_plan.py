"""Whether a run's training step is captured (``train.step_capture``): decided before training, and for ``auto`` on a
card after the first steps were timed (:class:`StepCaptureChoice`, a callback the recipe attaches).

The capture itself (the compiled step, replayed as CUDA graphs) is the engine's
(:mod:`dmlkit.engine.training.step_capture`).
"""

from __future__ import annotations

from dmlkit.engine.callbacks import Callback
from dmlkit.engine.training.step_capture import worth_capturing


class StepCaptureChoice(Callback):
    """``train.step_capture=auto``: once the first steps were timed, capture when the steps left at the measured
    speed pay the compilation back (:func:`worth_capturing`); the steps are then timed again."""

    def __init__(self):
        self.resumed_with_plan = False

    def on_train_start(self, trainer) -> None:
        # a resumed run whose schedule was already planned times no first steps for a plan: it stays as resolved
        self.resumed_with_plan = trainer.schedule.plan is not None

    def on_steps_timed(self, trainer, step: int, step_seconds: float | None) -> None:
        if self.resumed_with_plan or trainer.step_capture.mode != "pending" or step_seconds is None:
            return
        if not trainer.timing.calibrated(trainer.step):  # a feature cache was just built: its steps are timed first
            return
        trainer.capture_from_here(worth_capturing(trainer.cfg.train.max_steps - trainer.step, step_seconds))
        trainer.echo(f"step capture: {trainer.step_capture.describe()}")
        if trainer.dist.is_main:  # the decision is recorded beside the resolved choices, which stay as resolved
            trainer.write_training_record()
        if trainer.captured_step is not None:
            trainer.time_steps_again()  # the captured steps run faster: time them again and re-plan


__all__ = ["StepCaptureChoice"]
