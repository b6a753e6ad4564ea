"""A user's own image folder trains end to end with the default recipe and nothing else set."""

from __future__ import annotations

import json

import numpy as np
from PIL import Image

from dmlkit.cli.main import main


def test_folder_data_set_trains_with_the_default_recipe(tmp_path, capsys):
    rng = np.random.default_rng(0)
    for c in range(8):  # 8 classes of 6 RGB images, each class its own colour plus noise
        for k in range(6):
            base = np.array([c * 30, 255 - c * 30, (c * 70) % 255], dtype=np.int64)
            img = (base + rng.integers(0, 40, (24, 24, 3))).clip(0, 255).astype(np.uint8)
            path = tmp_path / "data" / f"class{c}" / f"{k}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(img).save(path)
    out = tmp_path / "run"
    code = main(["train", "--set", "data.name=folder", "--set", f"data.root={tmp_path / 'data'}", "-v",
                 "--no-report", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().err  # -v: every choice of the recipe with its reason, on stderr
    assert "recipe:   sampler.m = 2" in printed and "recipe:   sampler.batch_size = 10" in printed  # 5 of 8 classes train
    assert "split: 5 classes (30 images) train, 3 classes (18 images) test" in printed  # said before training
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == 240 and 0.0 < metrics["map_at_r"] <= 1.0
    saved = (out / "config.yaml").read_text()
    assert "m: 2" in saved and "batch_size: 10" in saved and "augment: translate" in saved  # resolved values saved
