"""The time budget is the wall time the user sees: the plan's measuring stays within its share of the budget, the
plan printed is the one the run takes (steps capped at the ceiling, cached views sized for them), and a budget too
small to train says so before training. Fake costs and clocks: nothing is trained."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dmlkit.models import create_model
from dmlkit.recipe import backbone_choice, learning_plan
from dmlkit.recipe import measurements as measurements_module
from dmlkit.recipe.budget_planner import SAFETY_MARGIN, Speeds, plan_run
from dmlkit.recipe.feature_cache_plan import EPOCHS_PER_VIEW
from dmlkit.recipe.learning_plan import StageCost, measure_stage_costs, plan_learning
from dmlkit.recipe.measurements import Measurements

# seconds per training image through the frozen stages and of a step from them, 2 to 5 frozen (a slow CPU)
SLOW = [StageCost(2, 0.030, 0.084, 24 * 56 * 56 * 2), StageCost(3, 0.040, 0.060, 40 * 28 * 28 * 2),
        StageCost(4, 0.046, 0.030, 112 * 14 * 14 * 2), StageCost(5, 0.048, 0.004, 320 * 7 * 7 * 2)]
GROCERY = dict(train_images=150, batch=30, val_images=50, test_images=100)


class FakeClock:
    """``time.perf_counter`` and ``time.process_time`` that advance only when a probe says it took time (work on
    one thread: its CPU seconds are its wall seconds on an idle machine)."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    process_time = perf_counter


def test_the_plan_takes_the_ceiling_and_sizes_the_cached_views_for_it():
    plan = plan_learning(time_budget=120, spent=10, embed_seconds=0.02, costs=SLOW, memory=2**33, ceiling=200,
                         **GROCERY)
    assert plan.steps == 200 and plan.frozen_stages == 5  # what the budget buys is more: the ceiling is taken
    assert "-> 200 steps (the ceiling, train.max_steps)" in plan.reason
    epochs = plan.steps * GROCERY["batch"] / GROCERY["train_images"]
    assert 1 <= plan.views and epochs >= EPOCHS_PER_VIEW * plan.views  # each view serves its epochs of those steps
    unbounded = plan_learning(time_budget=120, spent=10, embed_seconds=0.02, costs=SLOW, memory=2**33, **GROCERY)
    assert unbounded.steps > 200  # the same costs without the ceiling: more steps than the run would take


@pytest.mark.parametrize("budget", [120, 240])
def test_the_steps_the_plan_prints_are_the_steps_the_budget_keeps_at_those_speeds(budget):
    """The trainer's budget plan (recipe/budget_planner.py), fed the speeds the learning plan assumed after the
    planning, the step-0 validation and the cache, keeps the plan's steps (or within a tenth where the budget
    binds: it spreads its validations itself)."""
    embed, spent = 0.02, 10.0
    plan = plan_learning(time_budget=budget, spent=spent, embed_seconds=embed, costs=SLOW, memory=2**33,
                         ceiling=200 if budget == 120 else 100_000, **GROCERY)
    cost = next(c for c in SLOW if c.frozen_stages == plan.frozen_stages)
    step = GROCERY["batch"] * (cost.step if plan.views else cost.prefix + cost.step)
    before = spent + GROCERY["val_images"] * embed + plan.views * GROCERY["train_images"] * cost.prefix
    kept = plan_run(budget, before, 0, plan.inputs["ceiling"], 25,
                    Speeds(step, GROCERY["val_images"] * embed, GROCERY["test_images"] * embed), has_val=True)
    if budget == 120:
        assert kept.max_steps == plan.steps == 200 and not kept.binds
    else:
        assert kept.binds and abs(kept.max_steps - plan.steps) <= 0.1 * plan.steps
        assert kept.seconds <= budget * (1 - SAFETY_MARGIN) + 1e-6


@pytest.fixture
def slow_probes(monkeypatch):
    """Each backbone measurement takes 10 s on a fake clock; the candidates cost what a slow CPU would."""
    clock, measured = FakeClock(), []

    def measure(name, train_size, eval_size, *_):
        measured.append(name)
        clock.now += 10.0
        scale = {"efficientnet_lite0": 1.0, "efficientnet_lite1": 1.5, "efficientnet_lite2": 2.3}[name]
        return backbone_choice.BackboneCost(0.5 * scale, 0.2 * scale, train_size, eval_size), [[1.0, 1.0]]

    monkeypatch.setattr(backbone_choice, "_measure", measure)
    monkeypatch.setattr(backbone_choice, "_MEASURED", {})
    monkeypatch.setattr(measurements_module, "time", clock)
    monkeypatch.setattr(backbone_choice, "time", clock)
    monkeypatch.setattr(measurements_module, "usable_cpus", lambda: 2)
    monkeypatch.setattr(measurements_module.timing, "threads_used", lambda: 1)  # the probe's seconds are its work
    monkeypatch.setattr(measurements_module.os, "getloadavg", lambda: (0.5, 0.5, 0.5))  # an idle machine
    return measured


def _photo_survey(classes=12, per_class=25, size=96):
    from dmlkit.data.base import DataSplits, TensorImageDataset

    images = torch.randint(0, 256, (classes * per_class, 3, size, size), generator=torch.Generator().manual_seed(0)).to(torch.uint8)
    labels = torch.arange(classes).repeat_interleave(per_class)
    data = TensorImageDataset(images, labels, [f"c{i}" for i in range(classes)])
    return DataSplits(name="photos", train=data, test=data)


