"""The time budget, a callback the recipe attaches to the run (as the config attaches early stopping).

:class:`TimeBudget` fits the trainer's :class:`~dmlkit.engine.training.schedule.TrainingSchedule` (steps and
validation interval) to ``train.time_budget`` from the speeds measured while the run trains (the pure planner is
:mod:`dmlkit.recipe.budget_planner`), decides whether the feature cache the budget's first plan waited for is built
(``train.feature_cache=auto``), predicts the progress bar's remaining time, and keeps the run's measurements
(:mod:`dmlkit.recipe.measurements`) when it ends. The trainer only offers the mechanisms it calls: its step timings
(``on_steps_timed``), :meth:`~dmlkit.engine.trainer.Trainer.follow`,
:meth:`~dmlkit.engine.trainer.Trainer.cache_frozen_features` and
:meth:`~dmlkit.engine.trainer.Trainer.time_steps_again`. The config keeps what was asked; the schedule holds what is
planned.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

from dmlkit.core.json_files import read_json
from dmlkit.engine import distributed
from dmlkit.engine.callbacks import Callback
from dmlkit.engine.plan_records import SEAL_KEY, seal
from dmlkit.engine.resolve import ResolvedRun
from dmlkit.engine.run_layout import RESOLVED_FILE
from dmlkit.engine.timing import OtherWork, usable_cpus
from dmlkit.exceptions import RecordError
from dmlkit.recipe import budget_planner as budget
from dmlkit.recipe.budget_planner import Speeds
from dmlkit.recipe.feature_cache_plan import EPOCHS_PER_VIEW, MIN_VIEWS, views_for_epochs
from dmlkit.recipe.measurements import SHARED_BELOW, Measurements

#: A feature cache adds no view that would end after the run has spent this share of its time budget (a loaded
#: machine builds slower than planned): the views built so far are kept, and the rest of the budget trains.
CACHE_SHARE = 0.5


class TimeBudget(Callback):
    """Planning to the budget, the feature cache it pays for, and the remaining time the progress bar shows.

    ``resolved``: the run it watches (its config's ``train.time_budget``, ``started``: the wall clock when the run's
    planning began, which the budget counts from; its ``measurements``, ``embed_seconds`` and ``cache_plan``).
    ``wall_clock``: the clock ``started`` was read from. Without a budget it only predicts the remaining time and
    keeps the measurements.
    """

    def __init__(self, resolved: ResolvedRun, wall_clock: Callable[[], float] = time.perf_counter):
        self.seconds = resolved.cfg.train.time_budget
        self.started = resolved.started
        self.wall_clock = wall_clock
        self.tape: Measurements | None = resolved.measurements
        self.embed_seconds = resolved.embed_seconds
        self.cache_plan = resolved.cache_plan

    @classmethod
    def of(cls, trainer) -> TimeBudget | None:
        """The time budget attached to ``trainer`` (None: none was)."""
        return next((callback for callback in trainer.callbacks if isinstance(callback, cls)), None)

    # -- events ---------------------------------------------------------------------------------------------------

    def on_train_start(self, trainer) -> None:
        if trainer.resume and self.tape is not None:  # a resumed run plans from its own speeds and keeps nothing
            self.tape.stop_replaying("a resumed run", quietly=True)
            self.tape.forgo("a resumed run")
        trainer.remaining_seconds = lambda: self.seconds_left(trainer)
        if not trainer.resume:  # the views the plan chose, before the first step; a resumed run rebuilds them whole
            trainer.cache_frozen_features(out_of_time=self._cache_out_of_time())

    def _cache_out_of_time(self) -> Callable[[float], bool] | None:
        """Whether a feature cache adds no further view (asked after each, the next one's expected seconds given):
        one that would end past :data:`CACHE_SHARE` of the budget, or, beyond the first, one the plan's rule would
        not take at the speed the machine gives now (:func:`views_at_live_speed`); None: no budget."""
        if self.seconds is None:
            return None
        seconds, planned = self.seconds, self.cache_plan.steps
        others, built = OtherWork().start(), [0]
        tape = self.tape or Measurements.live()  # the load read is kept with the plan: a replay builds as many

        def out_of_time(next_view: float) -> bool:
            built[0] += 1
            if self.wall_clock() - self.started + next_view > CACHE_SHARE * seconds:
                return True
            if planned is None:
                return False
            slowdown = float(tape.measure(f"slowdown while building cached view {built[0]}",
                                          lambda: live_slowdown(others.cores()), announce=False))
            return not views_at_live_speed(built[0] + 1, planned, slowdown)

        return out_of_time

    def on_steps_timed(self, trainer, step: int, step_seconds: float | None) -> None:
        """The first plan (and a feature cache that pays), once the steps of a schedule without one were timed."""
        if trainer.schedule.plan is not None or step_seconds is None:
            return
        has_val = trainer.splits.val is not None
        self._plan_to_budget(trainer, self.measured_speeds(trainer, step_seconds, has_val), has_val)
        if self._cache_after_first_plan(trainer):  # steps are faster from here: time them again and re-plan
            trainer.time_steps_again()  # building the cache is not training time (the budget's clock counts it)

    def on_validation_timed(self, trainer, step: int) -> None:
        """After a validation: plan again at the speeds measured so far (the evaluation points stay)."""
        step_seconds = trainer.timing.step_seconds(trainer.step, trainer.elapsed)
        if trainer.schedule.plan is None or step_seconds is None:
            return
        has_val = trainer.splits.val is not None
        self._plan_to_budget(trainer, self.measured_speeds(trainer, step_seconds, has_val), has_val)

    def on_fit_end(self, trainer, result) -> None:
        """Keep the measurements for the next run of this config here, and record them in the run."""
        if self.tape is not None and trainer.dist.is_main:
            trainer.echo(self.tape.keep())
            self._record_measurements(trainer, self.tape)

    # -- what it predicts and plans -------------------------------------------------------------------------------

    def measured_speeds(self, trainer, step_seconds: float, has_val: bool) -> Speeds:
        """This run's speeds: a training step (given), a validation and the test split's evaluation.

        Before the first validation, an embedded image costs what the glyph plan measured before training
        (``ResolvedRun.embed_seconds``), else a third of a trained one (forward only) times the views the
        model averages (mirror, shifts).
        """
        cfg, splits = trainer.cfg, trainer.splits
        num_val = len(splits.val) if has_val else 0
        if has_val and getattr(trainer, "member_folds", None) is not None:  # each member embeds its own fold only
            num_val = num_val / trainer.member_folds.members
        test = splits.test if splits.test is not None else getattr(splits, "query", None)
        num_test = len(test) if test is not None else 0
        if getattr(splits, "gallery", None) is not None:
            num_test += len(splits.gallery)
        views, val_views = budget.embedding_views(cfg), budget.embedding_views(cfg, validation=True)
        if trainer.eval_seconds:  # a validation image costs val_views passes, a test image views
            per_eval = sum(trainer.eval_seconds) / len(trainer.eval_seconds)
            test_seconds = budget.estimate_test_seconds(per_eval, num_val, num_test) * views / val_views
        else:
            per_image = self.embed_seconds or step_seconds / max(cfg.sampler.batch_size or 1, 1) / 3.0 * views
            per_eval, test_seconds = num_val * per_image * val_views / views, num_test * per_image
        return Speeds(step_seconds, per_eval if has_val else 0.0, test_seconds)

    def seconds_left(self, trainer) -> float | None:
        """Training steps, the validations still to come and the test split, at this session's measured speeds
        (the progress bar's remaining time; None before a step of this session was timed)."""
        timing, has_val = trainer.timing, trainer.splits.val is not None
        step_seconds = timing.step_seconds(trainer.step, trainer.elapsed)
        if step_seconds is None:
            step_seconds = timing.session_step_seconds(trainer.step, trainer.elapsed)
        if step_seconds is None:
            return None
        schedule = trainer.schedule
        return budget.seconds_left(trainer.step, schedule.max_steps, schedule.eval_every,
                                   self.measured_speeds(trainer, step_seconds, has_val), has_val=has_val)

    def _plan_to_budget(self, trainer, speeds: Speeds | None, has_val: bool) -> None:
        """Fit the schedule's steps and validation interval into ``train.time_budget`` (recipe/budget_planner.py)."""
        schedule = trainer.schedule
        if self.seconds is None or speeds is None:
            return
        first = schedule.plan is None
        ceiling, interval = schedule.requested  # what the config asked for: a plan never trains more
        # the numbers a plan reads go through the run's measurements: a kept run replays them (the same steps)
        tape = self.tape or Measurements.live()
        spent = tape.seconds("seconds spent before the budget's plan", self.wall_clock() - self.started)
        speeds = tape.speeds("training speeds", speeds, step_seconds=lambda s: s.step_seconds,
                             encode=dataclasses.asdict, decode=lambda kept: Speeds(**kept))
        plan = budget.plan_run(self.seconds, spent, trainer.step, ceiling, interval,
                               speeds, has_val=has_val, interval=None if first else schedule.eval_every)
        plan = distributed.broadcast_object(plan)  # every rank trains the same steps
        changed = trainer.follow(plan)
        if first or changed:
            trainer.run_dir.log({"kind": "plan", "step": trainer.step, "time": trainer.elapsed, "max_steps": plan.max_steps,
                             "eval_every": plan.eval_every, "predicted_seconds": round(plan.seconds, 1),
                             "step_seconds": speeds.step_seconds, "eval_seconds": speeds.eval_seconds,
                             "test_seconds": speeds.test_seconds})
        if first:
            trainer.echo(f"time budget: {plan.reason}")

    def _cache_after_first_plan(self, trainer) -> bool:
        """Under a time budget (``feature_cache=auto``): build the cache when the planned epochs make it pay
        (:func:`~dmlkit.recipe.feature_cache_plan.views_for_epochs`); True when it was built."""
        if not (trainer.cache_deferred and self.cache_plan.enabled) or trainer.feature_cache is not None:
            return False
        trainer.cache_deferred = False
        epochs = trainer.schedule.max_steps * (trainer.cfg.sampler.batch_size or 1) / max(len(trainer.splits.train), 1)
        views = views_for_epochs(epochs, self.cache_plan.views)
        if not views:
            trainer.echo(f"feature cache: not built: the budget buys about {epochs:.1f} epochs, too few for cached "
                         f"views to save more than they cost ({EPOCHS_PER_VIEW} epochs a view, at least {MIN_VIEWS} "
                         "views)")
            return False
        trainer.cache_frozen_features(views, out_of_time=self._cache_out_of_time())
        return True

    def _record_measurements(self, trainer, tape: Measurements) -> None:
        """Every number the plans read, the time budget's while training included, with the request they answer
        (``resolved.json``'s), into the run's training record: a replay (``--plan RUN``) starts from them."""
        try:
            request = read_json(trainer.run_dir.path / RESOLVED_FILE)["request"]
        except (OSError, RecordError, KeyError, TypeError):  # a resumed run of an older dmlkit: no request to replay
            return
        measurements = tape.record()
        trainer.training_record.update(request=request, measurements=measurements,
                                       **{SEAL_KEY: seal(request, measurements["tape"])})
        trainer.write_training_record()


def live_slowdown(other_cores: float | None, cores: int | None = None) -> float:
    """How many times longer than planned the run's work takes while other processes hold ``other_cores`` of the
    ``cores`` (default: the usable ones; :class:`~dmlkit.engine.timing.OtherWork`): the cores over those left to the
    run (2 beside one busy process on 2 cores). A plan is made from work, as on idle cores, so this is the factor its
    steps shrink by while the load lasts; 1 where other work holds no more than a shared machine's share of the cores
    (:data:`~dmlkit.recipe.measurements.SHARED_BELOW`) or the machine does not say."""
    cores = usable_cpus() if cores is None else cores
    if other_cores is None or other_cores <= (1.0 - SHARED_BELOW) * cores:
        return 1.0
    return cores / max(cores - other_cores, 0.5)


def views_at_live_speed(views: int, planned_steps: int, slowdown: float) -> bool:
    """Whether ``views`` cached views still follow the learning plan's rule when the machine runs ``slowdown`` times
    slower than planned: beyond one view, the steps left must reach the plan's target
    (:data:`~dmlkit.recipe.learning_plan.TARGET_STEPS`, or the planned steps where fewer; steps first, then the crops'
    variety)."""
    if views <= 1:
        return True
    return planned_steps / max(slowdown, 1.0) >= min(budget.FEW_STEPS, planned_steps)


def plan_callbacks(resolved: ResolvedRun) -> tuple[Any, ...]:
    """The callbacks the recipe attaches to a resolved run: its time budget, then the step capture's decision."""
    from dmlkit.recipe.step_capture_plan import StepCaptureChoice

    return TimeBudget(resolved), StepCaptureChoice()


__all__ = ["TimeBudget", "live_slowdown", "plan_callbacks", "views_at_live_speed"]
