"""Host synchronisations of the training loop: none per step with a fused optimiser, the loss read
every ``train.log_every`` steps, and non-finite steps skipped on the device (``found_inf``) then reported."""

import collections
import sys
from pathlib import Path

import pytest
import torch

import dmlkit.core.validation as validation
from dmlkit.engine import optim
from dmlkit.engine.callbacks import Callback
from dmlkit.exceptions import NonFiniteError
from dmlkit.recipe import Trainer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "losses"))
from _host_syncs import count_host_syncs  # noqa: E402 - the loss tests' counter

#: Proxy-NCA queues its label checks on a card and synchronises nowhere (tests/unit/losses/test_host_syncs.py).
NO_SYNC_LOSS = "loss.name=proxy_nca"


def as_on_a_card(monkeypatch, fused: bool = True) -> None:
    """Checks of data take the card's branch; ``build_optimizer`` picks the fused AdamW a card gets."""
    monkeypatch.setattr(validation, "reads_on_host", lambda tensor: False)
    if fused:
        monkeypatch.setattr(optim, "fused_capable", lambda groups: True)


class CountBetween(Callback):
    """Counts the host synchronisations from the end of step ``first`` to the end of step ``last``."""

    def __init__(self, first: int, last: int):
        self.first, self.last, self.counts, self.context = first, last, collections.Counter(), None

    def on_step_end(self, trainer, step, metrics):
        if step == self.first:
            self.context = count_host_syncs()
            self.counts = self.context.__enter__()
        elif step == self.last:
            self.context.__exit__(None, None, None)
            self.counts = collections.Counter(self.counts)


def fit(tmp_path, tiny_config, *overrides, callbacks=(), echo=lambda _: None):
    trainer = Trainer(tiny_config(NO_SYNC_LOSS, *overrides), tmp_path / "run", callbacks=list(callbacks), echo=echo)
    trainer.finish = lambda has_val: None  # the test split's evaluation is not a step
    trainer.fit()
    return trainer


def test_a_fused_optimiser_step_synchronises_only_at_the_log_record(tmp_path, tiny_config, monkeypatch):
    as_on_a_card(monkeypatch)
    window = CountBetween(2, 12)  # steps 3..12: the loss is read at steps 5 and 10
    trainer = fit(tmp_path, tiny_config, "train.max_steps=12", "train.log_every=5", callbacks=[window])
    assert trainer.optimizer.defaults["fused"] and trainer.step_checks is not None
    assert window.counts == {"Tensor.tolist": 2}  # formerly: two reads in each of the 10 steps


def test_without_a_fused_optimiser_one_read_checks_loss_and_gradients(tmp_path, tiny_config, monkeypatch):
    as_on_a_card(monkeypatch, fused=False)
    window = CountBetween(2, 12)
    trainer = fit(tmp_path, tiny_config, "optimizer.name=sgd", "train.max_steps=12", "train.log_every=5",
                  callbacks=[window])
    assert trainer.step_checks is None
    # one read of (loss, gradient norm) per step before its update, and the logged loss at steps 5 and 10
    assert window.counts == {"Tensor.tolist": 10, "aten._local_scalar_dense.default": 2}


class Snapshots(Callback):
    """The weights at the end of every step."""

    def __init__(self):
        self.weights = {}

    def on_step_end(self, trainer, step, metrics):
        self.weights[step] = [p.detach().clone() for p in trainer.model.parameters()]


def poison_step(trainer_holder: list, step: int):
    """A forward hook on the objective that makes the loss of training step ``step`` (1-based) NaN."""

    def hook(module, inputs, out):
        return out * float("nan") if trainer_holder[0].step == step - 1 else out

    return hook


def fit_with_a_nan_step(tmp_path, tiny_config, monkeypatch, policy, messages):
    as_on_a_card(monkeypatch)
    snapshots = Snapshots()
    trainer = Trainer(tiny_config(NO_SYNC_LOSS, "train.max_steps=8", "train.log_every=4",
                                  f"train.on_nonfinite={policy}"),
                      tmp_path / "run", callbacks=[snapshots], echo=messages.append)
    trainer.finish = lambda has_val: None
    trainer.objective.register_forward_hook(poison_step([trainer], 3))
    return trainer, snapshots


def same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


def test_skip_leaves_the_non_finite_step_out_on_the_device_and_reports_it(tmp_path, tiny_config, monkeypatch):
    messages = []
    trainer, snapshots = fit_with_a_nan_step(tmp_path, tiny_config, monkeypatch, "skip", messages)
    trainer.fit()
    weights = snapshots.weights
    assert same(weights[2], weights[3]) and not same(weights[3], weights[4]) and not same(weights[1], weights[2])
    steps = {int(state["step"]) for state in trainer.optimizer.state.values()}
    assert steps == {7}  # 8 steps, the poisoned one not counted by the optimiser
    assert trainer.scheduler.last_epoch == 8  # the schedule stays aligned with the step count
    assert [m for m in messages if "non-finite" in m] == [
        "warning: steps up to 4: 1 non-finite step(s) skipped since the last log record"]


def test_stop_raises_at_the_next_read_with_the_weights_before_the_non_finite_step(tmp_path, tiny_config,
                                                                                 monkeypatch):
    trainer, snapshots = fit_with_a_nan_step(tmp_path, tiny_config, monkeypatch, "stop", [])
    with pytest.raises(NonFiniteError, match="at step 3; training stopped, weights were not updated from step 3 on"):
        trainer.fit()
    assert trainer.step == 4  # read with the log record of step 4
    assert same([p.detach() for p in trainer.model.parameters()], snapshots.weights[2])
    assert not trainer.run_dir.last_checkpoint.exists()
