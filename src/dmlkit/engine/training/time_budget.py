"""The time budget's room: the trainer's :class:`~dmlkit.engine.training.schedule.TrainingSchedule` (steps and
validation interval) fitted to ``train.time_budget`` from the speeds measured while the run trains (the pure
planner is :mod:`dmlkit.engine.budget_planner`), and the feature cache whose building the budget's first plan decides
(``train.feature_cache=auto``). The config keeps what was asked; the schedule holds what is planned.
"""

from __future__ import annotations

import dataclasses

from dmlkit.engine import budget_planner as budget
from dmlkit.engine import distributed
from dmlkit.engine.budget_planner import Speeds
from dmlkit.engine.frozen_stage_cache import EPOCHS_PER_VIEW, MIN_VIEWS, FrozenFeatureCache, views_for_epochs
from dmlkit.engine.measurements import Measurements

#: A feature cache adds no view that would end after the run has spent this share of its time budget (a loaded
#: machine builds slower than planned): the views built so far are kept, and the rest of the budget trains.
CACHE_SHARE = 0.5


class TimeBudgetMixin:
    """Planning to the budget and the feature cache it pays for (:class:`~dmlkit.engine.trainer.Trainer`)."""

    def measured_speeds(self, step_seconds: float, has_val: bool) -> Speeds:
        """This run's speeds: a training step (given), a validation and the test split's evaluation.

        Before the first validation, an embedded image costs what the glyph plan measured before training
        (``ResolvedRun.embed_seconds``), else a third of a trained one (forward only) times the views the
        model averages (mirror, shifts).
        """
        num_val = len(self.splits.val) if has_val else 0
        if has_val and getattr(self, "member_folds", None) is not None:  # each member embeds its own fold only
            num_val = num_val / self.member_folds.members
        test = self.splits.test if self.splits.test is not None else getattr(self.splits, "query", None)
        num_test = len(test) if test is not None else 0
        if getattr(self.splits, "gallery", None) is not None:
            num_test += len(self.splits.gallery)
        views, val_views = budget.embedding_views(self.cfg), budget.embedding_views(self.cfg, validation=True)
        if self.eval_seconds:  # a validation image costs val_views passes, a test image views
            per_eval = sum(self.eval_seconds) / len(self.eval_seconds)
            test_seconds = budget.estimate_test_seconds(per_eval, num_val, num_test) * views / val_views
        else:
            per_image = getattr(self.resolved, "embed_seconds", None) \
                or step_seconds / max(self.cfg.sampler.batch_size or 1, 1) / 3.0 * views
            per_eval, test_seconds = num_val * per_image * val_views / views, num_test * per_image
        return Speeds(step_seconds, per_eval if has_val else 0.0, test_seconds)

    def _plan_to_budget(self, speeds: Speeds | None, has_val: bool, bar=None) -> None:
        """Fit the schedule's steps and validation interval into ``train.time_budget`` (engine/budget_planner.py)."""
        cfg, schedule = self.cfg, self.schedule
        if cfg.train.time_budget is None or speeds is None:
            return
        first = schedule.plan is None
        ceiling, interval = schedule.requested  # what the config asked for: a plan never trains more
        # the numbers a plan reads go through the run's measurements: a kept run replays them (the same steps)
        tape = getattr(self.resolved, "measurements", None) or Measurements.live()
        spent = tape.seconds("seconds spent before the budget's plan", self.wall_clock() - self.started)
        speeds = tape.speeds("training speeds", speeds, step_seconds=lambda s: s.step_seconds,
                             encode=dataclasses.asdict, decode=lambda kept: Speeds(**kept))
        plan = budget.plan_run(cfg.train.time_budget, spent, self.step, ceiling, interval,
                               speeds, has_val=has_val, interval=None if first else schedule.eval_every)
        plan = distributed.broadcast_object(plan)  # every rank trains the same steps
        changed = schedule.follow(plan)
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

    def _cache_after_first_plan(self) -> bool:
        """Under a time budget (``feature_cache=auto``): build the cache when the planned epochs make it pay
        (:func:`~dmlkit.engine.frozen_stage_cache.views_for_epochs`); True when it was built."""
        if not (self.cache_deferred and self.cache_plan.enabled) or self.feature_cache is not None:
            return False
        self.cache_deferred = False
        epochs = self.schedule.max_steps * (self.cfg.sampler.batch_size or 1) / max(len(self.splits.train), 1)
        self.cache_views = views_for_epochs(epochs, self.cache_plan.views)
        if not self.cache_views:
            self.echo(f"feature cache: not built: the budget buys about {epochs:.1f} epochs, too few for cached views "
                      f"to save more than they cost ({EPOCHS_PER_VIEW} epochs a view, at least {MIN_VIEWS} views)")
            return False
        self.cache_frozen_features()
        return True

    def cache_frozen_features(self) -> None:
        """Run the frozen stages once on the cached views (``train.feature_cache``); steps then start from them."""
        if not self.cache_views or self.feature_cache is not None:
            return
        budget_s = self.cfg.train.time_budget

        def out_of_time(next_view: float) -> bool:  # the next view would end past CACHE_SHARE of the budget
            return self.wall_clock() - self.started + next_view > CACHE_SHARE * budget_s

        self.feature_cache = FrozenFeatureCache.build(
            self.model, self.splits.train, self.augment, views=self.cache_views, seed=self.cfg.seed,
            autocast_dtype=self.autocast_dtype, echo=self.echo,
            progress=bool(self.cfg.train.progress and self.dist.is_main),
            out_of_time=None if budget_s is None or self.step > 0 else out_of_time)  # a resumed run: views whole
        self.cache_views = self.feature_cache.views
        self.train_forward = self.model.forward_from_prefix
