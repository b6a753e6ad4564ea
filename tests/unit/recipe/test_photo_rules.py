"""The recipe reads photos as photos: a pretrained backbone, its preprocessing, sizes from the images."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from PIL import Image

from dmlkit.config import load_config
from dmlkit.data.base import ImageFileDataset
from dmlkit.recipe import rules as recipe_module
from dmlkit.recipe.rules import DataProfile, profile_split, resolve, resolve_model, val_class_fraction_for


def profile(num_classes: int, per_class: int, side: int, kind: str = "photo", in_memory: bool = False) -> DataProfile:
    return DataProfile(num_images=num_classes * per_class, num_classes=num_classes, median_per_class=per_class,
                       min_per_class=per_class, channels=3, height=side, width=side * 4 // 3, in_memory=in_memory,
                       background=(0.5, 0.5, 0.5), kind=kind)


def resolved(p: DataProfile, *overrides: str) -> dict:
    """Both recipe phases on the default job, as the trainer runs them (the model's choices applied first)."""
    cfg = load_config(preset="mnist-proxy-anchor", overrides=list(overrides))
    first = resolve_model(cfg, p)
    recipe_module.apply(cfg, first)
    after = DataProfile(**{**p.__dict__, "in_memory": True, "height": cfg.data.image_size or p.height,
                           "width": cfg.data.image_size or p.width})
    second = resolve(cfg, after, bf16_native=True)
    return {k: v for k, (v, _) in {**first, **second}.items()}


@pytest.mark.parametrize(
    "classes, per_class, side, expected",
    [
        # few classes, 10 photos each, large photos (the Pets development set's shape): 288-px view
        (18, 10, 375, {"data.image_size": 288, "data.crop_size": 224, "sampler.m": 2, "sampler.batch_size": 36,
                       "train.max_steps": 200}),  # the 40-epoch ceiling of 180 photos at 36 a batch
        # many classes, 500 photos each, small photos: 224-px view (upsampled), the minimum of 2 epochs
        (200, 500, 120, {"data.image_size": 224, "data.crop_size": 224, "sampler.m": 16, "train.max_steps": 3125}),
        # (the ceilings: about 60,000 images seen; the time budget and the validation classes end runs sooner)
        # few classes, 500 photos each, mid-size photos: the largest multiple of 32 a centre crop holds
        (5, 500, 300, {"data.image_size": 256, "data.crop_size": 224, "train.max_steps": 938}),
        # many classes, 10 photos each, large photos
        (500, 10, 600, {"data.image_size": 288, "sampler.m": 2, "train.max_steps": 938}),
    ],
)
def test_photos_get_a_pretrained_backbone_with_its_own_features(classes, per_class, side, expected):
    got = resolved(profile(classes, per_class, side))
    assert got["model.name"] == "efficientnet_lite0" and got["model.pretrained"] is True
    assert got["model.pooling"] == "gem" and got["model.head_init"] == "identity" and got["model.freeze_bn"] is True
    assert got["model.flip_average"] is True
    assert "model.args" not in got  # a pretrained backbone keeps its 3 input channels and takes no small-CNN args
    assert got["optimizer.lr"] == recipe_module.PRETRAINED_LR
    assert got["optimizer.head_lr_multiplier"] == recipe_module.PRETRAINED_HEAD_LR_MULTIPLIER
    assert got["optimizer.scheduler"] == "wsd"  # a budget cut short by load keeps its rate for most steps
    assert got["data.augment"] == "crop" and got["model.ensemble"] == 1 and got["model.shift_average"] == 0
    for key, value in expected.items():
        assert got[key] == value, key


def test_glyphs_keep_the_small_cnn_from_scratch_on_their_own_channels():
    got = resolved(profile(54, 20, 28, kind="glyph", in_memory=True))
    assert got["model.name"] == "small_cnn" and got["model.pretrained"] is False
    # colour glyphs stay in colour; 20 per class: the recipe's ensemble, whose members are of width 16
    assert got["model.args"] == {"width": recipe_module.ENSEMBLE_MEMBER_WIDTH, "in_chans": 3}
    assert got["model.embedding_size"] == 64 and got["model.pooling"] == "avg" and got["model.flip_average"] is False
    assert got["model.head_init"] == "kaiming" and got["model.freeze_bn"] is False
    # narrow members take the larger step the validation characters chose; one model of width 32 keeps SCRATCH_LR
    assert got["optimizer.lr"] == recipe_module.ENSEMBLE_MEMBER_LR and got["optimizer.head_lr_multiplier"] == 1.0
    assert got["optimizer.scheduler"] == "cosine"
    one = resolved(profile(54, 20, 28, kind="glyph", in_memory=True), "model.ensemble=1")
    assert one["model.args"]["width"] == 32 and one["optimizer.lr"] == recipe_module.SCRATCH_LR
    assert "data.image_size" not in got and "data.crop_size" not in got


def test_a_users_model_and_values_are_kept():
    got = resolved(profile(18, 10, 375), "model.name=small_cnn", "optimizer.lr=0.01", "data.image_size=160",
                   "optimizer.scheduler=step")
    assert "model.name" not in got and "optimizer.scheduler" not in got and got["model.pretrained"] is False  # no offline weights asked for
    assert got["model.args"] == {"in_chans": 3}  # RGB kept for a small CNN on photos
    assert "optimizer.lr" not in got and "data.image_size" not in got
    assert "data.crop_size" not in got  # trained from scratch: the images as they are, no pretrained view


def test_validation_classes_for_a_pretrained_backbone_even_when_few():
    assert val_class_fraction_for(profile(18, 10, 300), pretrained=True) == pytest.approx(1 / 3)
    assert val_class_fraction_for(profile(18, 10, 300), pretrained=False) == 0.0
    assert val_class_fraction_for(profile(3, 10, 300), pretrained=True) == 0.0
    assert val_class_fraction_for(profile(4, 10, 300), pretrained=True) == 0.5  # 2 held out, 2 left
    # a third rounded down, at least 2: 8 classes hold out 2 and train on 6 (a third rounded would hold out 3)
    assert [round(val_class_fraction_for(profile(c, 10, 300), pretrained=True) * c) for c in (5, 8, 12, 14, 19)] \
        == [2, 2, 4, 4, 6]
    assert val_class_fraction_for(profile(40, 10, 300), pretrained=True) == 0.2


def test_profile_reads_size_and_kind_of_image_files_without_decoding_them_all(tmp_path):
    g = torch.Generator().manual_seed(0)
    paths = []
    for i in range(6):  # smooth random colour fields, as photographs vary along their borders
        coarse = torch.rand(1, 3, 4, 4, generator=g)
        pixels = torch.nn.functional.interpolate(coarse, size=(300 + 10 * i, 400), mode="bicubic", align_corners=False)
        path = tmp_path / f"{i}.jpg"
        Image.fromarray((pixels[0].permute(1, 2, 0).clamp(0, 1) * 255).byte().numpy()).save(path)
        paths.append(str(path))
    p = profile_split(ImageFileDataset(paths, torch.tensor([0, 0, 0, 1, 1, 1]), ["a", "b"]))
    assert (p.kind, p.in_memory, p.channels, p.width) == ("photo", False, 3, 400)
    assert p.height == 320  # the median of 300..350


def test_no_rule_is_keyed_on_a_data_set_name():
    from dmlkit.data import DATASETS

    source = Path(recipe_module.__file__).read_text()
    literals = {node.value.lower() for node in ast.walk(ast.parse(source))
                if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    names = {n.lower() for n in DATASETS.names()} | {"pets", "cub", "cars", "sop", "inshop", "mnist", "omniglot"}
    assert not literals & names


def test_on_a_gpu_the_same_rules_buy_ten_times_the_images_seen():
    cfg = load_config(preset="mnist-proxy-anchor")
    p = profile(5, 500, 300)
    recipe_module.apply(cfg, resolve_model(cfg, p))
    cpu = resolve(cfg, p, bf16_native=True)["train.max_steps"][0]
    gpu, reason = resolve(cfg, p, bf16_native=True, accelerator=True)["train.max_steps"]
    assert (cpu, gpu) == (938, 1562)  # 24 epochs of 2,500 photos; on a GPU the 40-epoch cap
    assert "on a GPU" in reason


def test_dataloader_workers_only_for_a_gpu_reading_from_disk():
    cfg = load_config(preset="mnist-proxy-anchor")
    on_disk, in_memory = profile(18, 10, 375), profile(18, 10, 375, in_memory=True)
    assert resolve(cfg, on_disk, accelerator=True)["data.num_workers"][0] >= 1
    assert resolve(cfg, on_disk)["data.num_workers"][0] == 0
    assert resolve(cfg, in_memory, accelerator=True)["data.num_workers"][0] == 0


def test_a_cpu_fine_tunes_the_late_stages_only_and_a_gpu_every_layer():
    p = profile(18, 10, 375)
    cfg = load_config(preset="mnist-proxy-anchor")
    assert resolve_model(cfg, p)["model.frozen_stages"][0] == recipe_module.CPU_FROZEN_STAGES == 2
    assert resolve_model(cfg, p, accelerator=True)["model.frozen_stages"][0] == 0
    glyphs = profile(18, 10, 28, kind="glyph", in_memory=True)
    assert resolve_model(cfg, glyphs)["model.frozen_stages"][0] == 0  # trained from scratch: every layer learns
    user = load_config(preset="mnist-proxy-anchor", overrides=["model.frozen_stages=4"])
    assert "model.frozen_stages" not in resolve_model(user, p)  # the user's value is kept


def test_a_backbone_far_from_the_validation_classes_fine_tunes_faster():
    far, why_far = recipe_module.pretrained_lr_choice(0.61, "374 images of 8 validation classes")
    near, why_near = recipe_module.pretrained_lr_choice(0.68, "498 images of 6 validation classes")
    assert far == recipe_module.FAR_PRETRAINED_LR > near == recipe_module.PRETRAINED_LR
    assert "0.6100, below 0.65" in why_far and "374 images of 8 validation classes" in why_far
    assert "0.6800, at or above 0.65" in why_near
    assert recipe_module.pretrained_lr_choice(recipe_module.FAR_FROM_PRETRAINING, "x")[0] == recipe_module.PRETRAINED_LR
