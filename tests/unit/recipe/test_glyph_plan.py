"""The glyph recipe plans its steps, members and validations for the machine it finds.

A clock that advances a fixed time per reading stands in for a slow or a fast machine: every timed
pass of :func:`measure_glyph_costs` then takes exactly that long, so the plan is known in advance.
"""

from __future__ import annotations

import math

import pytest
import torch

from dmlkit.models import EmbedderEnsemble, create_model
from dmlkit.recipe import Trainer, glyph_plan, prepare_run
from dmlkit.recipe import rules as recipe
from dmlkit.recipe.budget_planner import SAFETY_MARGIN
from dmlkit.recipe.glyph_plan import (
    MIN_STEP_SHARE,
    STEP_MARGIN,
    TIMED_IMAGES,
    GlyphCosts,
    measure_glyph_costs,
    plan_glyphs,
)
from dmlkit.recipe.time_budget import TimeBudget

#: Omniglot's development set as the recipe sees it: 1,249 steps of 3 members, 10 validations of 280 images,
#: 1,360 test images, the 80-s budget of small images.
OMNIGLOT = dict(time_budget=recipe.SMALL_IMAGE_TIME_BUDGET, spent=5.0, steps=1249, members=3, evaluations=10,
                val_images=280, test_images=1360)


class TickClock:
    """A clock that advances ``seconds`` at every reading: each timed pass (two readings) takes ``seconds``."""

    def __init__(self, seconds: float):
        self.now, self.seconds = 0.0, seconds

    def __call__(self) -> float:
        self.now += self.seconds
        return self.now


def predicted_seconds(plan, costs: GlyphCosts, spent: float, val_images: int, test_images: int) -> float:
    """The plan's end, written out independently of plan_glyphs: steps of every member, then the embeddings."""
    return spent + plan.steps * (costs.shared + plan.members * costs.step) + \
        (val_images * plan.evaluations + test_images) * plan.members * costs.embed


