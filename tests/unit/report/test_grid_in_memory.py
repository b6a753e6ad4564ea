"""The retrieval grid of an in-memory data set (MNIST, digits) shows the pictures and the original class names."""

from __future__ import annotations

import numpy as np
import torch

from dmlkit.config import load_config
from dmlkit.data.base import TensorImageDataset
from dmlkit.engine.run_dir import display_class_names
from dmlkit.report.run_reader import TestEmbeddings


def test_in_memory_split_gives_thumbnails_and_names():
    images = torch.arange(6 * 28 * 28, dtype=torch.int64).reshape(6, 1, 28, 28).remainder(256).to(torch.uint8)
    ds = TensorImageDataset(images, torch.tensor([0, 0, 1, 1, 2, 2]), ["5", "6", "7"])
    thumbs = ds.thumbnails()
    assert thumbs.shape == (6, 28, 28) and thumbs.dtype == np.uint8
    assert np.array_equal(thumbs[3], images[3, 0].numpy())  # the pixels themselves, not a placeholder
    big = TensorImageDataset(torch.zeros(2, 3, 128, 96, dtype=torch.uint8), torch.tensor([0, 1]), ["a", "b"])
    assert big.thumbnails().shape == (2, 64, 48, 3)
    cfg = load_config()
    assert display_class_names(ds.class_names, cfg) == ["digit 5", "digit 6", "digit 7"]
    assert display_class_names(["Greek/character03"], cfg) == ["Greek/character03"]
    data = TestEmbeddings(np.zeros((6, 2), np.float32), np.array([0, 0, 1, 1, 2, 2]),
                          class_names=np.asarray(["digit 5", "digit 6", "digit 7"]))
    assert data.label_name(2) == "digit 7" and TestEmbeddings(np.zeros((1, 2)), np.array([4])).label_name(4) == "class 4"


def test_mnist_run_saves_thumbnails_and_names_for_the_report(tmp_path):
    from dmlkit.cli.main import main
    from dmlkit.report.run_reader import load_run

    out = tmp_path / "run"
    # the default job without its 25-shift test embedding (the recipe's model.shift_average=2): thumbnails, names
    # and split sizes do not depend on how the embeddings were averaged
    assert main(["train", "--set", "train.max_steps=2", "--set", "model.shift_average=0", "--quiet", "--no-report",
                 "--out", str(out)]) == 0
    run = load_run(out)
    assert run.env["device"] == "cpu"  # the device trained on is in the environment record
    assert run.split_sizes["test"] == (5, run.embeddings.labels.shape[0])  # split sizes from manifest.json
    emb = run.embeddings
    assert emb.thumbnails is not None and emb.thumbnails.shape[1:] == (28, 28)
    assert list(emb.class_names) == [f"digit {d}" for d in range(5, 10)]
    from dmlkit.report.retrieval_grid import load_images

    pictures = load_images(emb, np.array([0, 1]), out)
    assert all(p is not None and p.shape == (28, 28) for p in pictures)
