"""The steps a run trains and how often it validates, as they stand while it trains: :class:`TrainingSchedule`.

The config says what was asked (``train.max_steps`` and ``train.eval_every``, filled in by the recipe and
saved once in ``config.yaml``); the trainer's schedule starts from them and is what the loop, the progress
bar, the learning-rate schedule's horizon, validations and checkpoints read. The time budget re-plans it
(:class:`dmlkit.recipe.time_budget.TimeBudget`, a callback), a checkpoint keeps it (``planned``) and a resume restores it,
and ``metrics.json`` records the plan the run ended with (``schedule``). Nothing writes the config.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Plan:
    """Steps and evaluation interval that end the run inside the budget; ``seconds`` is the predicted end
    (from the run's start, the test evaluation included). The time budget makes them
    (:func:`dmlkit.recipe.budget_planner.plan_run`); the schedule follows them."""

    max_steps: int
    eval_every: int
    seconds: float
    binds: bool
    reason: str


@dataclass
class TrainingSchedule:
    """``max_steps`` to train and a validation every ``eval_every`` steps; ``requested``: the config's two numbers
    (a plan never trains more); ``plan``: the time budget's latest plan (:func:`~dmlkit.recipe.budget_planner.plan_run`),
    None until one is made."""

    max_steps: int
    eval_every: int
    requested: tuple[int, int]
    plan: Plan | None = None

    @classmethod
    def from_config(cls, cfg) -> "TrainingSchedule":
        """The steps and validation interval the (resolved) config asks for."""
        steps, every = int(cfg.train.max_steps), int(cfg.train.eval_every)
        return cls(steps, every, (steps, every))

    def horizon(self) -> int:
        """The steps the learning-rate schedule decays over (read at every step: it follows re-plans)."""
        return self.max_steps

    def follow(self, plan: Plan) -> bool:
        """Take ``plan``'s steps and interval; True when they differ from the ones held before."""
        changed = (plan.max_steps, plan.eval_every) != (self.max_steps, self.eval_every)
        self.plan, self.max_steps, self.eval_every = plan, plan.max_steps, plan.eval_every
        return changed

    def validates_after(self, step: int) -> bool:
        """Whether ``step`` ends with a validation (every ``eval_every`` steps, and the last step)."""
        return step % self.eval_every == 0 or step >= self.max_steps

    def finished(self, step: int) -> bool:
        """Whether ``step`` is the last step (or beyond it)."""
        return step >= self.max_steps

    def state_dict(self) -> dict:
        """The checkpoint's ``planned`` entry (its keys as older checkpoints wrote them)."""
        return {"max_steps": self.max_steps, "eval_every": self.eval_every, "made": self.plan is not None,
                "recipe": list(self.requested)}

    def load_state_dict(self, planned: dict) -> None:
        """Continue with the steps a checkpoint's run planned (:meth:`state_dict`)."""
        self.max_steps, self.eval_every = int(planned["max_steps"]), int(planned["eval_every"])
        if planned.get("recipe"):
            self.requested = tuple(int(n) for n in planned["recipe"])
        if planned.get("made"):
            self.plan = Plan(self.max_steps, self.eval_every, math.nan, True, "resumed")

    def record(self, steps_taken: int) -> dict:
        """``metrics.json``'s ``schedule``: the steps taken and the plan the run ended with."""
        return {"steps_taken": steps_taken, "max_steps": self.max_steps, "eval_every": self.eval_every,
                "requested_steps": self.requested[0], "requested_eval_every": self.requested[1],
                "planned_to_budget": self.plan is not None}
