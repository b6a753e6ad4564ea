"""train.tensorboard: TensorBoard event files in the run directory hold the scalars of log.jsonl."""

import json
import sys

import pytest

from dmlkit.exceptions import ConfigError
from dmlkit.recipe import Trainer


def read_scalars(log_dir) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_event_files_hold_the_same_scalars_as_the_json_log(tmp_path, tiny_config):
    cfg = tiny_config("train.tensorboard=true", "train.log_every=2", "train.eval_every=2", "protocol.val_fraction=0.2")
    trainer = Trainer(cfg, tmp_path / "run", echo=lambda _: None)
    trainer.fit()
    assert list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))
    scalars = read_scalars(tmp_path / "run" / "tensorboard")
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    expected = {}
    for record in log:
        prefix = record.get("split") or record["kind"]
        for key, value in record.items():
            if key not in ("kind", "split", "step") and isinstance(value, (int, float)) and not isinstance(value, bool):
                expected.setdefault(f"{prefix}/{key}", []).append((record["step"], value))
    assert {"train/loss", "train/lr", "val/map_at_r", "test/map_at_r", "test/precision_at_1"} <= expected.keys()
    assert scalars.keys() == expected.keys()
    for tag, points in expected.items():
        assert [s for s, _ in scalars[tag]] == [s for s, _ in points], tag
        assert [v for _, v in scalars[tag]] == pytest.approx([v for _, v in points], rel=1e-6), tag  # stored as float32
    assert [s for s, _ in scalars["train/loss"]] == [2, 4]


def test_off_by_default_writes_no_event_files(tmp_path, tiny_config):
    cfg = tiny_config("train.max_steps=1")
    assert cfg.train.tensorboard is False
    Trainer(cfg, tmp_path / "run", echo=lambda _: None).fit()
    assert not (tmp_path / "run" / "tensorboard").exists()


def test_missing_package_is_named_before_training(tmp_path, tiny_config, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails as if not installed
    with pytest.raises(ConfigError, match=r"train\.tensorboard=true needs the 'tensorboard' package.*pip install tensorboard"):
        Trainer(tiny_config("train.tensorboard=true"), tmp_path / "run", echo=lambda _: None)
    assert not (tmp_path / "run").exists()


def test_resume_replaces_the_steps_after_the_checkpoint(tmp_path, tiny_config, crash_in_step):
    cfg = tiny_config("train.tensorboard=true", "train.max_steps=6", "train.checkpoint_every=2")
    crashing = Trainer(cfg, tmp_path, echo=lambda _: None)
    crash_in_step(crashing, 4)
    with pytest.raises(KeyboardInterrupt):
        crashing.fit()  # steps 1-3 logged, last checkpoint at step 2
    Trainer(cfg, tmp_path, resume=True, echo=lambda _: None).fit()
    scalars = read_scalars(tmp_path / "tensorboard")
    log = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [s for s, _ in scalars["train/loss"]] == [1, 2, 3, 4, 5, 6]
    assert [v for _, v in scalars["train/loss"]] == pytest.approx([r["loss"] for r in log if r["kind"] == "train"])
