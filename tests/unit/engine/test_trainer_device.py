"""train.device (where model, loss and batches live) and fp16 training with a gradient scaler, on CPU.

GradScaler works on the CPU in this torch version, so the fp16 logic (scale, unscale before the
finite check and clipping, overflow skips, its state in checkpoints) is tested here; the same
code runs with ``device_type="cuda"`` on a GPU.
"""

import dataclasses
import json
import math

import pytest
import torch

from dmlkit.engine.batches import fetch_batch
from dmlkit.engine.device import resolve_device
from dmlkit.exceptions import ConfigError, NonFiniteError
from dmlkit.methods.hooks import MethodHooks
from dmlkit.recipe import Trainer, planner, prepare_run


def fake_gpus(monkeypatch, count):
    """Make torch report ``count`` CUDA devices (resolve_device only asks; it creates no tensor)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


def test_resolve_device_cpu_and_auto():
    assert resolve_device("cpu") == torch.device("cpu")
    expected = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    assert resolve_device("auto") == expected


def test_resolve_device_auto_takes_a_gpu_when_there_is_one(monkeypatch):
    fake_gpus(monkeypatch, 2)
    assert resolve_device("auto") == torch.device("cuda", 0)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    assert resolve_device("cpu") == torch.device("cpu")
    # torchrun: every rank trains on its own GPU
    assert resolve_device("auto", local_rank=1) == torch.device("cuda", 1)
    assert resolve_device("cuda", local_rank=1) == torch.device("cuda", 1)
    assert resolve_device("cpu", local_rank=1) == torch.device("cpu")
    with pytest.raises(ConfigError, match=r"under torchrun every rank trains on cuda:LOCAL_RANK"):
        resolve_device("cuda:0", local_rank=1)
    with pytest.raises(ConfigError, match=r"cuda:5, but only 2 CUDA device\(s\) are visible"):
        resolve_device("cuda:5")


@pytest.mark.parametrize("value", ["cuda", "cuda:0"])
def test_cuda_without_a_gpu_is_a_config_error_before_anything_is_built(tmp_path, tiny_config, monkeypatch, value):
    fake_gpus(monkeypatch, 0)
    monkeypatch.setattr(planner, "build_model", lambda cfg: pytest.fail("the model was built before the device check"))
    with pytest.raises(ConfigError, match=r"train.device='cuda(:0)?' asks for a GPU, but torch.cuda.is_available\(\) is False"):
        Trainer(tiny_config(f"train.device={value}"), tmp_path / "run", echo=lambda _: None)
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize("value", ["cpu", "auto"])
def test_model_loss_and_batches_live_on_the_resolved_device(tmp_path, tiny_config, value):
    trainer = Trainer(tiny_config(f"train.device={value}", "train.max_steps=1"), tmp_path / "run", echo=lambda _: None)
    assert trainer.device == resolve_device(value)
    assert trainer.autocast_device == trainer.device.type
    tensors = [*trainer.model.parameters(), *trainer.objective.parameters(), *trainer.objective.buffers()]
    assert tensors and all(t.device == trainer.device for t in tensors)
    assert trainer.scaler is None  # only fp16 scales the loss


class PoisonGradient(MethodHooks):
    """Makes one gradient entry infinite after backward, i.e. after the scaler's unscale."""

    def after_backward(self, trainer):
        next(trainer.model.parameters()).grad.view(-1)[0] = float("inf")


def make_fp16_trainer(tmp_path, tiny_config, *overrides, hooks=None):
    resolved = prepare_run(tiny_config("train.mixed_precision=fp16", *overrides), echo=lambda _: None)
    # the default initial scale (2**16) overflows this model's first steps (the scaler then backs off by
    # itself, a few steps in); start where a step does not overflow so each test controls its overflows
    resolved = dataclasses.replace(resolved, scaler=torch.amp.GradScaler(resolved.device.type, init_scale=2.0**8))
    trainer = Trainer(resolved, tmp_path / "run", hooks=hooks, echo=lambda _: None)
    images, raw = fetch_batch(trainer.splits.train, trainer.sampler.batches(0)[0].tolist())
    return trainer, images, trainer.label_map(raw)


def weights(trainer):
    return [p.detach().clone() for p in [*trainer.model.parameters(), *trainer.objective.parameters()]]


