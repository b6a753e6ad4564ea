"""resolve_run: a config becomes every part of the run and every choice with its reason; the trainer builds nothing."""

import ast
import json
from pathlib import Path

import pytest
import torch

from dmlkit.engine import trainer as trainer_module
from dmlkit.engine.resolve import SUMMARY_FILE, ResolvedRun
from dmlkit.engine.run_layout import TRAINING_RECORD_FILE
from dmlkit.recipe import Trainer, prepare_run

QUIET = dict(echo=lambda _: None)
DIGITS = ("data.name=digits", "protocol.val_fraction=0.2", "train.eval_every=2", "train.max_steps=4")

#: The keys of ``checkpoints/last.pt`` as main wrote them before the engine was split: a
#: checkpoint of an older run must still load, so the format may only grow.
CHECKPOINT_KEYS = {
    "format", "fingerprint", "config", "step", "epoch", "batch_in_epoch", "model", "objective", "optimizer",
    "scheduler", "rng", "best_score", "best_step", "evals_since_best", "elapsed", "hooks", "callbacks", "scaler",
    "pretrained_val_ap", "reference_val_ap", "planned",
}


def test_every_choice_has_a_reason_and_is_what_the_config_now_holds(tiny_config):
    cfg = tiny_config(*DIGITS, "sampler.batch_size=null", "sampler.m=null")  # left to the recipe
    resolved = prepare_run(cfg, **QUIET)
    assert isinstance(resolved, ResolvedRun) and resolved.cfg is not cfg  # a finished copy; the given one unchanged
    assert cfg.sampler.batch_size is None and cfg.sampler.m is None
    cfg = resolved.cfg
    chosen = resolved.choices
    assert {"sampler.m", "sampler.batch_size", "train.feature_cache"} <= set(chosen)
    for path, (value, reason) in chosen.items():
        section, name = path.split(".", 1)
        holder = getattr(cfg, section)
        for part in name.split(".")[:-1]:
            holder = getattr(holder, part)
        assert getattr(holder, name.split(".")[-1]) == value, path
        assert isinstance(reason, str) and reason.strip(), path
    assert cfg.sampler.batch_size == resolved.sampler.batch_size  # the object is built from the chosen value


def test_the_run_builds_on_the_splits_the_plan_read_when_its_config_reads_them_the_same_way(tiny_config,
                                                                                             monkeypatch):
    import dataclasses

    from dmlkit.engine import splits as splits_module
    from dmlkit.engine.resolve import resolve_run
    from dmlkit.recipe import plan
    from dmlkit.recipe.measurements import Measurements

    planned = plan(tiny_config(*DIGITS), measurements=Measurements.live(), **QUIET)
    assert planned.splits is not None and planned.splits.val is not None  # validation held out by the plan
    reads = []
    read = splits_module.read_splits
    monkeypatch.setattr(splits_module, "read_splits", lambda *args, **kwargs: reads.append(args) or read(*args, **kwargs))
    resolved = resolve_run(planned, **QUIET)
    assert reads == [] and resolved.splits is not planned.splits  # read once, by the plan; the run's own holder
    assert all(dataset is getattr(planned.splits, name) for name, dataset in resolved.splits.items())
    assert resolved.recipe.splits is None  # the run's record keeps no second reference to them
    # read with anything else (here another preprocessing), the run reads its own
    other = dataclasses.replace(planned, splits_read_as={**planned.splits_read_as, "preprocessing": {"mean": (0.5,)}})
    rebuilt = resolve_run(other, **QUIET)
    assert rebuilt.splits is not planned.splits and len(reads) == 1
    assert len(rebuilt.splits.train) == len(planned.splits.train) and len(rebuilt.splits.val) == len(planned.splits.val)


def test_the_summary_is_json_and_the_text_names_every_part_and_choice(tiny_config):
    resolved = prepare_run(tiny_config(*DIGITS), **QUIET)
    summary = json.loads(json.dumps(resolved.summary()))  # JSON-able, unchanged by a round trip
    assert summary["choices"]["train.feature_cache"]["value"] == resolved.cfg.train.feature_cache
    assert summary["parts"]["fingerprint"] == resolved.fingerprint
    text = resolved.format()
    for name in ("device", "data", "model", "objective", "optimizer", "sampler", "fingerprint"):
        assert f"  {name} " in text, name
    for path, (value, reason) in resolved.choices.items():
        assert f"  {path} = {value}  ({reason})" in text, path


