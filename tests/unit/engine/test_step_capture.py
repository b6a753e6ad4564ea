"""train.step_capture: a compiled step (captured as CUDA graphs on a card) trains as the eager one does (torch.compile
on the CPU), the run records why a step stays eager (which steps are captured: tests/unit/recipe/test_step_capture_plan.py)."""

import json
import sys
from pathlib import Path

import pytest
import torch

import dmlkit.core.validation as validation
from dmlkit.engine import optim
from dmlkit.engine.training import step_capture

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "losses"))
from _host_syncs import count_host_syncs  # noqa: E402 - the loss tests' counter


def test_the_default_is_eager_on_the_cpu_and_says_why(tmp_path, tiny_config):
    from dmlkit.recipe import Trainer

    trainer = Trainer(tiny_config(), tmp_path / "run", echo=lambda _: None)
    assert trainer.cfg.train.step_capture == "auto" and trainer.captured_step is None
    choice = trainer.resolved.summary()["choices"]["train.step_capture"]
    assert choice["value"] == "auto" and choice["reason"].startswith("eager: cpu")


def test_the_step_makes_no_host_synchronisation_on_a_card(tmp_path, tiny_config, monkeypatch):
    """Capture safety: the compiled region (forward, loss, backward) and the optimiser's update read nothing on the
    host once checks of data take the card's branch; a CUDA graph could not hold a read."""
    from dmlkit.recipe import Trainer

    monkeypatch.setattr(validation, "reads_on_host", lambda tensor: False)
    monkeypatch.setattr(optim, "fused_capable", lambda groups: True)
    trainer = Trainer(tiny_config(), tmp_path / "run", echo=lambda _: None)
    assert trainer.step_checks is not None  # the finite check stays on the device: nothing read per step
    images = torch.randn(32, 1, 28, 28)
    labels = torch.arange(4).repeat_interleave(8)
    trainer.training_step(images, labels)  # first step: optimiser state created
    with count_host_syncs() as counts:
        for _ in range(2):
            trainer.training_step(images, labels)
    assert dict(counts) == {}


def fit_losses(tmp_path, tiny_config, *overrides):
    from dmlkit.recipe import Trainer

    trainer = Trainer(tiny_config(*overrides), tmp_path / "run", echo=lambda _: None)
    trainer.finish = lambda has_val: None  # the test split's embedding is not a step
    trainer.fit()
    log = [json.loads(line) for line in trainer.run_dir.log_path.read_text().splitlines()]
    return trainer, [r["loss"] for r in log if r["kind"] == "train"]


def test_a_compiled_step_trains_as_the_eager_one(tmp_path, tiny_config):
    import torch._inductor.config as inductor_config

    _, eager = fit_losses(tmp_path / "eager", tiny_config)
    with inductor_config.patch(compile_threads=1):  # no worker pool on 2 shared cores
        trainer, compiled = fit_losses(tmp_path / "compiled", tiny_config, "train.step_capture=compile")
    assert trainer.captured_step is not None and trainer.captured_step.eager_batches == 0
    assert compiled == pytest.approx(eager, rel=1e-4)
    saved = json.loads((trainer.run_dir.path / "resolved.json").read_text())["choices"]["train.step_capture"]
    assert saved["value"] == "compile" and saved["reason"].startswith("captured: forward, loss and backward")


def test_auto_decides_after_the_calibration_steps_and_records_it(tmp_path, tiny_config, monkeypatch):
    """On a card, auto times the first steps; a run whose steps left do not pay stays eager, in the run's training
    record (training.json); resolved.json keeps what was resolved."""
    from dmlkit.recipe import Trainer

    pending = step_capture.CaptureDecision("pending", "auto: decided after the first steps")
    trainer = Trainer(tiny_config("train.max_steps=6"), tmp_path / "run", echo=lambda _: None)
    trainer.step_capture = trainer.resolved.step_capture = pending
    trainer.finish = lambda has_val: None
    trainer.fit()
    assert trainer.captured_step is None and trainer.step_capture.mode == "off"
    assert trainer.resolved.step_capture is pending  # the trainer writes nothing back into the resolved run
    resolved = json.loads((trainer.run_dir.path / "resolved.json").read_text())["choices"]["train.step_capture"]
    assert resolved["reason"].startswith("decided after the first steps")
    saved = json.loads((trainer.run_dir.path / "training.json").read_text())["choices"]["train.step_capture"]
    assert saved["value"] == "auto" and saved["reason"].startswith("eager: ") and "steps left at" in saved["reason"]


def test_hooks_that_read_the_batchs_embeddings_keep_the_step_eager(tmp_path, tiny_config):
    from dmlkit.methods.hooks import MethodHooks
    from dmlkit.recipe import Trainer

    class Reader(MethodHooks):
        def on_batch_embeddings(self, trainer, indices, embeddings):
            pass

    trainer = Trainer(tiny_config("train.step_capture=compile"), tmp_path / "run", hooks=Reader(),
                      echo=lambda _: None)
    assert trainer.captured_step is None and "given hooks" in trainer.step_capture.reason
    assert trainer.resolved.summary()["choices"]["train.step_capture"]["reason"].startswith("captured")  # as resolved
    assert trainer.training_record["choices"]["train.step_capture"]["reason"].startswith("eager: the given hooks")
