"""Planning a run to its time budget (``train.time_budget``).

The recipe gives a step ceiling (``train.max_steps``: enough epochs for the data) and the number
of validation evaluations; this module fits them into the wall-clock budget of the whole run,
from speeds measured on this machine while it runs:

* ``spent``: seconds since the run started (decoding, the untrained embedding's validation, a
  feature cache: whatever came before),
* ``step_seconds``: one training step, timed over the first steps after a warm-up step,
* ``eval_seconds``: one validation evaluation (embedding and scoring the validation split),
* ``test_seconds``: the test split's embedding and scores at the end, from the validation's
  speed per image.

A plan is made once after the trainer timed its first steps (:data:`CALIBRATION_STEPS` after a warm-up
step) and re-made after every validation with the speeds measured so far, so the last evaluation and the
test embedding end inside the budget and the progress bar's remaining time is the plan's
(:class:`dmlkit.recipe.time_budget.TimeBudget`, the callback that plans while the run trains).
Data that fits keeps the recipe's steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dmlkit.engine.training.schedule import Plan
from dmlkit.engine.training.step_timing import CALIBRATION_STEPS  # noqa: F401  (the steps timed for the first plan)

#: The whole run's wall-clock budget on a CPU when ``train.time_budget`` is left to the recipe (seconds):
#: decoding, training, every validation and the test split's embedding (dmlkit.recipe.budget_planner plans to it).
DEFAULT_TIME_BUDGET = 720.0


def evaluations_over(steps: int, every: int) -> int:
    """Validations an interval of ``every`` steps gives over ``steps`` steps, the final step's included."""
    return -(-steps // max(every, 1))



#: Share of the budget kept back for what the speeds do not foresee (the process start, writing results).
SAFETY_MARGIN = 0.03

#: At most this share of the budget goes to the plan's own measurements beyond the timings (backbone by budget's
#: comparison of untrained candidates on the validation classes): a comparison that would cost more is not made.
MEASUREMENT_SHARE = 0.10

#: At most this share of the budget goes to validation evaluations when the budget binds; their number
#: stays within EVALUATIONS (enough to see whether validation still rises, few enough to train).
EVALUATION_SHARE = 0.15
EVALUATIONS = (3, 12)

#: Training steps a plan wants between two validations: a plan that buys few steps validates
#: rarely (once at the end when it buys fewer than this), instead of after every step or two.
MIN_STEPS_PER_EVALUATION = 25

#: A plan that buys fewer steps than this says so, and why (what the rest of the budget goes to); the learning
#: plan's target (:data:`dmlkit.recipe.learning_plan.TARGET_STEPS`).
FEW_STEPS = 200


@dataclass(frozen=True)
class Speeds:
    """Measured costs, in seconds: a training step, a validation evaluation, the final test evaluation."""

    step_seconds: float
    eval_seconds: float = 0.0
    test_seconds: float = 0.0


def plan_run(budget: float, spent: float, step: int, ceiling: int, eval_every: int, speeds: Speeds, *,
             has_val: bool, interval: int | None = None) -> Plan:
    """The steps and evaluation interval that fit ``budget`` seconds, ``spent`` of which are gone at ``step``.

    ``ceiling`` and ``eval_every`` are the recipe's steps and interval: when they fit, they stay.
    Otherwise the steps are cut to what the time left buys after the test evaluation and the
    validations to come; the first plan (``interval=None``) spreads the evaluations anew
    (:data:`EVALUATION_SHARE` of the budget, :data:`EVALUATIONS` of them, never more than ``eval_every``
    gave over ``ceiling`` steps), a later one keeps the
    planned ``interval`` so evaluation points do not move. Never fewer steps than already taken.
    """
    step_s = max(speeds.step_seconds, 1e-9)
    eval_s = speeds.eval_seconds if has_val else 0.0
    left = budget * (1.0 - SAFETY_MARGIN) - spent - speeds.test_seconds

    def cost(steps: int, every: int) -> float:
        evals = (steps // every - step // every + (steps % every != 0)) if has_val and steps > step else 0
        return (steps - step) * step_s + max(evals, 0) * eval_s

    if cost(ceiling, eval_every) <= left:
        seconds = spent + cost(ceiling, eval_every) + speeds.test_seconds
        return Plan(ceiling, eval_every, seconds, False,
                    f"{ceiling} steps fit the {budget:.0f}-s budget (predicted end {seconds:.0f} s)")
    every = eval_every if interval is None else interval
    if has_val and interval is None:
        # never more validations than the recipe's interval gave (cutting steps must not add validations)
        count = min(evaluation_count(budget, eval_s), max(1, evaluations_over(ceiling, eval_every)))
        affordable = max(0.0, left - count * eval_s) / step_s
        while count > 1 and affordable < count * MIN_STEPS_PER_EVALUATION:  # few steps: fewer validations
            count -= 1
            affordable = max(0.0, left - count * eval_s) / step_s
        every = max(1, math.ceil(affordable / count))
    per_step = step_s + (eval_s / every if has_val else 0.0)
    steps = step + max(0, int(left / per_step))
    while steps > step and cost(steps, every) > left:  # the last interval's evaluation may not fit
        steps -= 1
    steps = max(step, min(ceiling, steps), 1)
    seconds = spent + cost(steps, every) + speeds.test_seconds
    reason = (f"{steps} of {ceiling} steps fit the {budget:.0f}-s budget at {speeds.step_seconds:.2f} s a step"
              + (f", a validation every {every} steps ({eval_s:.1f} s each)" if has_val else "")
              + f" and {speeds.test_seconds:.0f} s for the test split (predicted end {seconds:.0f} s)")
    if steps - step < FEW_STEPS:
        evals = (steps // every - step // every + (steps % every != 0)) if has_val else 0
        reason += (f"; only {steps - step} steps, fewer than the {FEW_STEPS} fine-tuning needs to show: {spent:.0f} s "
                   f"were spent before this plan, {speeds.test_seconds:.0f} s go to the test split and "
                   f"{evals * eval_s:.0f} s to {evals} validation(s)")
    return Plan(steps, every, seconds, True, reason)


def evaluation_count(budget: float, eval_seconds: float) -> int:
    """Validations a binding plan spreads: :data:`EVALUATION_SHARE` of the budget, within :data:`EVALUATIONS`."""
    return min(EVALUATIONS[1], max(EVALUATIONS[0], int(EVALUATION_SHARE * budget / max(eval_seconds, 1e-9))))


def estimate_test_seconds(eval_seconds: float, num_val: int, num_test: int) -> float:
    """The test split's evaluation at the validation's measured speed per image."""
    return eval_seconds * num_test / max(num_val, 1)


def seconds_left(step: int, max_steps: int, eval_every: int, speeds: Speeds, *, has_val: bool) -> float:
    """Remaining wall time: the steps and validations to come and the test evaluation (the progress bar's ETA)."""
    evals = (max_steps // eval_every - step // eval_every + (max_steps % eval_every != 0)) if has_val else 0
    return (max_steps - step) * speeds.step_seconds + max(evals, 0) * speeds.eval_seconds + speeds.test_seconds


def embedding_views(cfg: Any, validation: bool = False) -> int:
    """Forward passes per embedded image: the mirror (``model.flip_average``) and the shifts (``model.shift_average``;
    with ``validation``, ``eval.val_shift_average`` where set)."""
    radius = cfg.model.shift_average or 0
    if validation and cfg.eval.val_shift_average is not None:
        radius = cfg.eval.val_shift_average
    return (2 if cfg.model.flip_average else 1) * (2 * radius + 1) ** 2
