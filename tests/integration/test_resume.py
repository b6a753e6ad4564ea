"""Exact resume: an interrupted run continued from its last checkpoint ends where an uninterrupted one does."""

import json

import pytest
import torch

from dmlkit.config import load_config
from dmlkit.engine.checkpoint_files import load_checkpoint
from dmlkit.exceptions import CheckpointError
from dmlkit.methods.hooks import MethodHooks
from dmlkit.recipe import Trainer

OVERRIDES = [
    "train.max_steps=24",
    "train.checkpoint_every=8",
    "train.eval_every=8",
    "train.log_every=4",
    "train.progress=false",
    "eval.clustering=false",
    "protocol.val_fraction=0.2",
    "sampler.batch_size=32",
    "sampler.m=8",
    "data.name=digits",  # 8x8 digits: the engine's resume path as on MNIST, without MNIST's 25-shift evaluation
]


class Interrupt(MethodHooks):
    """Simulates a crash after ``at`` optimiser steps (between checkpoints)."""

    def __init__(self, at: int):
        self.at = at

    def after_backward(self, trainer):
        if trainer.step + 1 == self.at:
            raise KeyboardInterrupt


def _weights(run_dir):
    return load_checkpoint(run_dir / "checkpoints" / "last.pt")["model"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("a")
    result = Trainer(load_config(overrides=OVERRIDES), run_dir).fit()
    return run_dir, result


def test_resume_after_crash_matches_uninterrupted_run(tmp_path, uninterrupted):
    run_a, result_a = uninterrupted
    cfg = load_config(overrides=OVERRIDES)
    with pytest.raises(KeyboardInterrupt):
        Trainer(cfg, tmp_path, hooks=Interrupt(at=13)).fit()
    assert load_checkpoint(tmp_path / "checkpoints" / "last.pt")["step"] == 8
    result_b = Trainer(cfg, tmp_path, resume=True).fit()
    wa, wb = _weights(run_a), _weights(tmp_path)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    assert result_a.test_metrics == result_b.test_metrics
    log_a = [json.loads(line) for line in (run_a / "log.jsonl").read_text().splitlines()]
    log_b = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    strip = lambda rows: [{k: v for k, v in r.items() if k != "time"} for r in rows]  # noqa: E731
    assert strip(log_a) == strip(log_b)


def test_resume_refuses_checkpoint_of_other_config(tmp_path, uninterrupted):
    run_a, _ = uninterrupted
    other = load_config(overrides=OVERRIDES + ["model.embedding_size=32"])
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.pt").write_bytes((run_a / "checkpoints" / "last.pt").read_bytes())
    with pytest.raises(CheckpointError, match="different configuration"):
        Trainer(other, tmp_path, resume=True).fit()


def test_validation_selects_checkpoint_and_records_it(uninterrupted):
    run_a, result = uninterrupted
    metrics = json.loads((run_a / "metrics.json").read_text())
    assert metrics["selected_on"] == "val"
    log = [json.loads(line) for line in (run_a / "log.jsonl").read_text().splitlines()]
    val_steps = [r["step"] for r in log if r["kind"] == "eval" and r["split"] == "val"]
    assert val_steps == [8, 16, 24]
    best = max((r for r in log if r.get("split") == "val"), key=lambda r: (r["map_at_r"], -r["step"]))
    assert metrics["best_step"] == best["step"]


FP16 = [
    "train.max_steps=8", "train.checkpoint_every=4", "train.eval_every=1000", "train.log_every=1",
    "train.progress=false", "train.mixed_precision=fp16", "model.args={width: 8}",
    "sampler.batch_size=32", "sampler.m=8",
]


def _fp16_trainer(run_dir, **kwargs):
    trainer = Trainer(load_config(overrides=FP16), run_dir, echo=lambda _: None, **kwargs)
    trainer.finish = lambda has_val: None  # weights, scaler and log are compared; no test evaluation needed
    return trainer


def test_fp16_resume_restores_the_gradient_scaler_exactly(tmp_path):
    # growth every 2 good steps makes the scale climb into overflows, back off, climb again: the
    # trajectory (which steps the scaler skips) depends on the scale and its growth counter
    full = _fp16_trainer(tmp_path / "a")
    full.scaler.set_growth_interval(2)
    full.fit()
    crashed = _fp16_trainer(tmp_path / "b", hooks=Interrupt(at=7))
    crashed.scaler.set_growth_interval(2)
    with pytest.raises(KeyboardInterrupt):
        crashed.fit()
    saved = load_checkpoint(tmp_path / "b" / "checkpoints" / "last.pt")
    assert saved["step"] == 4 and saved["scaler"]["growth_interval"] == 2
    resumed = _fp16_trainer(tmp_path / "b", resume=True)  # its scaler starts from the defaults ...
    resumed.fit()  # ... and the checkpoint restores scale, growth counter and interval
    assert resumed.scaler.state_dict() == full.scaler.state_dict()
    wa, wb = _weights(tmp_path / "a"), _weights(tmp_path / "b")
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    log_a, log_b = ([json.loads(line) for line in (tmp_path / run / "log.jsonl").read_text().splitlines()] for run in "ab")
    strip = lambda rows: [{k: v for k, v in r.items() if k != "time"} for r in rows]  # noqa: E731
    assert strip(log_a) == strip(log_b)
    scales = [r["grad_scale"] for r in log_a]
    assert len(set(scales)) > 1  # the scale moved (overflow skips and growth) within the run


def test_cli_resume_may_change_only_the_device(tmp_path, uninterrupted, capsys):
    from dmlkit.cli.main import main

    run_a, result_a = uninterrupted
    for name in ("config.yaml", "log.jsonl"):
        (tmp_path / name).write_bytes((run_a / name).read_bytes())
    (tmp_path / "checkpoints").mkdir()
    for name in ("last.pt", "best.pt"):
        (tmp_path / "checkpoints" / name).write_bytes((run_a / "checkpoints" / name).read_bytes())
    assert main(["train", "--resume", str(tmp_path), "--set", "optimizer.lr=1"]) == 2
    assert "except --device or --set train.device=..." in capsys.readouterr().err
    # a run trained elsewhere (say on a GPU) continues on this machine's CPU; here it is already done
    assert main(["train", "--resume", str(tmp_path), "--set", "train.device=cpu", "--quiet", "--no-report"]) == 0
    assert json.loads((tmp_path / "metrics.json").read_text())["map_at_r"] == result_a.test_metrics["map_at_r"]