def test_a_fast_machine_keeps_the_recipe():
    costs = GlyphCosts(step=0.010, embed=0.0002, views=25)  # 37 s of steps, 0.6 s of embeddings
    plan = plan_glyphs(**OMNIGLOT, costs=costs)
    assert (plan.members, plan.steps, plan.evaluations, plan.binds) == (3, 1249, 10, False)
    assert plan.eval_every == 125  # rounded up: 10 validations, the last at step 1,249 (not 11)
    assert -(-plan.steps // plan.eval_every) == plan.evaluations
    assert plan.seconds == pytest.approx(predicted_seconds(plan, costs, 5.0, 280, 1360))
    assert "10 ms a training step of one member" in plan.reason and "25 shifts" in plan.reason


def test_a_slower_machine_drops_members_before_steps():
    costs = GlyphCosts(step=0.022, embed=0.0004, views=25)  # 3 members: 82 s of steps (1,024 fit: 82 %); 2: 55 s
    plan = plan_glyphs(**OMNIGLOT, costs=costs)
    assert plan.binds and (plan.members, plan.steps, plan.evaluations) == (2, 1249, 10)
    assert plan.seconds == pytest.approx(predicted_seconds(plan, costs, 5.0, 280, 1360))
    assert plan.seconds <= OMNIGLOT["time_budget"] * (1 - SAFETY_MARGIN)
    assert "3 member(s): " in plan.reason and "2 member(s): 1249 steps" in plan.reason
    assert "22 ms a training step of one member" in plan.reason
    # a member stays while it buys MIN_STEP_SHARE (85 %) of the steps at the measured speed (STEP_MARGIN 1): at 22 ms
    # three members buy 1,024 steps (82 %), so two members stay; at 20 ms they buy 1,126 (90 %) and stay, the steps
    # cut to those
    assert STEP_MARGIN == 1.0
    left = OMNIGLOT["time_budget"] * (1 - SAFETY_MARGIN) - 5.0 - (280 * 10 + 1360) * 0.0004 * 3
    assert int(left / (3 * 0.022)) == 1024 < MIN_STEP_SHARE * 1249 and "3 member(s): 1024 steps" in plan.reason
    assert "85% of the recipe's 1249 steps (members go before steps" in plan.reason
    close = plan_glyphs(**OMNIGLOT, costs=GlyphCosts(step=0.020, embed=0.0004, views=25))
    assert int(left / (3 * 0.020)) == 1126 >= MIN_STEP_SHARE * 1249
    assert close.binds and (close.members, close.steps) == (3, 1126)
    # three members that hold their share even slower keep it, with the steps cut to what fits at the measured speed
    cut = plan_glyphs(**OMNIGLOT, costs=GlyphCosts(step=0.0188, embed=0.0004, views=25))
    bought = int(left / (3 * 0.0188))
    assert STEP_MARGIN * MIN_STEP_SHARE * 1249 <= bought < 1249
    assert cut.binds and (cut.members, cut.steps) == (3, bought)
    assert cut.seconds <= OMNIGLOT["time_budget"] * (1 - SAFETY_MARGIN)
    # ... and a machine fast enough for all of them keeps the recipe's three members and steps
    held = plan_glyphs(**OMNIGLOT, costs=GlyphCosts(step=0.0170, embed=0.0004, views=25))
    assert (held.members, held.steps, held.binds) == (3, 1249, False)
    assert plan_glyphs(**OMNIGLOT, costs=GlyphCosts(step=0.045, embed=0.0005)).members == 1


def test_a_slow_machine_gets_fewer_steps_that_fit_the_budget():
    costs = GlyphCosts(step=0.080, embed=0.0004, views=25)  # one member's 1,249 steps: 100 s
    plan = plan_glyphs(**OMNIGLOT, costs=costs)
    assert plan.binds and plan.members == 1 and plan.steps < 1249
    usable = recipe.SMALL_IMAGE_TIME_BUDGET * (1 - SAFETY_MARGIN)
    end = predicted_seconds(plan, costs, 5.0, 280, 1360)
    assert end <= usable and plan.seconds == pytest.approx(end)
    assert end + 3 * costs.step > usable  # the steps are what fits, not fewer
    assert plan.eval_every == -(-plan.steps // plan.evaluations)  # rounded up: no extra validation at the end
    assert "do not fit the 80-s budget" in plan.reason and "80 ms a training step of one member" in plan.reason
    crawling = plan_glyphs(**OMNIGLOT, costs=GlyphCosts(step=0.5, embed=0.001))
    assert crawling.members == 1 and 1 <= crawling.steps < 0.2 * 1249
    assert "no member count buys" in crawling.reason
    floored = plan_glyphs(**OMNIGLOT, costs=GlyphCosts(step=0.5, embed=0.001), floor=400)
    assert (floored.members, floored.steps) == (1, 400) and floored.seconds > OMNIGLOT["time_budget"]
    assert "no fewer than 400 steps" in floored.reason


def test_without_validation_no_validation_is_planned():
    plan = plan_glyphs(**{**OMNIGLOT, "evaluations": 0, "val_images": 0, "members": 1},
                       costs=GlyphCosts(step=0.1, embed=0.001))
    assert plan.evaluations == 0 and plan.eval_every == plan.steps and plan.binds


def test_measured_costs_follow_the_clock_and_leave_the_model_and_the_random_state_alone():
    model = create_model("small_cnn", embedding_size=16, width=4, in_chans=1, shift_average=2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.random.get_rng_state()
    costs = measure_glyph_costs(model, 8, (1, 28, 28), views=25, device=torch.device("cpu"), dtype=None,
                                clock=TickClock(0.25))
    assert costs.step == pytest.approx(0.25) and costs.views == 25
    assert costs.embed == pytest.approx(0.25 / TIMED_IMAGES * 25)
    assert torch.equal(torch.random.get_rng_state(), rng)
    assert model.shift_average == 2 and model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # BN statistics too


def test_the_member_step_is_timed_with_its_loss_and_the_shared_augmentation_once():
    from dmlkit.data.transforms import RandomAffine
    from dmlkit.losses import ProxyAnchorLoss

    model = create_model("small_cnn", embedding_size=16, width=4, in_chans=1)
    objective = ProxyAnchorLoss(num_classes=5, embedding_size=16)
    proxies, rng = objective.proxies.detach().clone(), torch.random.get_rng_state()
    calls = []

    def augment(images, generator):
        calls.append(images.shape)
        return RandomAffine()(images, generator)

    labels = torch.arange(8) // 2 % 5
    costs = measure_glyph_costs(model, 8, (1, 28, 28), views=1, device=torch.device("cpu"), dtype=None,
                                clock=TickClock(0.25), objective=objective, labels=labels, augment=augment)
    assert costs.step == pytest.approx(0.25) and costs.shared == pytest.approx(0.25)
    assert calls and all(shape == (8, 1, 28, 28) for shape in calls)
    assert torch.equal(objective.proxies, proxies) and objective.proxies.grad is None  # a copy was trained
    assert torch.equal(torch.random.get_rng_state(), rng)
    # the shared cost is paid once a step, whatever the members: 3 members of 10 ms and 2 ms shared = 32 ms a step
    plan = plan_glyphs(**OMNIGLOT, costs=GlyphCosts(step=0.010, embed=0.0002, views=25, shared=0.002))
    assert (plan.members, plan.steps) == (3, 1249)
    assert plan.seconds == pytest.approx(5.0 + 1249 * 0.032 + (280 * 10 + 1360) * 3 * 0.0002)
    assert "2.0 ms a batch's augmentation" in plan.reason


def run_on_clock(monkeypatch, tiny_config, seconds: float, *overrides: str):
    """resolve_run of the tiny default job with the steps left to the recipe, every timed pass taking ``seconds``;
    returns (resolved run, printed lines, the recipe's own steps)."""
    measure = glyph_plan.measure_glyph_costs
    monkeypatch.setattr(glyph_plan, "measure_glyph_costs",
                        lambda *args, **kwargs: measure(*args, **{**kwargs, "clock": TickClock(seconds)}))
    lines = []
    left_to_recipe = ("train.max_steps=null", "train.eval_every=null", *overrides)
    resolved = prepare_run(tiny_config(*left_to_recipe), echo=lines.append)
    recipe_steps = recipe.resolve(tiny_config(*left_to_recipe), resolved.recipe.profile)["train.max_steps"][0]
    return resolved, lines, recipe_steps


def test_a_fast_machine_keeps_the_recipe_steps_and_says_what_it_measured(monkeypatch, tiny_config):
    resolved, _, recipe_steps = run_on_clock(monkeypatch, tiny_config, 1e-5)
    cfg = resolved.cfg
    assert cfg.train.time_budget == recipe.SMALL_IMAGE_TIME_BUDGET  # MNIST digits in memory, from scratch
    value, reason = resolved.choices["train.max_steps"]
    assert value == cfg.train.max_steps == recipe_steps
    assert "fit the 80-s budget" in reason and "0 ms a training step of one member" in reason


def test_a_slow_machine_cuts_a_budget_set_by_hand_to_what_fits(monkeypatch, tiny_config):
    resolved, lines, recipe_steps = run_on_clock(monkeypatch, tiny_config, 0.5, "train.time_budget=80")
    value, reason = resolved.choices["train.max_steps"]
    usable = 80 * (1 - SAFETY_MARGIN)
    assert 1 <= value < recipe_steps and value * 0.5 <= usable and value == resolved.cfg.train.max_steps
    assert resolved.cfg.train.time_budget == 80  # a budget set by hand stays
    assert "do not fit the 80-s budget" in reason and "500 ms a training step of one member" in reason
    assert any(line.startswith("recipe:   train.max_steps = ") and "planned to the time budget" in line
               for line in lines)


def test_the_trainer_estimates_the_test_split_from_the_measured_embedding(monkeypatch, tiny_config, tmp_path):
    resolved, _, _ = run_on_clock(monkeypatch, tiny_config, 0.5, "train.time_budget=80")
    assert resolved.embed_seconds == pytest.approx(0.5 / TIMED_IMAGES)  # one member, no shifts (tiny_config)
    trainer = Trainer(resolved, tmp_path, echo=lambda _: None)
    speeds = TimeBudget.of(trainer).measured_speeds(trainer, 2.0, has_val=False)  # before any validation
    assert speeds.test_seconds == pytest.approx(len(resolved.splits.test) * 0.5 / TIMED_IMAGES)


def test_on_a_crawling_machine_the_recipe_raises_its_own_budget_rather_than_train_a_few_steps(monkeypatch,
                                                                                               tiny_config):
    resolved, _, recipe_steps = run_on_clock(monkeypatch, tiny_config, 0.5)
    cfg = resolved.cfg
    assert cfg.train.max_steps == math.ceil(glyph_plan.FLOOR_SHARE * recipe_steps)
    assert cfg.train.time_budget > recipe.SMALL_IMAGE_TIME_BUDGET
    assert cfg.train.time_budget * (1 - SAFETY_MARGIN) >= cfg.train.max_steps * 0.5  # the trainer keeps the floor
    assert "raised from 80 s" in resolved.choices["train.time_budget"][1]
    assert "takes longer than the budget" in resolved.choices["train.max_steps"][1]


def test_steps_set_by_hand_are_not_planned(monkeypatch, tiny_config):
    def fail(*args, **kwargs):
        raise AssertionError("measured although train.max_steps was set")

    monkeypatch.setattr(glyph_plan, "measure_glyph_costs", fail)
    resolved = prepare_run(tiny_config("train.time_budget=30"), echo=lambda _: None)
    assert resolved.cfg.train.max_steps == 4  # tiny_config's


def test_members_set_by_hand_are_timed_one_at_a_time(monkeypatch, tiny_config):
    # model.ensemble set by hand builds the whole ensemble before the plan; the plan multiplies one member's costs
    # by the members, so it must time one member (timing all of them over-counted 4 members 4 times over)
    timed = []
    measure = glyph_plan.measure_glyph_costs

    def spy(model, *args, **kwargs):
        timed.append(model)
        return measure(model, *args, **{**kwargs, "clock": TickClock(1e-5)})

    monkeypatch.setattr(glyph_plan, "measure_glyph_costs", spy)
    resolved = prepare_run(tiny_config("train.max_steps=null", "train.eval_every=null", "model.ensemble=3"),
                           echo=lambda _: None)
    assert isinstance(resolved.model, EmbedderEnsemble) and len(resolved.model.members) == 3
    assert len(timed) == 1 and not isinstance(timed[0], EmbedderEnsemble)
    assert timed[0].embedding_size * 3 == resolved.model.embedding_size


def test_the_plan_reads_cpu_time_so_wall_time_lost_to_other_processes_leaves_it_unchanged(monkeypatch, tiny_config):
    """Every timed pass's wall time runs 0.5 s on (other processes hold the cores) while its CPU time does not:
    the same plan as without, and the load it saw said in one line."""
    import time
    from types import SimpleNamespace

    from dmlkit.engine import timing

    left_to_recipe = ("train.max_steps=null", "train.eval_every=null", "train.time_budget=80")
    plan_of = lambda resolved: (resolved.cfg.train.max_steps, resolved.cfg.train.eval_every,  # noqa: E731
                                resolved.cfg.model.ensemble)
    idle = prepare_run(tiny_config(*left_to_recipe), echo=lambda _line: None)
    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=TickClock(0.5), process_time=time.process_time))
    lines = []
    loaded = prepare_run(tiny_config(*left_to_recipe), echo=lines.append)
    assert plan_of(loaded) == plan_of(idle)
    assert not loaded.choices["train.max_steps"][1].startswith("planned to the time budget")  # the recipe's steps fit
    shared = [line for line in lines if line.startswith("plan: machine is shared")]
    assert len(shared) == 1 and "CPU share 0." in shared[0]
