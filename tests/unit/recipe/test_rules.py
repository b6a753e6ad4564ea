"""The recipe reads the training split: classes, images per class, size and kind of image."""

from __future__ import annotations

import pytest
import torch

from dmlkit.config import load_config
from dmlkit.data.base import TensorImageDataset
from dmlkit.recipe import rules as recipe_module
from dmlkit.recipe.rules import profile_split, resolve, resolve_model


def glyphs(num_classes: int, per_class: int, size: int = 28, background: int = 255) -> TensorImageDataset:
    g = torch.Generator().manual_seed(0)
    n = num_classes * per_class
    images = torch.full((n, 1, size, size), background, dtype=torch.uint8)
    strokes = torch.randint(0, 256, (n, 1, size - 8, size - 8), generator=g, dtype=torch.int64).to(torch.uint8)
    images[:, :, 4:-4, 4:-4] = strokes  # ink in the middle, a clean background border
    labels = torch.arange(num_classes).repeat_interleave(per_class)
    return TensorImageDataset(images, labels, [f"c{i}" for i in range(num_classes)])


def photos(num_classes: int, per_class: int, size: int = 32) -> TensorImageDataset:
    g = torch.Generator().manual_seed(1)
    n = num_classes * per_class
    images = torch.randint(0, 256, (n, 3, size, size), generator=g, dtype=torch.int64).to(torch.uint8)
    return TensorImageDataset(images, torch.arange(num_classes).repeat_interleave(per_class), list(range(num_classes)))


def choices_for(dataset, bf16_native: bool = False, **overrides):
    cfg = load_config(overrides=[f"{k}={v}" for k, v in overrides.items()])
    return {k: v for k, (v, _) in resolve(cfg, profile_split(dataset), bf16_native=bf16_native).items()}


def test_profile_reads_counts_shape_background_and_kind():
    p = profile_split(glyphs(6, 20, background=255))
    assert (p.num_images, p.num_classes, p.median_per_class, p.min_per_class) == (120, 6, 20, 20)
    assert (p.channels, p.height, p.width, p.in_memory, p.kind) == (1, 28, 28, True, "glyph")
    assert p.background == (1.0,)
    assert profile_split(glyphs(6, 20, background=0)).background == (0.0,)
    assert profile_split(photos(4, 10)).kind == "photo"


@pytest.mark.parametrize(
    "dataset, expected",
    [
        # few classes, many images each (MNIST-like): m=16, translate, ~80k images seen, one model
        (glyphs(5, 500), {"sampler.m": 16, "sampler.batch_size": 64, "data.augment": "translate",
                          "train.max_steps": 1250, "model.ensemble": 1, "model.shift_average": 2}),
        # many classes, 20 each (Omniglot-like): m=4, affine; 4,000 images -> 20 epochs; 3 members
        (glyphs(200, 20), {"sampler.m": 4, "data.augment": "affine", "train.max_steps": 1250,
                           "model.ensemble": recipe_module.ENSEMBLE_MEMBERS, "model.shift_average": 2}),
        # two images per class: m=2 (pairs), affine, 80 epochs of a small set
        (glyphs(50, 2), {"sampler.m": 2, "sampler.batch_size": 64, "data.augment": "affine", "train.max_steps": 125,
                         "model.ensemble": recipe_module.ENSEMBLE_MEMBERS}),
        # 500 images per class, three classes: batches of all 3 classes x 16; 1,500 images -> 53 epochs
        (glyphs(3, 500), {"sampler.m": 16, "sampler.batch_size": 48, "data.augment": "translate",
                          "train.max_steps": 1656, "model.ensemble": 1}),
        # small photos in memory: shifts, not glyph warps
        (photos(10, 40), {"sampler.m": 8, "data.augment": "translate", "train.max_steps": 500,
                          "model.ensemble": recipe_module.ENSEMBLE_MEMBERS, "model.shift_average": 2}),
        # tiny 8x8 glyphs (digits-like): no shift averaging
        (glyphs(5, 180, size=8), {"sampler.m": 16, "model.shift_average": 0, "model.ensemble": 1}),
        # larger photos: one model, no shift averaging
        (photos(10, 40, size=96), {"model.ensemble": 1, "model.shift_average": 0}),
    ],
    ids=["few-classes", "many-classes", "two-per-class", "500-per-class", "photos", "8x8", "96px-photos"],
)
def test_resolved_recipe_for_synthetic_shapes(dataset, expected):
    got = choices_for(dataset)
    for key, value in expected.items():
        assert got[key] == value, key
    assert got["optimizer.loss_lr_multiplier"] == 100.0
    assert got["train.eval_every"] == got["train.max_steps"]  # no validation split configured here


def test_mixed_precision_auto_follows_the_device_and_asap_keeps_one_model():
    assert choices_for(glyphs(5, 500), bf16_native=True, **{"train.mixed_precision": "auto"})["train.mixed_precision"] == "bf16"
    assert choices_for(glyphs(5, 500), bf16_native=False, **{"train.mixed_precision": "auto"})["train.mixed_precision"] == "none"
    assert "train.mixed_precision" not in choices_for(glyphs(5, 500), bf16_native=True, **{"train.mixed_precision": "none"})
    asap = choices_for(glyphs(200, 20), **{"asap.enabled": True, "protocol.fold": 0})
    assert asap["model.ensemble"] == 1


def test_user_values_are_never_overridden_and_m_divides_the_batch():
    got = choices_for(glyphs(200, 20), **{"sampler.m": 8, "train.max_steps": 77, "data.augment": "none"})
    assert "sampler.m" not in got and "train.max_steps" not in got and "data.augment" not in got
    assert choices_for(glyphs(5, 500), **{"sampler.batch_size": 30})["sampler.m"] == 15
    # small images from scratch validate at every quarter (SCRATCH_EVALUATIONS), not ten times
    assert choices_for(glyphs(5, 500), **{"protocol.val_class_fraction": 0.2})["train.eval_every"] == 313  # ceil(1,250 / 4)


def model_args_for(dataset, **overrides) -> dict:
    """``model.args`` the recipe gives the default job's ``model.name=auto`` on ``dataset``."""
    cfg = load_config(preset="mnist-proxy-anchor", overrides=[f"{k}={v}" for k, v in overrides.items()])
    return resolve_model(cfg, profile_split(dataset))["model.args"][0]


def test_ensemble_members_are_narrower_than_one_model():
    # the recipe's 3 members (Omniglot-like: 20 images per class) are of width 16: three cost about one of width 32
    assert model_args_for(glyphs(200, 20)) == {"width": recipe_module.ENSEMBLE_MEMBER_WIDTH, "in_chans": 1} == \
        {"width": 16, "in_chans": 1}
    # one model (MNIST-like: 500 per class), an ensemble of one set by hand, ASAP's one model: the width-32 CNN
    assert model_args_for(glyphs(5, 500))["width"] == 32
    assert model_args_for(glyphs(200, 20), **{"model.ensemble": 1})["width"] == 32
    assert model_args_for(glyphs(200, 20), **{"asap.enabled": True, "protocol.fold": 0})["width"] == 32
    # two members set by hand are an ensemble too; a width set by hand is kept
    assert model_args_for(glyphs(5, 500), **{"model.ensemble": 2})["width"] == 16
    cfg = load_config(preset="mnist-proxy-anchor", overrides=["model.args.width=48"])
    assert resolve_model(cfg, profile_split(glyphs(200, 20)))["model.args"][0] == {"width": 48, "in_chans": 1}
