"""Data-pipeline timings: samplers vs PML, image loading vs torchvision ImageFolder, vs a training step.

Run:  .venv/bin/python benchmarks/bench_data_loading.py [--repeats 5] [--images 256]
Prints one table (name, dmlkit ms, reference ms, ratio) plus images/s of loading and of a
training step (ResNet-18, random init, CPU) so one can see whether loading is the bottleneck.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _interleaved(ours, reference, repeats: int) -> tuple[float, float]:
    a, b = [], []
    for _ in range(repeats):
        a.append(_median_ms(ours, 1))
        b.append(_median_ms(reference, 1) if reference else float("nan"))
    return statistics.median(a), statistics.median(b)


def _write_folder(root: Path, num_images: int, num_classes: int) -> None:
    rng = np.random.default_rng(0)
    for i in range(num_images):
        folder = root / f"class{i % num_classes:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, size=(333, 500, 3), dtype=np.uint8)  # CUB-like photo size
        Image.fromarray(pixels).save(folder / f"{i:05d}.jpg", quality=90)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(2)

    from pytorch_metric_learning.samplers import MPerClassSampler as PMLSampler
    from torchvision.datasets import ImageFolder

    from dmlkit.data import ImageFileDataset, MPerClassSampler
    from dmlkit.data.transforms import train_transform

    rows = []
    for name, num_classes, per_class in (("CUB-size", 100, 59), ("SOP-size", 11318, 5)):
        labels = torch.arange(num_classes).repeat_interleave(per_class)
        ours = MPerClassSampler(labels, 4, 32, seed=0)
        ref = PMLSampler(labels.numpy(), m=4, batch_size=32, length_before_new_iter=len(labels))
        timings = _interleaved(lambda: list(ours), lambda: list(ref), args.repeats)
        rows.append((f"m_per_class epoch ({name}, {len(labels)} idx)", *timings))

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "folder"
        _write_folder(root, args.images, 16)
        transform = train_transform("musgrave", {"mean": [0.5] * 3, "std": [0.25] * 3, "input_size": (3, 227, 227)})
        ref_ds = ImageFolder(str(root), transform=transform)
        ours_ds = ImageFileDataset(
            [p for p, _ in ref_ds.samples], torch.tensor([c for _, c in ref_ds.samples]), ref_ds.classes,
            transform, augmentation_seed=0,  # per-item seeded augmentation, as build_splits sets it
        )
        n_ours = len(ours_ds)

        def load(ds, n):
            def run():
                loader = DataLoader(ds, batch_size=32, num_workers=args.workers, shuffle=False)
                for _ in loader:
                    pass
            return run

        ours_ms, ref_ms = _interleaved(load(ours_ds, n_ours), load(ref_ds, len(ref_ds)), args.repeats)
        rows.append((f"load+augment {n_ours} jpgs, {args.workers} workers (vs ImageFolder)", ours_ms, ref_ms))
        single_ms, single_ref = _interleaved(lambda: ours_ds[0], lambda: ref_ds[0], args.repeats * 4)
        rows.append(("decode+augment one image, main process", single_ms, single_ref))

    import timm

    model = timm.create_model("resnet18", pretrained=False, num_classes=128)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = torch.randn(32, 3, 227, 227)

    def step():
        optimizer.zero_grad()
        model(batch).pow(2).mean().backward()
        optimizer.step()

    step_ms = _median_ms(step, max(2, args.repeats // 2))
    rows.append(("training step resnet18, batch 32 @227 (no reference)", step_ms, float("nan")))

    print(f"{'name':<70} {'dmlkit ms':>10} {'reference ms':>13} {'ratio':>7}")
    for name, a, b in rows:
        ratio = a / b if b == b else float("nan")
        print(f"{name:<70} {a:>10.1f} {b:>13.1f} {ratio:>7.2f}")
    per_image_load = ours_ms / n_ours
    print(f"\nloading: {1e3 / per_image_load:.0f} images/s; training step: {32e3 / step_ms:.0f} images/s")


if __name__ == "__main__":
    main()
