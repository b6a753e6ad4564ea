"""The time-budget planner (recipe/budget_planner.py): steps and evaluation points that end a run inside its budget."""

from __future__ import annotations

import pytest

from dmlkit.recipe.budget_planner import (
    EVALUATIONS,
    SAFETY_MARGIN,
    Speeds,
    estimate_test_seconds,
    plan_run,
    seconds_left,
)


def _cost(step: int, steps: int, every: int, speeds: Speeds) -> float:
    """Wall time of steps (step, steps] with a validation at every multiple of ``every`` and at the last step,
    counted one by one (independently of the planner's closed form)."""
    total = speeds.test_seconds
    for s in range(step + 1, steps + 1):
        total += speeds.step_seconds
        if s % every == 0 or s == steps:
            total += speeds.eval_seconds
    return total


def test_small_data_keeps_the_recipe_steps():
    speeds = Speeds(step_seconds=0.5, eval_seconds=2.0, test_seconds=10.0)
    plan = plan_run(720.0, spent=20.0, step=4, ceiling=100, eval_every=10, speeds=speeds, has_val=True)
    assert (plan.max_steps, plan.eval_every, plan.binds) == (100, 10, False)
    assert plan.seconds == pytest.approx(20.0 + _cost(4, 100, 10, speeds))


@pytest.mark.parametrize("step_seconds", [0.5, 2.0, 8.0])  # a fast, a middling and a slow machine
def test_large_data_is_cut_to_end_inside_the_budget(step_seconds):
    budget, spent = 720.0, 60.0
    speeds = Speeds(step_seconds=step_seconds, eval_seconds=12.0, test_seconds=40.0)
    plan = plan_run(budget, spent, step=4, ceiling=100_000, eval_every=10_000, speeds=speeds, has_val=True)
    assert plan.binds
    end = spent + _cost(4, plan.max_steps, plan.eval_every, speeds)
    assert end <= budget * (1 - SAFETY_MARGIN) + 1e-6
    # most of the budget is used: one more step (and its evaluation) would not fit
    assert end + step_seconds + 12.0 > budget * (1 - SAFETY_MARGIN)
    evaluations = -(-(plan.max_steps - 4) // plan.eval_every)
    assert EVALUATIONS[0] - 1 <= evaluations <= EVALUATIONS[1] + 1
    assert plan.seconds == pytest.approx(end)


def test_cutting_steps_never_adds_validations():
    """Omniglot's seed-2 run of 2026-11-27: the recipe's 1,249 steps with 4 validations (every 313) did not fit the
    80-s budget on a busy machine; the cut plan spread 9 validations (every 107) instead of at most the recipe's 4."""
    speeds = Speeds(step_seconds=0.06, eval_seconds=1.2, test_seconds=6.0)
    plan = plan_run(80.0, 8.0, step=2, ceiling=1249, eval_every=313, speeds=speeds, has_val=True)
    assert plan.binds and plan.max_steps < 1249
    validations = -(-(plan.max_steps - 2) // plan.eval_every)
    assert 1 <= validations <= 4
    end = 8.0 + _cost(2, plan.max_steps, plan.eval_every, speeds)
    assert end <= 80.0 * (1 - SAFETY_MARGIN) + 1e-6 and plan.seconds == pytest.approx(end)
    # the budget's share alone would have allowed more: the recipe's interval is what caps them
    assert EVALUATIONS[1] > 4


def test_a_slower_machine_plans_fewer_steps():
    plans = [plan_run(720.0, 30.0, 4, 100_000, 100, Speeds(s, 10.0, 30.0), has_val=True) for s in (0.5, 1.0, 4.0)]
    steps = [p.max_steps for p in plans]
    assert steps[0] > steps[1] > steps[2] > 4


def test_replanning_keeps_the_interval_and_never_goes_back():
    speeds = Speeds(step_seconds=1.0, eval_seconds=5.0, test_seconds=20.0)
    plan = plan_run(720.0, 700.0, step=300, ceiling=1000, eval_every=200, speeds=speeds, has_val=True, interval=50)
    assert plan.eval_every == 50
    assert plan.max_steps == 300  # the budget is spent: stop where it is


def test_a_pessimistic_first_plan_is_undone_when_the_recipe_fits_after_all():
    speeds = Speeds(step_seconds=0.02, eval_seconds=1.0, test_seconds=5.0)
    plan = plan_run(720.0, 30.0, step=20, ceiling=1249, eval_every=124, speeds=speeds, has_val=True, interval=10)
    assert (plan.max_steps, plan.eval_every, plan.binds) == (1249, 124, False)


def test_without_validation_only_steps_and_test_count():
    speeds = Speeds(step_seconds=1.0, eval_seconds=99.0, test_seconds=20.0)
    plan = plan_run(200.0, 10.0, step=4, ceiling=10_000, eval_every=10_000, speeds=speeds, has_val=False)
    assert plan.max_steps == 4 + int(200 * (1 - SAFETY_MARGIN) - 10 - 20)


def test_seconds_left_counts_steps_validations_and_test():
    speeds = Speeds(step_seconds=2.0, eval_seconds=3.0, test_seconds=7.0)
    assert seconds_left(10, 30, 10, speeds, has_val=True) == pytest.approx(_cost(10, 30, 10, speeds))
    assert seconds_left(10, 35, 10, speeds, has_val=True) == pytest.approx(_cost(10, 35, 10, speeds))
    assert seconds_left(10, 30, 10, speeds, has_val=False) == pytest.approx(20 * 2.0 + 7.0)


def test_test_seconds_scale_with_the_split():
    assert estimate_test_seconds(6.0, num_val=600, num_test=3000) == pytest.approx(30.0)