def test_fp16_run_scales_the_loss_keeps_it_fp32_and_ends_finite(tmp_path, tiny_config):
    trainer = Trainer(tiny_config("train.mixed_precision=fp16"), tmp_path / "run", echo=lambda _: None)
    assert isinstance(trainer.scaler, torch.amp.GradScaler) and trainer.autocast_dtype is torch.float16
    dtypes, trunk = [], []
    trainer.model.trunk.register_forward_hook(lambda module, inputs, out: trunk.append(out.dtype))
    trainer.objective.register_forward_hook(lambda module, inputs, out: dtypes.append((trunk[-1], out.dtype)))
    result = trainer.fit()
    assert dtypes == [(torch.float16, torch.float32)] * 4  # an fp16 trunk, the loss accumulated in fp32
    log = [json.loads(line) for line in trainer.run_dir.log_path.read_text().splitlines()]
    train = [r for r in log if r["kind"] == "train"]
    assert len(train) == 4 and all(math.isfinite(r["loss"]) and r["grad_scale"] > 0 for r in train)
    metrics = result.test_metrics
    assert all(math.isfinite(v) and 0.0 <= v <= 1.0 for k, v in metrics.items() if not k.startswith(("num_", "threshold_")))
    assert metrics["map_at_r"] > 0
    saved = torch.load(trainer.run_dir.last_checkpoint, map_location="cpu", weights_only=True)["scaler"]
    assert saved == trainer.scaler.state_dict() and saved["scale"] == trainer.scaler.get_scale()


def test_an_overflowing_fp16_step_is_skipped_by_the_scaler_without_raising(tmp_path, tiny_config):
    trainer, images, labels = make_fp16_trainer(tmp_path, tiny_config, "optimizer.grad_clip=1.0")  # on_nonfinite=stop
    first = next(trainer.model.parameters())
    handle = first.register_hook(lambda grad: torch.full_like(grad, float("inf")))  # overflow inside the scaled backward
    before, scale = weights(trainer), trainer.scaler.get_scale()
    value = trainer.training_step(images, labels)
    assert math.isfinite(value)  # the loss was fine; only the update was skipped
    assert all(torch.equal(a, b) for a, b in zip(weights(trainer), before))
    assert not trainer.optimizer.state  # no optimiser step
    assert all(p.grad is None for p in trainer.model.parameters())
    assert trainer.scaler.get_scale() == scale * trainer.scaler.get_backoff_factor()
    assert trainer.scheduler.last_epoch == 1  # the schedule stays aligned with the step count
    handle.remove()
    trainer.training_step(images, labels)  # the scaler's iteration was closed: the next step updates
    assert not all(torch.equal(a, b) for a, b in zip(weights(trainer), before))
    assert trainer.scaler.get_scale() == scale * trainer.scaler.get_backoff_factor()


def test_fp16_clips_the_unscaled_gradients(tmp_path, tiny_config):
    trainer, images, labels = make_fp16_trainer(tmp_path, tiny_config, "optimizer.grad_clip=0.001")
    params = [*trainer.model.parameters(), *trainer.objective.parameters()]
    # the same fp16 backward, without loss scaling, where training_step runs it: on the trainer's device
    # under that device's autocast (CPU autocast on CPU inputs would leave a GPU model's weights in fp32:
    # "Input type (torch.HalfTensor) and weight type (torch.cuda.FloatTensor) should be the same")
    with torch.autocast(trainer.device.type, dtype=torch.float16):
        trainer.objective(trainer.model(images.to(trainer.device)), labels.to(trainer.device)).backward()
    reference = float(torch.linalg.vector_norm(torch.cat([p.grad.reshape(-1).float() for p in params])))
    norms = []
    original = trainer._gradient_norm

    def read_norm() -> torch.Tensor:  # the norm is a device tensor (no host read in the step): read it here
        norm = original()
        norms.append(float(norm))
        return norm

    trainer._gradient_norm = read_norm
    trainer.training_step(images, labels)
    assert trainer.scaler.get_scale() == 256.0  # no overflow; the scaled norm would be 256 times larger
    assert norms == [pytest.approx(reference, rel=0.02)] and reference > 0.001
    # optimizer.step() keeps the (clipped, unscaled) gradients: their norm is the clip value
    clipped = float(torch.linalg.vector_norm(torch.cat([p.grad.reshape(-1).float() for p in params])))
    assert clipped == pytest.approx(0.001, rel=1e-2)


def test_a_gradient_made_non_finite_after_the_unscale_is_not_the_scalers_to_skip(tmp_path, tiny_config):
    trainer, images, labels = make_fp16_trainer(tmp_path, tiny_config, hooks=PoisonGradient())
    before, scale = weights(trainer), trainer.scaler.get_scale()
    with pytest.raises(NonFiniteError, match="Non-finite gradient norm .* at step 1; training stopped"):
        trainer.training_step(images, labels)
    assert all(torch.equal(a, b) for a, b in zip(weights(trainer), before))
    assert trainer.scaler.get_scale() == scale  # no fp16 overflow: the scale is kept
