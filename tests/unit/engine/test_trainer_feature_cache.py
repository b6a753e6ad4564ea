"""The Trainer on a tiny folder of photos (random-texture JPEGs, the pretrained EfficientNet-Lite0 with 2 frozen
stages): it trains from the feature cache, writes its metrics, and a resumed run ends with the same weights."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from dmlkit.config import load_config
from dmlkit.engine.checkpoint_files import load_checkpoint
from dmlkit.recipe import Trainer


def write_photo_folder(root, classes: int = 8, per_class: int = 6, side: int = 80):
    """``classes`` folders of random-texture JPEGs (each class its own colour cast): photos, not glyphs."""
    rng = np.random.default_rng(0)
    for c in range(classes):
        tint = rng.uniform(0, 255, 3)
        for i in range(per_class):
            noise = rng.uniform(0, 255, (side, side, 3))
            pixels = (0.5 * noise + 0.5 * tint).clip(0, 255).astype(np.uint8)
            (root / f"class{c}").mkdir(parents=True, exist_ok=True)
            Image.fromarray(pixels).save(root / f"class{c}" / f"{i}.jpg", quality=90)
    return root


@pytest.fixture(scope="module")
def photo_root(tmp_path_factory):
    return write_photo_folder(tmp_path_factory.mktemp("photos") / "images")


def photo_config(root, *overrides: str):
    return load_config(preset="mnist-proxy-anchor", overrides=[
        "data.name=folder", f"data.root={root}", "data.image_size=64", "data.crop_size=48",
        "train.max_steps=4", "train.log_every=1", "train.eval_every=1000", "train.checkpoint_every=2", "train.progress=false",
        "train.mixed_precision=none", "model.shift_average=0", "model.flip_average=false", "eval.clustering=false", "eval.save_embeddings=false", *overrides])


def test_a_photo_run_trains_from_the_feature_cache_and_writes_metrics(tmp_path, photo_root):
    lines = []
    trainer = Trainer(photo_config(photo_root), tmp_path / "run", echo=lines.append)
    assert trainer.cfg.model.name.startswith("efficientnet_lite") and trainer.cfg.model.frozen_stages == 2
    assert any(line.startswith("recipe:   train.feature_cache = on  (the stem and 2 frozen stages") for line in lines)
    frozen = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if not p.requires_grad}
    trained = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    result = trainer.fit()
    cache = trainer.feature_cache
    assert cache is not None and cache.storage.dtype == torch.bfloat16
    assert trainer.train_forward == trainer.model.forward_from_prefix
    assert cache.views == trainer.cfg.train.cache_views >= 2 and len(cache.storage) == len(trainer.splits.train)
    assert any(line.startswith("feature cache: built in") for line in lines)
    assert result.steps == 4
    losses = [r["loss"] for r in trainer.run_dir.read_log() if r.get("kind") == "train"]
    assert len(losses) == 4 and all(np.isfinite(losses))
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert 0.0 < metrics["map_at_r"] <= 1.0 and metrics["steps"] == 4
    state = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")["model"]  # the trained weights of step 4
    assert all(torch.equal(state[n], p) for n, p in frozen.items())
    assert any(not torch.equal(state[n], p) for n, p in trained.items() if n.startswith("trunk."))


def test_a_resumed_run_rebuilds_the_cache_and_ends_with_the_same_weights(tmp_path, photo_root, crash_in_step):
    whole = Trainer(photo_config(photo_root), tmp_path / "whole", echo=lambda _: None)
    whole.fit()
    cut = Trainer(photo_config(photo_root), tmp_path / "cut", echo=lambda _: None)
    crash_in_step(cut, 3)
    with pytest.raises(KeyboardInterrupt):
        cut.fit()
    saved = load_checkpoint(tmp_path / "cut" / "checkpoints" / "last.pt")
    assert saved["step"] == 2
    resumed = Trainer(load_config(path=tmp_path / "cut" / "config.yaml"), tmp_path / "cut", resume=True,
                      echo=lambda _: None)
    assert resumed.cfg.train.feature_cache == "on"  # config.yaml holds the resolved choice
    resumed.fit()
    assert torch.equal(resumed.feature_cache.storage, whole.feature_cache.storage)
    trained = [load_checkpoint(run / "checkpoints" / "last.pt")["model"] for run in (tmp_path / "whole", tmp_path / "cut")]
    assert trained[0].keys() == trained[1].keys()
    for name in trained[0]:
        torch.testing.assert_close(trained[1][name], trained[0][name], rtol=0, atol=0, msg=name)


def test_under_a_time_budget_the_cache_is_built_only_when_the_planned_epochs_make_it_pay(tmp_path, photo_root):
    from dmlkit.recipe.feature_cache_plan import EPOCHS_PER_VIEW, views_for_epochs

    assert [views_for_epochs(e, 8) for e in (2, 5.9, 6, 13, 100)] == [0, 0, 2, 4, 8]
    lines = []
    long = Trainer(photo_config(photo_root, "train.max_steps=40", "train.time_budget=100000"), tmp_path / "long",
                   echo=lines.append)
    assert long.cache_deferred and long.feature_cache is None
    long.fit()
    epochs = 40 * long.cfg.sampler.batch_size / len(long.splits.train)
    assert long.feature_cache is not None and long.feature_cache.views == min(8, int(epochs // EPOCHS_PER_VIEW))
    plans = [r for r in long.run_dir.read_log() if r.get("kind") == "plan"]
    assert [p["step"] for p in plans] == [4, 8]  # planned, cache built, steps timed again and planned again
    assert any(line.startswith("feature cache: built in") for line in lines)
    short = Trainer(photo_config(photo_root, "train.max_steps=5", "train.time_budget=100000"), tmp_path / "short",
                    echo=lines.append)
    assert short.fit().steps == 5 and short.feature_cache is None
    assert any(line.startswith("feature cache: not built: the budget buys about") for line in lines)
