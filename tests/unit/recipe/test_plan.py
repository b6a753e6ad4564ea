"""plan: a config as asked in, a new finished config out; resolve_run builds from it without writing to it."""

from __future__ import annotations

import copy

import pytest

from dmlkit.config.schema import config_to_dict
from dmlkit.engine.given import GivenObjects
from dmlkit.engine.resolve import resolve_run
from dmlkit.recipe import plan
from dmlkit.recipe.measurements import Measurements
from dmlkit.recipe.rules import RECIPE_FIELDS

QUIET = {"echo": lambda _line: None}

#: Recipe fields where None is a decided value, each with the condition under which it may be: the data's own size
#: (no resizing, no crop) for images held in memory, no early stopping, no cached views where the cache is off, a
#: fixed number of steps, validations embedded as the test split is where nothing is shift-averaged.
NONE_MEANS = {
    "data.image_size": lambda cfg: cfg.data.crop_size is None,
    "data.crop_size": lambda cfg: True,
    "train.patience": lambda cfg: True,
    "train.cache_views": lambda cfg: cfg.train.feature_cache == "off",
    "train.time_budget": lambda cfg: cfg.train.max_steps is not None,
    "eval.val_shift_average": lambda cfg: not cfg.model.shift_average,
}


def value(cfg, path: str):
    section, key = path.split(".")
    return getattr(getattr(cfg, section), key)


def undecided(cfg) -> list[str]:
    """The recipe's fields still ``auto`` or None (where None is not a decided value)."""
    return [path for path in RECIPE_FIELDS if value(cfg, path) == "auto"
            or value(cfg, path) is None and not (path in NONE_MEANS and NONE_MEANS[path](cfg))]


@pytest.mark.parametrize("overrides", [(), ("train.max_steps=null", "train.eval_every=null", "train.time_budget=60"),
                                       ("model.ensemble=null", "model.shift_average=null", "sampler.m=null",
                                        "sampler.batch_size=null", "data.augment=auto")])
def test_plan_returns_a_finished_new_config_and_leaves_the_given_one_as_it_was(tiny_config, overrides):
    cfg = tiny_config(*overrides)
    asked = copy.deepcopy(config_to_dict(cfg))
    planned = plan(cfg, measurements=Measurements.live(), **QUIET)
    assert config_to_dict(cfg) == asked  # the config given is not written
    assert planned.cfg is not cfg
    assert undecided(planned.cfg) == []


def test_resolve_run_builds_from_the_finished_config_without_writing_to_it(tiny_config):
    planned = plan(tiny_config(), measurements=Measurements.live(), **QUIET)
    finished = copy.deepcopy(config_to_dict(planned.cfg))
    resolved = resolve_run(planned, **QUIET)
    assert resolved.cfg is planned.cfg and config_to_dict(planned.cfg) == finished
    # the plan's choices, and the engine's own: whether the step is captured (decided from the built objects)
    built_here = {path: why for path, why in resolved.choices.items() if path not in planned.choices}
    assert {path: resolved.choices[path] for path in planned.choices} == planned.choices
    assert set(built_here) <= {"train.step_capture"}


def test_plan_reads_given_splits_without_changing_them(tiny_config):
    from dmlkit.recipe.survey import survey_data

    cfg = tiny_config("protocol.val_class_fraction=0.4", "sampler.batch_size=16")
    data = survey_data(cfg)
    train = data.train
    planned = plan(cfg, GivenObjects(data=data), measurements=Measurements.live(), **QUIET)
    assert data.train is train and data.val is None  # the run holds the validation classes out, not the plan
    resolved = resolve_run(planned, GivenObjects(data=data), **QUIET)
    assert resolved.splits.val is not None and len(resolved.splits.train) < len(train)
