"""One training step: non-finite losses/gradients stop or skip without touching the weights;
the fused gradient norm is both the finite check and the clipping norm."""

import math

import pytest
import torch

from dmlkit.engine.batches import fetch_batch
from dmlkit.exceptions import NonFiniteError
from dmlkit.methods.hooks import MethodHooks
from dmlkit.recipe import Trainer


class PoisonGradient(MethodHooks):
    """Makes one gradient entry infinite after backward (the loss itself stays finite)."""

    def after_backward(self, trainer):
        next(trainer.model.parameters()).grad.view(-1)[0] = float("inf")


def make_trainer(tmp_path, tiny_config, *overrides, hooks=None):
    trainer = Trainer(tiny_config(*overrides), tmp_path / "run", hooks=hooks, echo=lambda _: None)
    images, raw = fetch_batch(trainer.splits.train, trainer.sampler.batches(0)[0].tolist())
    return trainer, images, trainer.label_map(raw)


def snapshot(trainer):
    return [p.detach().clone() for p in [*trainer.model.parameters(), *trainer.objective.parameters()]]


def unchanged(trainer, before):
    after = [*trainer.model.parameters(), *trainer.objective.parameters()]
    return all(torch.equal(a, b) for a, b in zip(after, before))


def poison_loss(trainer):
    trainer.objective.register_forward_hook(lambda module, inputs, out: out * float("nan"))


def test_finite_step_returns_the_loss_and_updates_weights(tmp_path, tiny_config):
    trainer, images, labels = make_trainer(tmp_path, tiny_config)
    before = snapshot(trainer)
    with torch.no_grad():
        expected = float(trainer.objective(trainer.model(images), labels))
    value = trainer.training_step(images, labels)
    assert value == pytest.approx(expected, rel=1e-6)
    assert not unchanged(trainer, before)
    assert trainer.scheduler.last_epoch == 1


@pytest.mark.parametrize("what", ["loss", "gradient norm"])
def test_non_finite_stop_raises_before_any_update(tmp_path, tiny_config, what):
    hooks = PoisonGradient() if what == "gradient norm" else None
    trainer, images, labels = make_trainer(tmp_path, tiny_config, hooks=hooks)
    if what == "loss":
        poison_loss(trainer)
    before = snapshot(trainer)
    with pytest.raises(NonFiniteError, match=f"Non-finite {what} .* at step 1; training stopped, weights were not updated"):
        trainer.training_step(images, labels)
    assert unchanged(trainer, before)
    assert not trainer.optimizer.state  # no optimiser step was taken
    assert all(p.grad is None for p in trainer.model.parameters())


@pytest.mark.parametrize("what", ["loss", "gradient norm"])
def test_non_finite_skip_keeps_weights_and_advances_the_schedule(tmp_path, tiny_config, what):
    hooks = PoisonGradient() if what == "gradient norm" else None
    trainer, images, labels = make_trainer(tmp_path, tiny_config, "train.on_nonfinite=skip", hooks=hooks)
    if what == "loss":
        poison_loss(trainer)
    messages = []
    trainer.echo = messages.append
    before = snapshot(trainer)
    assert math.isnan(trainer.training_step(images, labels))
    assert unchanged(trainer, before)
    assert trainer.scheduler.last_epoch == 1  # the schedule stays aligned with the step count
    assert messages and f"non-finite {what}" in messages[0] and "step skipped" in messages[0]


def test_gradient_norm_without_clipping_leaves_gradients_alone(tmp_path, tiny_config):
    trainer, images, labels = make_trainer(tmp_path, tiny_config)
    trainer.objective(trainer.model(images), labels).backward()
    grads = [p.grad.clone() for p in trainer.model.parameters()] + [p.grad.clone() for p in trainer.objective.parameters()]
    expected = torch.linalg.vector_norm(torch.cat([g.reshape(-1) for g in grads]))
    assert trainer._gradient_norm() == pytest.approx(float(expected), rel=1e-5)
    now = [p.grad for p in trainer.model.parameters()] + [p.grad for p in trainer.objective.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(now, grads))


def test_gradient_norm_with_clipping_returns_the_norm_before_clipping(tmp_path, tiny_config):
    trainer, images, labels = make_trainer(tmp_path, tiny_config, "optimizer.grad_clip=0.001")
    trainer.objective(trainer.model(images), labels).backward()
    params = [*trainer.model.parameters(), *trainer.objective.parameters()]
    expected = float(torch.linalg.vector_norm(torch.cat([p.grad.reshape(-1) for p in params])))
    assert expected > 0.001
    assert trainer._gradient_norm() == pytest.approx(expected, rel=1e-5)
    clipped = float(torch.linalg.vector_norm(torch.cat([p.grad.reshape(-1) for p in params])))
    assert clipped == pytest.approx(0.001, rel=1e-3)
