"""The trainer's schedule owns the steps and validation interval while a run trains; the config is never written."""

from __future__ import annotations

import ast
import io
import math
from pathlib import Path

from dmlkit.engine.budget import Plan
from dmlkit.engine.optim import build_optimizer, build_scheduler
from dmlkit.engine.training.schedule import TrainingSchedule

ENGINE = Path(__file__).resolve().parents[3] / "src" / "dmlkit" / "engine"
PLANNED = ("max_steps", "eval_every")


def _writes_planned_field(node: ast.AST) -> bool:
    """An assignment to ``<...>.train.max_steps`` / ``.train.eval_every``, or ``setattr(<...>.train, "max_steps", ...)``."""
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            for part in ast.walk(target):
                if isinstance(part, ast.Attribute) and part.attr in PLANNED and isinstance(part.ctx, ast.Store) \
                        and isinstance(part.value, ast.Attribute) and part.value.attr == "train":
                    return True
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" \
            and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value in PLANNED:
        return True
    return False


def test_nothing_in_the_engine_writes_the_configs_steps():
    writes = [f"{path.relative_to(ENGINE)}:{node.lineno}: {ast.unparse(node)}"
              for path in sorted(ENGINE.rglob("*.py"))
              for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
              if _writes_planned_field(node)]
    assert writes == [], "the engine writes cfg.train.max_steps / eval_every (the schedule owns them):\n" + \
        "\n".join(writes)


def test_the_checker_sees_the_writes_it_forbids():
    for source in ("cfg.train.max_steps = 3", "self.cfg.train.max_steps, self.cfg.train.eval_every = a, b",
                   "cfg.train.eval_every += 1", "setattr(cfg.train, 'max_steps', 3)"):
        assert any(_writes_planned_field(node) for node in ast.walk(ast.parse(source))), source
    for source in ("schedule.max_steps = 3", "steps = cfg.train.max_steps"):
        assert not any(_writes_planned_field(node) for node in ast.walk(ast.parse(source))), source


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
