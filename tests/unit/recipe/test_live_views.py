"""Cached views sized to the speed the machine gives while they are built: beyond one view, the plan's steps at
the live speed must still reach its target, or the rest of the budget trains."""

from types import SimpleNamespace

from dmlkit.engine.frozen_stage_cache import CachePlan
from dmlkit.recipe import time_budget as tb
from dmlkit.recipe.budget_planner import FEW_STEPS
from dmlkit.recipe.measurements import Measurements


def test_live_slowdown_is_the_cores_over_those_left_to_the_run():
    assert tb.live_slowdown(None, 2) == 1.0  # the machine does not say
    assert tb.live_slowdown(0.3, 2) == 1.0  # background noise is not a load
    assert tb.live_slowdown(1.0, 2) == 2.0
    assert tb.live_slowdown(3.0, 4) == 4.0
    assert tb.live_slowdown(5.0, 2) == 4.0  # never more than the cores over half a core


def test_views_beyond_one_need_the_target_steps_at_the_live_speed():
    assert tb.views_at_live_speed(1, 50, 4.0)  # one view is always built
    assert tb.views_at_live_speed(3, 356, 1.0)
    assert tb.views_at_live_speed(3, 2 * FEW_STEPS, 2.0)
    assert not tb.views_at_live_speed(3, 356, 2.0)  # 178 steps beside one busy process on 2 cores
    assert not tb.views_at_live_speed(2, 150, 1.3)  # a ceiling below the target: any real slowdown
    assert tb.views_at_live_speed(2, 150, 1.0)


def budget_of(steps, wall=0.0):
    resolved = SimpleNamespace(cfg=SimpleNamespace(train=SimpleNamespace(time_budget=720.0)), started=0.0,
                               measurements=Measurements(), embed_seconds=None,
                               cache_plan=CachePlan(True, 3, "planned", steps=steps))
    return tb.TimeBudget(resolved, wall_clock=lambda: wall)


def test_a_loaded_machine_builds_one_view_and_records_the_load_it_read(monkeypatch):
    monkeypatch.setattr(tb, "usable_cpus", lambda: 2)
    monkeypatch.setattr(tb.OtherWork, "cores", lambda self: 1.0)  # one busy process beside the run
    budget = budget_of(356)
    out_of_time = budget._cache_out_of_time()
    assert out_of_time(12.0)  # after the first view: 178 steps at half speed, short of the target
    assert budget.tape.tape == [{"name": "slowdown while building cached view 1", "value": 2.0}]
    replay = budget_of(356)
    replay.tape = Measurements(budget.tape.tape)
    monkeypatch.setattr(tb.OtherWork, "cores", lambda self: 0.0)  # idle now: the replay builds as the run did
    assert replay._cache_out_of_time()(12.0)


def test_an_idle_machine_builds_the_planned_views(monkeypatch):
    monkeypatch.setattr(tb.OtherWork, "cores", lambda self: 0.0)
    out_of_time = budget_of(356)._cache_out_of_time()
    assert not out_of_time(12.0) and not out_of_time(12.0)
    assert budget_of(356, wall=350.0)._cache_out_of_time()(12.0)  # past half the budget: no further view
    assert not budget_of(None)._cache_out_of_time()(12.0)  # views not planned for steps: as before