@pytest.mark.parametrize("allowance, measured", [(12.0, ["efficientnet_lite2"]),
                                                 (100.0, ["efficientnet_lite2", "efficientnet_lite1"])])
def test_a_slow_probe_spends_the_allowance_and_the_plan_says_what_it_left_out(slow_probes, allowance, measured):
    from dmlkit.config import load_config
    from dmlkit.recipe.planner import apply_model_recipe

    cfg = load_config(preset="mnist-proxy-anchor", overrides=["train.time_budget=120"])
    survey = _photo_survey()
    choices = apply_model_recipe(cfg, survey)
    tape = Measurements.live()
    tape.allowance = allowance
    backbone_choice.choose_for_run(cfg, survey, choices, torch.device("cpu"), measurements=tape)
    assert slow_probes == measured and cfg.model.name == "efficientnet_lite0"
    if allowance == 12.0:  # 10 s of 12 gone: the next candidate's 10-s measurement does not fit what is left
        assert "efficientnet_lite1 not measured (the plan's measuring allowance is spent)" in choices["model.name"][1]
        assert tape.bounded() == ("plan: measuring took 10 s of work of its 12-s allowance; not measured, the recipe's rule "
                                  "instead: the cost of efficientnet_lite1 (about 10 s)")
    else:
        assert tape.bounded() is None and tape.measuring == 20.0


def test_a_loaded_machine_measures_the_candidates_an_idle_one_measures(slow_probes, monkeypatch):
    """The allowance counts work (CPU seconds per thread), not wall time: beside work that takes three quarters of
    the cores the same candidates are measured (the probes' wall time grows, their work does not), so the plan does
    not follow the load."""
    from dmlkit.config import load_config
    from dmlkit.recipe.planner import apply_model_recipe

    picked = {}
    for load in (0.5, 8.0):
        monkeypatch.setattr(measurements_module.os, "getloadavg", lambda load=load: (load, load, load))
        slow_probes.clear()
        cfg = load_config(preset="mnist-proxy-anchor", overrides=["train.time_budget=120"])
        survey = _photo_survey()
        choices = apply_model_recipe(cfg, survey)
        tape = Measurements.live()
        tape.allowance = 12.0
        backbone_choice.choose_for_run(cfg, survey, choices, torch.device("cpu"), measurements=tape)
        picked[load] = (list(slow_probes), cfg.model.name, tape.left_out)
    assert picked[0.5] == picked[8.0] == (["efficientnet_lite2"], "efficientnet_lite0",
                                          ["the cost of efficientnet_lite1 (about 10 s)"])


def test_the_frozen_stage_probe_measures_the_ends_first_and_stops_when_the_allowance_is_spent():
    torch.manual_seed(0)
    model = create_model("efficientnet_lite0", pretrained=False, embedding_size=None, pooling="gem",
                         head_init="identity", freeze_bn=True, frozen_stages=2, flip_average=False)
    asked: list[int] = []
    costs = measure_stage_costs(model, [5, 2, 3, 4], 32, device=torch.device("cpu"), dtype=None, batch=2,
                                enough=lambda: asked.append(1) or True)
    assert [c.frozen_stages for c in costs] == [2, 5] and asked == [1]  # the two ends, then the allowance ends it
    assert model.trunk.frozen_stages == 2


def test_a_budget_too_small_to_train_says_so_before_training_with_what_it_buys(tmp_path, monkeypatch, slow_probes):
    from dmlkit.config import load_config
    from dmlkit.recipe import prepare_run

    spec = importlib.util.spec_from_file_location("photo_folders", Path(__file__).with_name("test_view_size.py"))
    photo_folders = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(photo_folders)
    root = photo_folders.write_photos(tmp_path / "photos", 96, classes=8, per_class=5)
    monkeypatch.setattr(learning_plan, "measure_stage_costs",
                        lambda model, counts, crop, **_: [c for c in SLOW if c.frozen_stages in counts])
    printed: list[str] = []
    cfg = load_config(preset="mnist-proxy-anchor", overrides=[
        "data.name=folder", f"data.root={root}", "train.progress=false", "eval.batch_size=16",
        "data.image_size=96", "train.time_budget=3"])
    resolved = prepare_run(cfg, echo=printed.append)
    said = next(line for line in printed if "too small to train" in line)
    assert said.startswith("plan: the 3-s budget is too small to train here")
    assert "the pretrained backbone alone, evaluated in about" in said and "train.time_budget=" in said
    assert resolved.format().count("no training step fits the 3-s budget") == 1


def test_the_live_budget_counts_the_planning_before_the_first_step(tmp_path, tiny_config):
    """The trainer's clock starts where the plan started (the command's start): the seconds the plan took are gone
    from the budget the steps are fitted to."""
    from dmlkit.recipe import Trainer
    from dmlkit.recipe.time_budget import TimeBudget

    steps = {}
    for planning in (0.0, 30.0):
        trainer = Trainer(tiny_config("train.max_steps=1000", "train.time_budget=100"), tmp_path / f"p{planning:.0f}",
                          echo=lambda _: None)
        clock = SimpleNamespace(now=0.0)
        trainer.clock = lambda: clock.now
        budget = TimeBudget.of(trainer)  # the budget's wall clock counts from the run's start
        budget.wall_clock, budget.started = (lambda: clock.now), -planning  # the plan began this long before
        step = trainer.training_step

        def timed(*args, step=step, clock=clock):
            clock.now += 1.0
            return step(*args)

        trainer.training_step = timed
        steps[planning] = trainer.fit().steps
    assert steps[0.0] - steps[30.0] == 30  # a second a step: the 30 s of planning are 30 steps fewer
