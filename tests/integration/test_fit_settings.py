"""``dmlkit.fit``: the documented ``optimizer={"lr": ...}`` form, and resuming only the run that was asked for."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import dmlkit
from dmlkit.api import REQUEST_FILE, describe_object
from dmlkit.exceptions import ConfigError
from dmlkit.losses import ProxyAnchorLoss


class Blobs(torch.utils.data.Dataset):
    """Tiny images [1, 4, 4]: ``per_class`` noisy copies of one pattern per class."""

    def __init__(self, classes, per_class=6):
        g = torch.Generator().manual_seed(0)
        self.targets = [c for c in classes for _ in range(per_class)]
        centres = {c: torch.randn(1, 4, 4, generator=g) for c in classes}
        self.images = [centres[c] + 0.1 * torch.randn(1, 4, 4, generator=g) for c in self.targets]

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, i):
        return self.images[i], self.targets[i]


def small_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 8))


SMALL = dict(train={"max_steps": 2, "eval_every": 2, "progress": False}, sampler={"batch_size": 8, "m": 2},
             eval={"clustering": False}, report=False, echo=lambda _: None)


def fit(out, *, loss=None, **changes):
    settings = {**SMALL, **changes}
    return dmlkit.fit(small_net(), loss or ProxyAnchorLoss(num_classes=6, embedding_size=8), Blobs(range(6)),
                      test_data=Blobs(range(6, 9)), val_data=Blobs(range(9, 12)), out=out, **settings)


def test_optimizer_settings_as_a_dict_are_the_config_section(tmp_path):
    fit(tmp_path, optimizer={"lr": 3e-4})
    assert "lr: 0.0003" in (tmp_path / "config.yaml").read_text()


def test_an_optimizer_of_another_kind_is_named():
    with pytest.raises(ConfigError, match="optimizer must be a torch.optim.Optimizer or a dict"):
        fit("unused", optimizer="adam")


def test_changed_settings_on_an_existing_run_are_refused_with_the_differences(tmp_path):
    fit(tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    with pytest.raises(ConfigError) as info:
        fit(tmp_path, train={"max_steps": 3, "eval_every": 3, "progress": False})
    message = str(info.value)
    assert "train.max_steps: 2 -> 3" in message and "train.eval_every: 2 -> 3" in message
    assert "another out=" in message and "same settings" in message
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before


def test_a_loss_object_with_other_arguments_is_refused(tmp_path):
    fit(tmp_path)
    with pytest.raises(ConfigError, match=r"loss\.args\.margin: 0\.1 -> 0\.3"):
        fit(tmp_path, loss=ProxyAnchorLoss(num_classes=6, embedding_size=8, margin=0.3))


def test_the_same_call_resumes_the_run(tmp_path):
    first = fit(tmp_path)
    again = fit(tmp_path)
    assert (again.steps, again.best_step) == (first.steps, first.best_step)
    request = json.loads((tmp_path / REQUEST_FILE).read_text())
    assert request["train.max_steps"] == "2" and request["loss.class"].endswith("ProxyAnchorLoss")


def test_describe_object_keeps_constructor_arguments_and_shapes():
    described = describe_object(ProxyAnchorLoss(num_classes=3, embedding_size=4, margin=0.2))
    assert described["args.margin"] == "0.2" and "(3, 4)" in described["shapes"]
    assert describe_object(torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.5))["args.lr"] == "0.5"


def test_patience_stops_on_the_validation_split_given_to_fit_and_needs_one_otherwise(tmp_path):
    result = fit(tmp_path / "given", train={"max_steps": 40, "eval_every": 2, "patience": 1, "progress": False})
    assert 0 < result.steps < 40  # stopped by the given validation split, not the cap
    with pytest.raises(ConfigError, match="train.patience needs a validation split"):
        dmlkit.fit(small_net(), ProxyAnchorLoss(num_classes=6, embedding_size=8), Blobs(range(6)), out=tmp_path / "none",
                   protocol={"val_class_fraction": 0}, **{**SMALL, "train": {"max_steps": 4, "patience": 1}})