def test_a_resolved_run_trains_as_the_config_does_and_its_summary_is_saved(tmp_path, tiny_config):
    from_config = Trainer(tiny_config(*DIGITS), tmp_path / "config", **QUIET)
    result_config = from_config.fit()
    resolved = prepare_run(tiny_config(*DIGITS), **QUIET)
    from_resolved = Trainer(resolved, tmp_path / "resolved", **QUIET)
    assert from_resolved.model is resolved.model and from_resolved.optimizer is resolved.optimizer
    assert from_resolved.resolved is resolved and from_resolved.cfg is resolved.cfg  # held, not copied
    with pytest.raises(AttributeError, match="Trainer.model is the resolved run's"):
        from_resolved.model = torch.nn.Identity()
    before_training = json.loads(json.dumps(resolved.summary()))  # the learning rates as resolved, not as trained
    parts = dict(vars(resolved))
    result_resolved = from_resolved.fit()
    assert all(getattr(resolved, name) is part for name, part in parts.items())  # the trainer wrote nothing back
    assert result_resolved.test_metrics == result_config.test_metrics
    for name, tensor in from_config.model.state_dict().items():
        assert torch.equal(tensor, from_resolved.model.state_dict()[name]), name
    saved = json.loads((tmp_path / "resolved" / SUMMARY_FILE).read_text())
    assert saved == before_training  # written once, before training; never rewritten
    # what training measured (the time budget's numbers, after those resolved) is in the run's training record
    record = json.loads((tmp_path / "resolved" / TRAINING_RECORD_FILE).read_text())
    tape_before, tape_recorded = before_training["measurements"]["tape"], record["measurements"]["tape"]
    assert record["request"] == before_training["request"] and tape_recorded[:len(tape_before)] == tape_before
    assert (tmp_path / "resolved" / "config.yaml").is_file()
    assert set(torch.load(tmp_path / "resolved" / "checkpoints" / "last.pt", weights_only=True)) == CHECKPOINT_KEYS


def test_objects_go_to_resolve_run_not_to_a_trainer_of_a_resolved_run(tmp_path, tiny_config):
    resolved = prepare_run(tiny_config(*DIGITS), **QUIET)
    with pytest.raises(TypeError, match="Trainer got a resolved run and model, loss: objects are given to prepare_run"):
        Trainer(resolved, tmp_path, model=torch.nn.Identity(), loss=torch.nn.Identity(), **QUIET)


def test_the_trainer_module_builds_nothing():
    source = Path(trainer_module.__file__).read_text()
    called = {node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
              for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)}
    assert sorted(name for name in called if name.startswith("build_")) == []
    assert not {"resolve_run", "prepare_run", "plan"} & called  # it receives a built run; dmlkit.Trainer plans and builds
    # nor does it decide from timings: the time budget and the capture's auto are callbacks the recipe attaches
    assert not {"plan_run", "worth_capturing", "views_for_epochs", "measured_speeds"} & called
    [trainer_class] = [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ClassDef)
                       and node.name == "Trainer"]
    assert [base.id for base in trainer_class.bases] == ["CheckpointingMixin", "SelectionMixin"]  # no time budget


def test_prepare_run_attaches_the_callbacks_that_watch_the_run(tiny_config):
    from dmlkit.recipe.step_capture_plan import StepCaptureChoice
    from dmlkit.recipe.time_budget import TimeBudget

    resolved = prepare_run(tiny_config(*DIGITS), **QUIET)
    assert [type(c) for c in resolved.plan_callbacks] == [TimeBudget, StepCaptureChoice]
    assert resolved.step_capture.mode == "off" and "cpu" in resolved.step_capture.reason  # decided by the recipe


def test_the_dry_runs_steps_line_gives_the_steps_the_budget_buys_not_a_ceiling_beside_none():
    from types import SimpleNamespace

    def line(planned, max_steps=200):
        cfg = SimpleNamespace(train=SimpleNamespace(max_steps=max_steps, eval_every=25, time_budget=120.0))
        return ResolvedRun._steps_line(SimpleNamespace(cfg=cfg, recipe=SimpleNamespace(planned_steps=planned)))

    assert line(None) == "train.max_steps=200, train.eval_every=25, train.time_budget=120.0"  # nothing planned
    assert line(300) == line(200) == ("200 steps (the ceiling; the 120-s budget affords them at the measured costs), "
                                      "train.max_steps=200, train.eval_every=25, train.time_budget=120.0")
    assert line(40).startswith("about 40 steps (what the 120-s budget buys at the measured costs")
    assert line(0).startswith("no training step fits the 120-s budget: the pretrained backbone is evaluated alone")
