"""The trainer's schedule owns the steps and validation interval while a run trains; the config is never written
(``tests/unit/test_config_is_a_value.py`` holds the engine to that)."""

from __future__ import annotations

import io
import math

from dmlkit.engine.optim import build_optimizer, build_scheduler
from dmlkit.engine.training.schedule import Plan, TrainingSchedule


def test_a_plan_moves_the_schedule_and_a_checkpoint_restores_it(tiny_config):
    cfg = tiny_config("train.max_steps=100", "train.eval_every=10")
    schedule = TrainingSchedule.from_config(cfg)
    assert (schedule.max_steps, schedule.eval_every, schedule.requested, schedule.plan) == (100, 10, (100, 10), None)
    assert [s for s in range(1, 101) if schedule.validates_after(s)] == list(range(10, 101, 10))
    assert schedule.follow(Plan(45, 20, 12.0, True, "cut")) and not schedule.follow(Plan(45, 20, 11.0, True, "again"))
    assert schedule.validates_after(45) and schedule.finished(45) and not schedule.finished(44)
    again = TrainingSchedule.from_config(cfg)
    again.load_state_dict(schedule.state_dict())
    assert (again.max_steps, again.eval_every, again.requested) == (45, 20, (100, 10)) and again.plan is not None
    assert math.isnan(again.plan.seconds)
    assert schedule.record(45) == {"steps_taken": 45, "max_steps": 45, "eval_every": 20, "requested_steps": 100,
                                   "requested_eval_every": 10, "planned_to_budget": True}
    assert (cfg.train.max_steps, cfg.train.eval_every) == (100, 10)


def test_the_learning_rate_decays_over_the_schedules_steps():
    import torch
    from torch import nn

    from dmlkit.config.schema import OptimizerConfig

    cfg = OptimizerConfig(name="sgd", lr=1.0, scheduler="cosine", loss_lr_multiplier=1)
    optimizer = build_optimizer(nn.Linear(2, 2), nn.Module(), cfg)
    scheduler = build_scheduler(optimizer, cfg, 100)
    schedule = TrainingSchedule(100, 10, (100, 10))
    scheduler.follow(schedule.horizon)
    schedule.follow(Plan(4, 2, 1.0, True, "cut"))
    for _ in range(2):
        optimizer.step()
        scheduler.step()
    assert optimizer.param_groups[0]["lr"] == 0.5 * (1 + math.cos(math.pi * 2 / 4))
    state = scheduler.state_dict()
    assert "horizon" not in state  # no function in a checkpoint: the trainer points a resumed scheduler again
    torch.save(state, io.BytesIO())
