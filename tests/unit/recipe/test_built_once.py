"""Each object of a run is built once: the plan's probe model is the model the run trains, with the weights and the
random state a model built by the run from the seed would have."""

import dataclasses
import importlib.util
from pathlib import Path

import pytest
import torch

import dmlkit.models
from dmlkit.engine.model import build_model
from dmlkit.engine.resolve import resolve_run
from dmlkit.recipe import planner, prepare_run
from dmlkit.recipe import rules as recipe
from dmlkit.recipe.measurements import Measurements

QUIET = dict(echo=lambda _: None)


@pytest.fixture
def constructions(monkeypatch):
    """The names of the models ``dmlkit.models.create_model`` built while the test ran (ensemble members apart)."""
    built: list[str] = []
    create = dmlkit.models.create_model
    monkeypatch.setattr(dmlkit.models, "create_model", lambda name, **kwargs: built.append(name) or create(name, **kwargs))
    return built


def _chosen_by_the_recipe(ensemble: int, shift_average: int):
    """A glyph plan that chooses ``ensemble`` members and ``shift_average`` (what a time budget buys)."""
    def plan_glyph_steps(cfg, splits, probe, resolved, **_):
        chosen = {"model.ensemble": (ensemble, "members the budget buys"),
                  "model.shift_average": (shift_average, "shifts the budget buys")}
        recipe.apply(cfg, chosen)
        return chosen, None
    return plan_glyph_steps


@pytest.mark.parametrize("overrides, members", [
    ((), 1),  # a config run
    (("model.ensemble=3",), 3),  # an ensemble asked for: three members, each built once
    (("model.shift_average=1",), 1),  # shift averaging asked for
])
def test_a_config_run_builds_each_model_once(tiny_config, constructions, overrides, members):
    resolved = prepare_run(tiny_config(*overrides), **QUIET)
    assert len(constructions) == members
    assert len(getattr(resolved.model, "members", [resolved.model])) == members


@pytest.mark.parametrize("ensemble, shift_average", [(3, 0), (1, 1), (2, 1)])
def test_members_and_shifts_the_recipe_chooses_are_built_once_around_the_probe(tiny_config, constructions, monkeypatch,
                                                                               ensemble, shift_average):
    monkeypatch.setattr(planner, "plan_glyphs_for_run", _chosen_by_the_recipe(ensemble, shift_average))
    resolved = prepare_run(tiny_config(), **QUIET)
    assert len(constructions) == ensemble  # the probe is the first member: built once, as every other member
    assert (resolved.cfg.model.ensemble, resolved.cfg.model.shift_average) == (ensemble, shift_average)
    members = getattr(resolved.model, "members", [resolved.model])
    assert len(members) == ensemble and all(member.shift_average == shift_average for member in members)


@pytest.mark.parametrize("overrides, chosen", [((), None), (("model.ensemble=2", "model.shift_average=1"), None),
                                               ((), (2, 1))])
def test_the_model_handed_over_is_the_one_the_run_would_build_and_the_run_draws_the_same(tiny_config, monkeypatch,
                                                                                          overrides, chosen):
    """The run on the plan's model against the run that builds its model from the seed (a plan without one): the
    same weights, trainable parameters and modes, the same objects drawn after it, the same random state after."""
    if chosen is not None:
        monkeypatch.setattr(planner, "plan_glyphs_for_run", _chosen_by_the_recipe(*chosen))
    cfg = tiny_config(*overrides, "loss.name=proxy_anchor")  # proxies are drawn from the global RNG after the model
    planned = planner.plan(cfg, measurements=Measurements.live(), **QUIET)
    assert planned.model is not None and planned.rng is not None and planned.device is not None
    built_here = resolve_run(dataclasses.replace(planned, model=None, rng=None, device=None, dist=None), **QUIET)
    after_built_here = torch.get_rng_state()
    handed_over = resolve_run(planned, **QUIET)
    assert handed_over.model is planned.model and handed_over.recipe.model is None  # no second reference kept
    assert torch.equal(torch.get_rng_state(), after_built_here)
    for name, run in (("model", "model"), ("objective", "objective")):
        ours, theirs = getattr(handed_over, run).state_dict(), getattr(built_here, run).state_dict()
        assert ours.keys() == theirs.keys(), name
        assert all(torch.equal(ours[key], theirs[key]) for key in ours), name
    assert [p.requires_grad for p in handed_over.model.parameters()] == \
        [p.requires_grad for p in built_here.model.parameters()]
    assert [m.training for m in handed_over.model.modules()] == [m.training for m in built_here.model.modules()]
    assert repr(handed_over.model) == repr(built_here.model)


