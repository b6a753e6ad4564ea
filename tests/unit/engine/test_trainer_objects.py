"""The object API is the config path's engine: same run from objects, callbacks at every event, their state resumed."""

import json

import pytest
import torch

from dmlkit.engine.batches import LabelMap
from dmlkit.engine.callbacks import Callback, EarlyStopping
from dmlkit.engine.model import build_model
from dmlkit.engine.objective import build_objective
from dmlkit.engine.rng_state import seed_everything
from dmlkit.engine.splits import build_splits
from dmlkit.exceptions import InvalidParameterError
from dmlkit.recipe import Trainer
from dmlkit.recipe import planner as recipe_plan
from dmlkit.recipe.survey import survey_data

QUIET = dict(echo=lambda _: None)
DIGITS = ("data.name=digits", "protocol.val_fraction=0.2", "train.eval_every=2", "train.max_steps=4")


def without_time(path):
    return [{k: v for k, v in json.loads(line).items() if k != "time"} for line in path.read_text().splitlines()]


def test_config_and_objects_give_the_same_run(tmp_path, tiny_config):
    from_config = Trainer(tiny_config(*DIGITS), tmp_path / "config", **QUIET)
    result_config = from_config.fit()

    cfg = tiny_config(*DIGITS)  # the same choices, built by the caller as objects
    seed_everything(cfg.seed)
    survey = survey_data(cfg)
    recipe_plan.apply_model_recipe(cfg, survey)  # the preset leaves the model to the recipe
    model = build_model(cfg)
    splits = build_splits(cfg, model, survey)
    num_classes = len(LabelMap(splits.train.labels))
    loss = build_objective(cfg, num_classes).loss
    from_objects = Trainer(cfg, tmp_path / "objects", model=model, loss=loss, data=splits, **QUIET)
    result_objects = from_objects.fit()

    assert result_objects.test_metrics == result_config.test_metrics
    assert (result_objects.best_step, result_objects.steps) == (result_config.best_step, result_config.steps)
    for name, tensor in from_config.model.state_dict().items():
        assert torch.equal(tensor, from_objects.model.state_dict()[name]), name
    assert torch.equal(from_config.objective.loss.proxies, from_objects.objective.loss.proxies)
    assert without_time(tmp_path / "config" / "log.jsonl") == without_time(tmp_path / "objects" / "log.jsonl")
    assert (tmp_path / "config" / "config.yaml").read_text() == (tmp_path / "objects" / "config.yaml").read_text()


class Recorder(Callback):
    """Every event with its step; a counter as state (saved in checkpoints)."""

    def __init__(self):
        self.events, self.count = [], 0

    def on_train_start(self, trainer):
        self.events.append(("start", trainer.step))

    def on_step_end(self, trainer, step, metrics):
        self.count += 1
        assert set(metrics) == {"loss", "lr"} and trainer.model.training
        self.events.append(("step", step))

    def on_evaluation_end(self, trainer, step, metrics):
        self.events.append(("eval", step, round(metrics["map_at_r"], 6)))

    def on_checkpoint(self, trainer, step):
        self.events.append(("checkpoint", step))

    def on_fit_end(self, trainer, result):
        self.events.append(("end", result.steps))

    def state_dict(self):
        return {"count": self.count}

    def load_state_dict(self, state):
        self.count = state["count"]


def test_callbacks_see_every_event_in_order(tmp_path, tiny_config):
    recorder = Recorder()
    Trainer(tiny_config(*DIGITS), tmp_path, callbacks=[recorder], **QUIET).fit()
    names = [e[0] for e in recorder.events]
    assert names == ["start", "step", "step", "eval", "checkpoint", "step", "step", "eval", "checkpoint", "end"]
    assert [e[1] for e in recorder.events if e[0] == "eval"] == [2, 4]
    vals = [r for r in map(json.loads, (tmp_path / "log.jsonl").read_text().splitlines()) if r.get("split") == "val"]
    assert [e[2] for e in recorder.events if e[0] == "eval"] == [round(r["map_at_r"], 6) for r in vals]


