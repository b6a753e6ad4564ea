"""The Ray Data snippet of docs/scaling.md, run as written on a local Ray instance.

The snippet is read from the page (so the page and the test cannot drift apart); only its shared
paths become temporary ones and its 8 workers one, as a 2-core test machine allows. The rows Ray
writes must be the embeddings one process computes with ``dmlkit.load(run).embed(paths)``.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import ray
import torch

import dmlkit
from dmlkit.config import load_config
from dmlkit.recipe import Trainer

SCALING = Path(__file__).resolve().parents[2] / "docs" / "scaling.md"


def ray_snippet() -> str:
    blocks = re.findall(r"```python\n(.*?)```", SCALING.read_text(), flags=re.S)
    (snippet,) = [block for block in blocks if "import ray" in block]
    return snippet


def test_the_documented_ray_data_snippet_embeds_what_one_process_embeds(tmp_path):
    from PIL import Image

    run_dir = tmp_path / "run"
    cfg = load_config(overrides=[
        "data.name=digits", "train.max_steps=2", "train.progress=false", "eval.clustering=false",
        "model.ensemble=1", "model.shift_average=0", "train.num_threads=1",
    ])
    Trainer(cfg, run_dir, echo=lambda text: None).fit()
    photos = tmp_path / "photos" / "digits"
    photos.mkdir(parents=True)
    pixels = torch.randint(0, 256, (6, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    for i, image in enumerate(pixels):
        Image.fromarray(image.numpy(), mode="L").save(photos / f"{i}.jpg", quality=95)
    out = tmp_path / "embeddings"

    snippet = ray_snippet()
    for shared, local in [("/shared/runs/pets", run_dir), ("/shared/photos", tmp_path / "photos"),
                          ("/shared/embeddings/photos", out), ("concurrency=8", "concurrency=1")]:
        assert shared in snippet, f"docs/scaling.md's Ray snippet no longer contains {shared!r}"
        snippet = snippet.replace(shared, str(local))
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        exec(compile(snippet, str(SCALING), "exec"), {"__name__": "ray_snippet"})
    finally:
        ray.shutdown()

    table = pq.read_table(sorted(out.glob("*.parquet"))).to_pydict()  # rows follow Ray's order: key them by path
    got = {path: np.asarray(vector, dtype=np.float32) for path, vector in zip(table["path"], table["embedding"])}
    paths = sorted(str(p) for p in photos.glob("*.jpg"))
    assert sorted(got) == paths
    expected = dmlkit.load(run_dir).embed(paths).numpy()
    np.testing.assert_allclose(np.stack([got[p] for p in paths]), expected, rtol=0, atol=1e-5)