def test_a_probe_changed_where_the_run_cannot_take_it_over_is_built_again_from_the_seed(tiny_config, constructions,
                                                                                         monkeypatch):
    def embedding_changed(cfg, splits, probe, resolved, **_):  # an argument with weights: the probe cannot take it on
        chosen = {"model.embedding_size": (16, "a smaller embedding")}
        recipe.apply(cfg, chosen)
        return chosen, None

    monkeypatch.setattr(planner, "plan_glyphs_for_run", embedding_changed)
    planned = planner.plan(tiny_config(), measurements=Measurements.live(), **QUIET)
    assert len(constructions) == 2 and planned.model.embedding_size == 16
    torch.manual_seed(planned.cfg.seed)
    reference = build_model(planned.cfg)
    assert all(torch.equal(a, b) for a, b in zip(planned.model.state_dict().values(), reference.state_dict().values()))


def _test_module(name: str):
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_photo_run_trains_the_pretrained_probe_the_plan_measured_and_froze(tmp_path, monkeypatch, constructions):
    """Photos: the pretrained backbone is built once, its pooling and mirror measured, more of its stages frozen by the
    learning plan (here from a slow machine's costs), its embedding size read from it: the run takes it over with
    the weights, trainable parameters, modes and random state of a model built from the finished config."""
    from dmlkit.config import load_config
    from dmlkit.recipe import learning_plan

    slow = _test_module("test_learning_plan").SLOW
    root = _test_module("test_view_size").write_photos(tmp_path / "photos", 96, classes=8, per_class=5)
    monkeypatch.setattr(learning_plan, "measure_stage_costs",
                        lambda model, counts, crop, **_: [c for c in slow if c.frozen_stages in counts])
    monkeypatch.setattr(learning_plan, "embed_seconds", lambda *args, **kwargs: 0.05)
    cfg = load_config(preset="mnist-proxy-anchor", overrides=[
        "data.name=folder", f"data.root={root}", "train.progress=false", "eval.clustering=false",
        "eval.save_embeddings=false", "eval.batch_size=16", "data.image_size=96", "train.time_budget=60"])
    choose = planner.backbone_choice.choose_for_run
    measured: list[str] = []  # the backbones the choice by budget built to measure (throw-away models)
    monkeypatch.setattr(planner.backbone_choice, "choose_for_run",
                        lambda *args, **kwargs: (choose(*args, **kwargs), measured.extend(constructions))[0])
    planned = planner.plan(cfg, measurements=Measurements.live(), **QUIET)
    assert constructions[len(measured):] == [planned.cfg.model.name]  # the probe, which is the run's model
    assert planned.cfg.model.frozen_stages > 2 and planned.cfg.model.embedding_size == 1280  # built with 2
    built_here = resolve_run(dataclasses.replace(planned, model=None, rng=None, device=None, dist=None), **QUIET)
    after_built_here = torch.get_rng_state()
    handed_over = resolve_run(planned, **QUIET)
    assert handed_over.model is planned.model and torch.equal(torch.get_rng_state(), after_built_here)
    ours, theirs = handed_over.model.state_dict(), built_here.model.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[key], theirs[key]) for key in ours)
    assert [p.requires_grad for p in handed_over.model.parameters()] == \
        [p.requires_grad for p in built_here.model.parameters()]
    assert [m.training for m in handed_over.model.modules()] == [m.training for m in built_here.model.modules()]
    assert repr(handed_over.model) == repr(built_here.model)