def test_callback_state_survives_a_resume(tmp_path, tiny_config, crash_in_step):
    cfg = (*DIGITS, "train.checkpoint_every=1", "train.max_steps=6")
    crashing = Trainer(tiny_config(*cfg), tmp_path, callbacks=[Recorder()], **QUIET)
    crash_in_step(crashing, 4)
    with pytest.raises(KeyboardInterrupt):
        crashing.fit()
    resumed = Recorder()
    Trainer(tiny_config(*cfg), tmp_path, resume=True, callbacks=[resumed], **QUIET).fit()
    assert resumed.events[0] == ("start", 3)
    assert resumed.count == 6  # 3 steps counted before the crash (restored), 3 after


def test_a_callback_stops_training(tmp_path, tiny_config):
    class StopAtTwo(Callback):
        def on_step_end(self, trainer, step, metrics):
            trainer.should_stop = step >= 2

    result = Trainer(tiny_config(*DIGITS, "train.max_steps=8"), tmp_path, callbacks=[StopAtTwo()], **QUIET).fit()
    assert result.steps == 2 and result.test_metrics


class FakeTrainer:
    def __init__(self):
        self.should_stop, self.best_step, self.evals_since_best = False, 0, 0


def test_early_stopping_on_a_metric_and_on_the_selection():
    trainer = FakeTrainer()
    stopping = EarlyStopping(patience=2, monitor="map_at_r", min_delta=0.01)
    for step, value in [(1, 0.5), (2, 0.505), (3, 0.6)]:
        stopping.on_evaluation_end(trainer, step, {"map_at_r": value})
    assert not trainer.should_stop and stopping.waited == 0  # 0.505 is within min_delta: one wait, then 0.6
    stopping.on_evaluation_end(trainer, 4, {"map_at_r": 0.59})
    stopping.on_evaluation_end(trainer, 5, {"map_at_r": 0.6})
    assert trainer.should_stop and stopping.state_dict() == {"best": 0.6, "waited": 2}
    selection = EarlyStopping(patience=1)  # train.patience: the trainer's own choice of best.pt
    trainer = FakeTrainer()
    trainer.best_step = 3
    selection.on_evaluation_end(trainer, 3, {})
    assert not trainer.should_stop
    trainer.evals_since_best = 1
    selection.on_evaluation_end(trainer, 4, {})
    assert trainer.should_stop
    trainer = FakeTrainer()  # dmlkit's Trainer says whether its last validation made progress (significance rule)
    trainer.best_step, trainer.last_eval_improved = 3, False
    EarlyStopping(patience=1).on_evaluation_end(trainer, 3, {})
    assert trainer.should_stop
    with pytest.raises(InvalidParameterError, match="'patience' parameter of EarlyStopping"):
        EarlyStopping(patience=0)


def test_train_patience_is_an_early_stopping_callback(tmp_path, tiny_config):
    trainer = Trainer(tiny_config(*DIGITS, "train.patience=1"), tmp_path, **QUIET)
    # the config's early stopping first; then those the recipe attached, which watch the timed steps
    assert [type(c).__name__ for c in trainer.callbacks] == ["EarlyStopping", "TimeBudget", "StepCaptureChoice"]
    assert trainer.callbacks.callbacks[0].patience == 1


def test_train_patience_stops_a_run_that_does_not_improve(tmp_path, tiny_config):
    cfg = tiny_config(*DIGITS, "train.patience=1", "train.eval_every=1", "train.max_steps=6", "optimizer.lr=0.000000000001")
    trainer = Trainer(cfg, tmp_path, **QUIET)
    result = trainer.fit()  # step 1 is the best; step 2 does not beat it: one validation without improvement
    assert result.steps == 2 and trainer.stopped_early and result.best_step == 1
