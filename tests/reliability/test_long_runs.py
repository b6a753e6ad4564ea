"""Long and large runs: no memory growth over thousands of training steps, evaluation within its
memory bound, and a data-loader worker that fails on a corrupted file names that file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from dmlkit.config import load_config
from dmlkit.data import ImageFileDataset
from dmlkit.evaluation.embed import embed_dataset
from dmlkit.exceptions import DataError
from dmlkit.methods.hooks import MethodHooks
from dmlkit.recipe import Trainer

MiB = 2**20


def rss_bytes() -> int:
    """Resident set size of this process, from ``/proc/self/status`` (``VmRSS``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("VmRSS not found")


class RssProbe(MethodHooks):
    """Records RSS after a warm-up step count and again when training ends."""

    def __init__(self, warmup: int):
        self.warmup = warmup
        self.start = self.end = 0

    def after_backward(self, trainer):
        if trainer.step + 1 == self.warmup:
            self.start = rss_bytes()

    def on_train_end(self, trainer):
        self.end = rss_bytes()


def test_thousands_of_training_steps_do_not_grow_memory(tmp_path):
    steps, warmup = 2000, 300
    cfg = load_config(overrides=[
        "data.name=digits", "model.embedding_size=8", "sampler.batch_size=8", "sampler.m=2",
        f"train.max_steps={steps}", "train.log_every=50", "train.checkpoint_every=500", "train.progress=false",
        "eval.clustering=false", "eval.save_embeddings=false", "loss.name=proxy_anchor", "seed=3",
        "train.num_threads=1",  # one thread: cheap steps, no OpenMP spinning on a shared machine
    ])
    probe = RssProbe(warmup)
    threads = torch.get_num_threads()
    try:
        result = Trainer(cfg, tmp_path / "run", hooks=probe, echo=lambda _: None).fit()
    finally:
        torch.set_num_threads(threads)
    assert result.steps == steps
    assert probe.start > 0 and probe.end > 0
    growth = probe.end - probe.start
    assert growth < 24 * MiB, f"RSS grew by {growth / MiB:.1f} MiB over {steps - warmup} steps"
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert len([r for r in log if r["kind"] == "train"]) == steps // 50


EVAL_MEMORY_SCRIPT = r"""
import json, sys, torch
from pathlib import Path
from dmlkit.evaluation import retrieval_metrics

def status(key):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

n, d, per_class = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)
labels = torch.arange(n, dtype=torch.int64) // per_class
centers = torch.randn(n // per_class + 1, d, generator=g)
emb = torch.nn.functional.normalize(centers[labels] + 0.7 * torch.randn(n, d, generator=g), dim=1)
retrieval_metrics(emb[:512], labels[:512])  # load kernels and lazy modules first
Path("/proc/self/clear_refs").write_text("5")  # reset the peak (VmHWM) to the current RSS
base = status("VmRSS")
metrics = retrieval_metrics(emb, labels)
print(json.dumps({"extra": status("VmHWM") - base, "map_at_r": metrics["map_at_r"]}))
"""


def eval_memory_bound(n: int, d: int, k: int) -> int:
    """Documented bound on the extra peak memory of ``retrieval_metrics`` (docs/reliability.md).

    float64 + float32 working copies of the embeddings (12 N D bytes, bounded by 16 N D), the
    running shortlists (N (k + 4) (4 + 8) bytes, bounded by 64 N k) and the fixed tile and
    re-ranking budgets (256 MiB).
    """
    return 16 * n * d + 64 * n * k + 256 * MiB


def test_evaluation_memory_stays_within_its_bound(tmp_path):
    n, d, per_class = 20_000, 128, 10
    proc = subprocess.run([sys.executable, "-c", EVAL_MEMORY_SCRIPT, str(n), str(d), str(per_class)],
                          capture_output=True, text=True, timeout=900,
                          env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert 0.0 < out["map_at_r"] <= 1.0
    bound = eval_memory_bound(n, d, k=max(8, per_class))
    assert out["extra"] < bound, f"peak extra memory {out['extra'] / MiB:.0f} MiB > bound {bound / MiB:.0f} MiB"
    assert out["extra"] < 8 * n * n, "evaluation must never hold an N x N matrix"


def _to_tensor(img) -> torch.Tensor:
    return torch.from_numpy(np.asarray(img, dtype=np.float32)).permute(2, 0, 1) / 255.0


def test_data_loader_worker_failure_names_the_file(tmp_path):
    paths = []
    for i in range(12):
        path = tmp_path / "images" / f"img{i:02d}.png"
        path.parent.mkdir(exist_ok=True)
        Image.fromarray(np.full((8, 8, 3), 10 * i, dtype=np.uint8)).save(path)
        paths.append(str(path))
    corrupted = Path(paths[9])
    corrupted.write_bytes(corrupted.read_bytes()[:40])  # truncated PNG
    dataset = ImageFileDataset(paths, torch.arange(12) // 3, ["a", "b", "c", "d"], _to_tensor, name="folder/test")
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 4))
    with pytest.raises(DataError, match=r"(?s)worker process.*Cannot read image '.*img09\.png' \(item 9 of folder/test\)"):
        embed_dataset(model, dataset, batch_size=2, num_workers=2)
