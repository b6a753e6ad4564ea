"""Omniglot development set: `dmlkit train` with data options only vs a plain pytorch-metric-learning loop.

Run:  .venv/bin/python benchmarks/bench_omniglot_recipe.py [--root ../shared/data/omniglot] [--seeds 0 1 2]

Split (both sides): characters sorted by ``alphabet/character``, first half train, second half test,
images resized to 28x28. dmlkit runs ``dmlkit train --set data.name=omniglot --set data.root=ROOT
--set data.label=character --set data.image_size=28`` (the recipe decides everything else, choosing
checkpoints on held-out training characters). The PML loop is written here: a small CNN (three
conv-BN-ReLU-maxpool blocks, a linear 64-D head), Adam, Proxy-Anchor from PML, random batches of
64, test MAP@R with PML's AccuracyCalculator; "plain" trains 20 epochs, "affine" 80 epochs with
rotation +-14 deg, scale +-10 %, shift +-5 %. Every run is timed on the wall clock, one after another.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_ROOT = HERE.parent.parent / "shared" / "data" / "omniglot"


def dmlkit_run(root: Path, seed: int) -> dict:
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "dmlkit", "train", "--set", "data.name=omniglot", "--set", f"data.root={root}",
             "--set", "data.label=character", "--set", "data.image_size=28", "--set", f"seed={seed}",
             "--quiet", "--no-report", "--out", f"{out}/run"],
            check=True, capture_output=True, text=True,
        )
        wall = time.perf_counter() - t0
        metrics = json.loads(Path(out, "run", "metrics.json").read_text())
    return {"map_at_r": metrics["map_at_r"], "precision_at_1": metrics["precision_at_1"], "seconds": wall}


def pml_loop(root: Path, seed: int, augment: bool) -> dict:
    """A plain PML training loop on the same split (its own code, nothing from dmlkit's engine)."""
    import torch
    import torchvision.transforms.v2 as T
    from pytorch_metric_learning.losses import ProxyAnchorLoss
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

    from dmlkit.data.omniglot import read_omniglot  # the same pooled, sorted split as `dmlkit train`

    t0 = time.perf_counter()
    torch.manual_seed(seed)
    sources = read_omniglot(str(root))

    def tensors(src):
        x = src.images.float() / 255.0 if src.images is not None else None
        if x is None:
            import numpy as np
            from PIL import Image
            x = torch.stack([torch.from_numpy(np.asarray(Image.open(p).convert("L"), dtype=np.float32) / 255.0)[None]
                             for p in src.paths])
        x = torch.nn.functional.interpolate(x, size=(28, 28), mode="bilinear", antialias=True)
        names = sorted(set(src.names["character"]))
        y = torch.tensor([names.index(n) for n in src.names["character"]])
        return 1.0 - x, y  # strokes bright on a dark background

    x_train, y_train = tensors(sources["train"])
    x_test, y_test = tensors(sources["test"])
    num_classes = int(y_train.max()) + 1

    def block(cin, cout):
        return [torch.nn.Conv2d(cin, cout, 3, padding=1), torch.nn.BatchNorm2d(cout), torch.nn.ReLU(), torch.nn.MaxPool2d(2)]

    model = torch.nn.Sequential(*block(1, 32), *block(32, 64), *block(64, 128), torch.nn.Flatten(),
                                torch.nn.Linear(128 * 3 * 3, 64))
    loss_func = ProxyAnchorLoss(num_classes, 64, margin=0.1, alpha=32)
    optimizer = torch.optim.Adam([{"params": model.parameters(), "lr": 1e-3},
                                  {"params": loss_func.parameters(), "lr": 1e-2}])
    warp = T.RandomAffine(degrees=14, translate=(0.05, 0.05), scale=(0.9, 1.1))
    epochs = 80 if augment else 20
    for _ in range(epochs):
        model.train()
        for rows in torch.randperm(len(x_train)).split(64):
            images = x_train[rows]
            if augment:
                images = torch.stack([warp(im) for im in images])
            loss = loss_func(model(images), y_train[rows])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.eval()
    with torch.no_grad():
        emb = model(x_test)
    acc = AccuracyCalculator(include=("precision_at_1", "mean_average_precision_at_r"), k="max_bin_count",
                             device=torch.device("cpu")).get_accuracy(emb, y_test)
    return {"map_at_r": acc["mean_average_precision_at_r"], "precision_at_1": acc["precision_at_1"],
            "seconds": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", type=Path, default=DEFAULT_ROOT)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--skip-pml", action="store_true")
    args = ap.parse_args()
    rows: dict[str, list[dict]] = {"dmlkit train (data options only)": [], "PML loop, plain, 20 epochs": [],
                                   "PML loop, affine, 80 epochs": []}
    for seed in args.seeds:  # interleaved, so machine drift hits every row alike
        rows["dmlkit train (data options only)"].append(dmlkit_run(args.root, seed))
        if not args.skip_pml:
            rows["PML loop, plain, 20 epochs"].append(pml_loop(args.root, seed, augment=False))
            rows["PML loop, affine, 80 epochs"].append(pml_loop(args.root, seed, augment=True))
    print(f"{'run':<36}{'MAP@R mean':>11}{'per seed':>26}{'P@1 mean':>10}{'wall s (median, max)':>22}")
    for name, runs in rows.items():
        if not runs:
            continue
        maps = [r["map_at_r"] for r in runs]
        secs = [r["seconds"] for r in runs]
        per_seed = " ".join(f"{m:.3f}" for m in maps)
        p1 = statistics.mean(r["precision_at_1"] for r in runs)
        print(f"{name:<36}{statistics.mean(maps):>11.4f}{per_seed:>26}{p1:>10.4f}"
              f"{statistics.median(secs):>14.1f}, {max(secs):.1f}")


if __name__ == "__main__":
    main()
