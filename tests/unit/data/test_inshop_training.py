"""In-Shop trains end to end: queries scored against the gallery, both embedding files written."""

from __future__ import annotations

import json

import numpy as np

from dmlkit.config import load_config
from dmlkit.recipe import Trainer


def test_query_gallery_run_scores_queries_against_the_gallery_and_saves_both(inshop_root, tmp_path):
    cfg = load_config(overrides=[
        "data.name=inshop", f"data.root={inshop_root}", "data.image_size=16", "model.args={width: 4}",
        "sampler.batch_size=4", "sampler.m=2", "train.max_steps=2", "train.progress=false",
        "train.mixed_precision=none", "model.shift_average=0", "model.ensemble=1",
    ])
    result = Trainer(cfg, tmp_path / "run", echo=lambda _: None).fit()
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["map_at_r"] == result.test_metrics["map_at_r"]
    assert 0.0 <= metrics["precision_at_1"] <= 1.0 and "nmi" in metrics
    assert metrics["num_genuine_pairs"] + metrics["num_impostor_pairs"] == 9 * 8 // 2  # queries and gallery together
    with np.load(tmp_path / "run" / "embeddings" / "test.npz") as q, \
            np.load(tmp_path / "run" / "embeddings" / "gallery.npz") as g:
        assert q["embeddings"].shape[0] == 3 and g["embeddings"].shape[0] == 6  # 3 queries, 6 gallery images
        assert set(q["labels"].tolist()) <= set(g["labels"].tolist())
