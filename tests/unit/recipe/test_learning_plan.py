"""The time budget planned for learning: frozen stages and cached views from measured costs, so that a
slow machine trains hundreds of steps instead of a handful; the plan says what it measured and why."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from dmlkit.models import create_model
from dmlkit.recipe.budget_planner import SAFETY_MARGIN, evaluation_count
from dmlkit.recipe.learning_plan import (
    TARGET_STEPS,
    StageCost,
    embed_seconds,
    measure_stage_costs,
    plan_learning,
)

# Seconds per training image on a slow CPU without bf16, EfficientNet-Lite0 at 224 px (the machine: a step of
# 64 photos with 2 frozen stages took 7.3 s; an embedded image 0.05 s a view): the frozen stages' pass and a step from
# their output, for 2 to 5 frozen stages.
SLOW = [StageCost(2, 0.030, 0.084, 24 * 56 * 56 * 2), StageCost(3, 0.040, 0.060, 40 * 28 * 28 * 2),
        StageCost(4, 0.046, 0.030, 112 * 14 * 14 * 2), StageCost(5, 0.048, 0.004, 320 * 7 * 7 * 2)]
DEV_SET = dict(train_images=2560, batch=64, val_images=640, test_images=3200)


def test_a_slow_machine_plans_hundreds_of_steps_behind_more_frozen_stages_and_the_cache():
    plan = plan_learning(time_budget=720, spent=100, embed_seconds=0.05, costs=SLOW, memory=2**33, **DEV_SET)
    # the recipe's 2 frozen stages without a cache: a 7.3-s step
    evaluations = evaluation_count(720, 640 * 0.05)
    left = 720 * (1 - SAFETY_MARGIN) - 100 - (640 * (1 + evaluations) + 3200) * 0.05
    recipe_steps = int(left / (64 * (0.030 + 0.084)))
    assert recipe_steps < 50
    assert plan.frozen_stages == 5 and plan.views == 2  # a second view still leaves TARGET_STEPS steps
    assert plan.steps == int((left - 2 * 2560 * 0.048) / (64 * 0.004)) >= TARGET_STEPS
    assert int((left - 3 * 2560 * 0.048) / (64 * 0.004)) < TARGET_STEPS  # a third would not
    # what it measured and why it chose
    assert plan.reason.startswith(f"the fewest frozen stages whose plan buys {TARGET_STEPS} steps")
    for frozen in (2, 3, 4, 5):
        assert f"{frozen} frozen: " in plan.reason
    assert "3200 test images" in plan.reason and "50.0 ms an image" in plan.reason


def test_a_fast_machine_keeps_the_most_layers_training():
    fast = [StageCost(c.frozen_stages, c.prefix / 20, c.step / 20, c.view_bytes) for c in SLOW]
    plan = plan_learning(time_budget=720, spent=20, embed_seconds=0.0025, costs=fast, memory=2**33, **DEV_SET)
    assert plan.frozen_stages == 2 and plan.steps >= TARGET_STEPS
    assert plan.views >= 2  # long runs cache several views (one per 3 epochs)


def test_a_plan_short_of_the_target_says_so_and_why():
    plan = plan_learning(time_budget=720, spent=300, embed_seconds=0.1, costs=SLOW, memory=2**33, **DEV_SET)
    assert plan.steps < TARGET_STEPS
    assert plan.reason.startswith(f"SHORT OF {TARGET_STEPS} STEPS") and "the embeddings alone take" in plan.reason


def test_a_budget_too_small_to_train_says_so_and_what_it_buys_instead():
    """120 s on the slow machine: the embeddings alone take the budget; the plan says so before spending it."""
    plan = plan_learning(time_budget=120, spent=30, embed_seconds=0.05, costs=SLOW, memory=2**33, **DEV_SET)
    assert plan.steps == 0
    assert plan.too_small.startswith("the 120-s budget is too small to train here (30 s spent before the plan")
    assert "the pretrained backbone alone, evaluated in about 224 s" in plan.too_small  # (640 x 2 + 3200) x 0.05
    needed = int(plan.too_small.rsplit("train.time_budget=", 1)[1].split()[0])
    roomy = plan_learning(time_budget=needed, spent=30, embed_seconds=0.05, costs=SLOW, memory=2**33, **DEV_SET)
    assert roomy.steps >= TARGET_STEPS * 0.9 and not roomy.too_small  # the budget it names trains about that


def test_the_memory_cap_limits_the_cached_views():
    fast = [StageCost(2, 0.0015, 0.004, 24 * 56 * 56 * 2)]
    roomy = plan_learning(time_budget=720, spent=20, embed_seconds=0.0025, costs=fast, memory=2**33, **DEV_SET)
    tight = plan_learning(time_budget=720, spent=20, embed_seconds=0.0025, costs=fast,
                          memory=2 * 2560 * 24 * 56 * 56 * 2, **DEV_SET)
    assert roomy.views > 2 and tight.views == 2


def test_plan_learning_needs_costs():
    with pytest.raises(ValueError, match="at least one frozen-stage count"):
        plan_learning(time_budget=720, spent=0, embed_seconds=0.01, costs=[], **DEV_SET)


def test_measured_costs_fall_with_more_frozen_stages_and_the_model_is_left_as_it_was():
    torch.manual_seed(0)
    model = create_model("efficientnet_lite0", pretrained=False, embedding_size=None, pooling="gem",
                         head_init="identity", freeze_bn=True, frozen_stages=2, flip_average=True)
    trainable = {name: p.requires_grad for name, p in model.named_parameters()}
    costs = measure_stage_costs(model, [2, 5], 64, device=torch.device("cpu"), dtype=None)
    assert [c.frozen_stages for c in costs] == [2, 5]
    assert costs[0].view_bytes == 24 * 16 * 16 * 2 and costs[1].view_bytes == 320 * 2 * 2 * 2  # bf16 stored views
    assert costs[1].prefix > costs[0].prefix  # more stages run once per cached view ...
    assert all(c.prefix > 0 and c.step > 0 for c in costs)
    assert {name: p.requires_grad for name, p in model.named_parameters()} == trainable
    assert model.trunk.frozen_stages == 2 and model.training and all(p.grad is None for p in model.parameters())
    assert embed_seconds(model, 64, device=torch.device("cpu"), dtype=None) > 0 and model.training


def test_each_cost_is_the_fastest_of_its_timed_passes(monkeypatch):
    """A pass slowed by noise (a cache miss, a busy sibling hyperthread) only adds time: the fastest of
    TIMED_PASSES passes is kept, for the frozen-stage costs and the embedding alike."""
    from dmlkit.recipe import learning_plan

    calls: list[int] = []

    def fake_timings(fn, device, repeats=2, clock=None):
        calls.append(repeats)
        fn()
        return sorted([0.8, 0.4, 0.6, 1.6, 0.5][:repeats])

    monkeypatch.setattr(learning_plan, "timings", fake_timings)
    model = create_model("efficientnet_lite0", pretrained=False, embedding_size=None, pooling="gem",
                         head_init="identity", freeze_bn=True, frozen_stages=2)
    passes: list[list[float]] = []
    costs = measure_stage_costs(model, [4], 32, device=torch.device("cpu"), dtype=None, passes=passes, batch=2)
    fastest = min([0.8, 0.4, 0.6, 1.6, 0.5][:learning_plan.TIMED_PASSES])
    assert calls == [learning_plan.TIMED_PASSES] * 2 and learning_plan.TIMED_PASSES >= 2
    assert costs[0].prefix == pytest.approx(fastest / 2) and costs[0].step == pytest.approx(fastest / 2)
    assert all(len(p) == learning_plan.TIMED_PASSES for p in passes)
    assert embed_seconds(model, 32, device=torch.device("cpu"), dtype=None, batch=2) == pytest.approx(fastest / 2)
    assert calls[-1] == learning_plan.TIMED_PASSES


def test_a_slow_machine_trainer_freezes_more_stages_and_caches_before_the_first_step(tmp_path, monkeypatch):
    """The trainer's one call (``plan_frozen_stages``) on a folder of photos whose costs are the slow machine's: the
    recipe's 2 frozen stages would buy under 100 steps; the run freezes more, caches, and prints what it measured."""
    from dmlkit.config import load_config
    from dmlkit.recipe import Trainer, learning_plan

    spec = importlib.util.spec_from_file_location("photo_folders", Path(__file__).with_name("test_view_size.py"))
    photo_folders = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(photo_folders)  # its write_photos: classes of JPEG photos any view tells apart
    root = photo_folders.write_photos(tmp_path / "photos", 96, classes=8, per_class=5)
    measured: list[list[int]] = []

    def slow_costs(model, counts, crop, *, device, dtype, passes=None, **timed_on):
        measured.append(sorted(counts))
        return [c for c in SLOW if c.frozen_stages in counts]

    monkeypatch.setattr(learning_plan, "measure_stage_costs", slow_costs)
    monkeypatch.setattr(learning_plan, "embed_seconds", lambda *args, **kwargs: 0.05)
    printed: list[str] = []
    cfg = load_config(preset="mnist-proxy-anchor", overrides=[
        "data.name=folder", f"data.root={root}", "train.progress=false", "eval.clustering=false",
        "eval.save_embeddings=false", "eval.batch_size=16", "data.image_size=96", "train.time_budget=50"])
    trainer = Trainer(cfg, tmp_path / "run", echo=printed.append)
    cfg = trainer.cfg  # the finished config (the one given is left as it was)
    assert measured == [[2, 3, 4, 5]]  # from the recipe's count to the backbone's last stage
    frozen = cfg.model.frozen_stages
    assert frozen > 2 and trainer.model.trunk.frozen_stages == frozen
    assert not any(p.requires_grad for p in trainer.model.trunk.model.blocks[frozen - 1].parameters())
    views = cfg.train.cache_views
    assert 1 <= views <= 8 and not trainer.cache_deferred  # built before the first step
    # the plan made again with the recipe's batch and step ceiling, said last: the steps the run takes
    line = [line for line in printed if "model.frozen_stages = " in line][-1]
    assert f"model.frozen_stages = {frozen}" in line
    assert f"the fewest frozen stages whose plan buys {cfg.train.max_steps} steps" in line
    assert all(f"{count} frozen: " in line for count in (2, 3, 4, 5) if count != frozen)
    assert f"{frozen} frozen: {views} cached views" in line and "steps (the ceiling, train.max_steps)" in line
    assert any(f"train.cache_views = {views}" in line for line in printed)
