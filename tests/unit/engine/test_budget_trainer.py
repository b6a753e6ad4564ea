"""A run planned to its time budget (train.time_budget): the trainer measures its steps and stops inside the budget.

The clocks are replaced by one that advances a second per training step, so the plan is exact. The runs read
sklearn's digits (8x8; 896 test images), the tiny default job's steps and evaluations at a fraction of MNIST's cost;
the slow machine's keeps MNIST's 2,500 test images, whose predicted test time its few-steps plan is built on.
"""

from __future__ import annotations

import json

import pytest

from dmlkit.recipe import Trainer
from dmlkit.recipe.budget_planner import CALIBRATION_STEPS, FEW_STEPS, MIN_STEPS_PER_EVALUATION, SAFETY_MARGIN
from dmlkit.recipe.time_budget import TimeBudget


class StepClock:
    """A clock that advances ``seconds`` at every training step and stands still otherwise."""

    def __init__(self, trainer: Trainer, seconds: float = 1.0):
        self.now = 0.0
        trainer.clock = self
        budget = TimeBudget.of(trainer)  # the budget's wall clock, which counts from the run's start
        budget.wall_clock, budget.started = self, 0.0
        step = trainer.training_step

        def timed(*args):
            self.now += seconds
            return step(*args)

        trainer.training_step = timed

    def __call__(self) -> float:
        return self.now


#: The tiny default job on digits: its test split holds 896 images.
DIGITS = "data.name=digits"
TEST_IMAGES = 896


def plans(run_dir) -> list[dict]:
    return [r for r in map(json.loads, (run_dir / "log.jsonl").read_text().splitlines()) if r["kind"] == "plan"]


def test_the_budget_cuts_the_steps_to_what_fits(tmp_path, tiny_config):
    trainer = Trainer(tiny_config(DIGITS, "train.max_steps=1000", "train.time_budget=100"), tmp_path, echo=lambda _: None)
    StepClock(trainer)
    result = trainer.fit()
    [plan] = plans(tmp_path)
    assert plan["step"] == 1 + CALIBRATION_STEPS and plan["step_seconds"] == pytest.approx(1.0)
    # the test images embedded at a third of a training image's cost (batches of 32, one view)
    assert plan["test_seconds"] == pytest.approx(TEST_IMAGES / 32 / 3)
    expected = 1 + CALIBRATION_STEPS + int(100 * (1 - SAFETY_MARGIN) - (1 + CALIBRATION_STEPS) - plan["test_seconds"])
    assert result.steps == plan["max_steps"] == expected < 1000
    assert trainer.schedule.max_steps == expected and trainer.cfg.train.max_steps == 1000  # the config stays as asked
    recorded = json.loads((tmp_path / "metrics.json").read_text())["schedule"]
    assert recorded == {"steps_taken": expected, "max_steps": expected, "eval_every": plan["eval_every"],
                        "requested_steps": 1000, "requested_eval_every": 1000, "planned_to_budget": True}


def test_data_that_fits_keeps_the_recipe_steps(tmp_path, tiny_config):
    trainer = Trainer(tiny_config(DIGITS, "train.max_steps=40", "train.time_budget=10000"), tmp_path, echo=lambda _: None)
    StepClock(trainer)
    assert trainer.fit().steps == 40
    assert plans(tmp_path)[0]["max_steps"] == 40


def test_no_budget_no_plan(tmp_path, tiny_config):
    trainer = Trainer(tiny_config(DIGITS, "train.max_steps=8"), tmp_path, echo=lambda _: None)
    assert trainer.cfg.train.time_budget is None  # the steps were set: the recipe leaves the budget alone
    assert trainer.fit().steps == 8 and plans(tmp_path) == []


def test_a_resumed_run_keeps_its_plan(tmp_path, tiny_config, crash_in_step):
    overrides = (DIGITS, "train.max_steps=1000", "train.time_budget=60", "train.checkpoint_every=5")
    trainer = Trainer(tiny_config(*overrides), tmp_path, echo=lambda _: None)
    StepClock(trainer)
    crash_in_step(trainer, 12)
    with pytest.raises(KeyboardInterrupt):
        trainer.fit()
    planned = plans(tmp_path)[0]["max_steps"]
    assert 12 < planned < 1000
    resumed = Trainer(tiny_config(*overrides), tmp_path, resume=True, echo=lambda _: None)
    assert resumed.fit().steps == planned == resumed.schedule.max_steps
    assert resumed.cfg.train.max_steps == 1000 and resumed.scheduler.horizon() == planned  # restored into the schedule


def test_a_slow_machine_validates_rarely_and_its_plan_says_why(tmp_path, tiny_config):
    """A slow machine: 7.3 s a step and 63 s a validation in a 720-s budget; the plan trains its steps between few
    validations (before: 3 validations spread over ~50 steps) and prints why it buys fewer than a few hundred."""
    printed: list[str] = []
    cfg = tiny_config("train.max_steps=2000", "train.time_budget=720", "protocol.val_class_fraction=0.4",
                     "sampler.batch_size=24")
    trainer = Trainer(cfg, tmp_path, echo=printed.append)
    clock = StepClock(trainer, seconds=7.3)
    validate = trainer.validate_and_should_stop

    def slow_validation():
        clock.now += 63.0
        return validate()

    trainer.validate_and_should_stop = slow_validation
    result = trainer.fit()
    plan, last = plans(tmp_path)[0], plans(tmp_path)[-1]  # re-planned after the validation
    validations = [r for r in map(json.loads, (tmp_path / "log.jsonl").read_text().splitlines())
                   if r["kind"] == "eval" and r["split"] == "val"]
    trained = plan["max_steps"] - plan["step"]
    assert plan["eval_every"] >= trained >= MIN_STEPS_PER_EVALUATION  # planned: one validation, at the end
    assert result.steps == last["max_steps"] >= plan["max_steps"]  # re-planned at the measured validation's speed
    assert len(validations) <= 2 and validations[-1]["step"] == result.steps  # not one after every step or two
    line = next(line for line in printed if line.startswith("time budget: "))
    assert f"only {trained} steps, fewer than the {FEW_STEPS} fine-tuning needs to show" in line
    assert "s go to the test split" in line and "to 1 validation(s)" in line
    assert clock.now <= 720  # the budget held on the slow clock
