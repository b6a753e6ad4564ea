"""The training clock's record of the steps it timed: what the trainer reports to the plans that watch the run.

The trainer counts training time (``Trainer.elapsed``: steps only, never validations or a feature cache's build)
and times its steps from the start of a session: one warm-up step (oneDNN primitives, allocator pools), then
:data:`CALIBRATION_STEPS` steps whose mean is the first measured step time. Callbacks read it
(``on_steps_timed``, :meth:`StepTiming.step_seconds`); a faster step path (a feature cache built, the step captured)
times the steps again from the current step (``Trainer.time_steps_again``).
"""

from __future__ import annotations

from dataclasses import dataclass

#: Steps timed for the first measured step time, after one warm-up step.
CALIBRATION_STEPS = 3


@dataclass
class StepTiming:
    """Steps and training seconds at the start of the timed window (``start_*``) and after its warm-up step
    (``warm_*``, None until taken); ``last``: the clock's reading where training time last resumed."""

    start_step: int = 0
    start_elapsed: float = 0.0
    last: float = 0.0
    warm_step: int | None = None
    warm_elapsed: float = 0.0

    def restart(self, step: int, elapsed: float, now: float) -> None:
        """Time the steps from ``step`` on (``elapsed`` training seconds so far; the clock reads ``now``)."""
        self.start_step, self.start_elapsed, self.last, self.warm_step = step, elapsed, now, None

    def lap(self, now: float) -> float:
        """Training seconds since the clock last resumed; it resumes at ``now``."""
        seconds, self.last = now - self.last, now
        return seconds

    def pause(self, now: float) -> None:
        """What ran since (a validation) is not training time: the clock resumes at ``now``."""
        self.last = now

    def observe(self, step: int, elapsed: float) -> None:
        """After ``step``: the warm-up step's end is where the timed steps start."""
        if step == self.start_step + 1:
            self.warm_step, self.warm_elapsed = step, elapsed

    def calibrating(self, step: int) -> bool:
        """Whether ``step`` is one of the window's warm-up or calibration steps (each is timed to its end on a card)."""
        return step <= self.start_step + 1 + CALIBRATION_STEPS

    def calibrated(self, step: int) -> bool:
        """Whether ``step`` ends the window's calibration steps (``on_steps_timed``)."""
        return step == self.start_step + 1 + CALIBRATION_STEPS

    def step_seconds(self, step: int, elapsed: float) -> float | None:
        """Mean training seconds of the steps after the warm-up step (None before one is timed)."""
        if self.warm_step is None or step <= self.warm_step:
            return None
        return (elapsed - self.warm_elapsed) / (step - self.warm_step)

    def session_step_seconds(self, step: int, elapsed: float) -> float | None:
        """Mean training seconds of every step of the window, its warm-up included (None before one)."""
        if step == self.start_step:
            return None
        return (elapsed - self.start_elapsed) / (step - self.start_step)


__all__ = ["CALIBRATION_STEPS", "StepTiming"]
