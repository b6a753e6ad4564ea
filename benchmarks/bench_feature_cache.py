"""Building the feature cache: the frozen stages run in chunks on a CPU, against whole batches.

The photo recipe's feature cache (``dmlkit.engine.frozen_stage_cache``) runs the stem and the frozen stages
once per cached view of every training image, before training. On a CPU without native bf16 the
mini-ImageNet development run planned 100 s for 4 views of 2,600 images with EfficientNet-Lite2's
4 frozen stages and spent 266 s: the plan times the stages on 8 images, the build ran them on batches
of 64, whose activations at 224 px (tens of MiB each) come as fresh zero-filled pages at every call.
The build now runs the stages in chunks whose largest activation stays within
``inference_copy.CHUNK_BYTES`` (``inference_copy.chunk_for``).

This script builds the same cache both ways, side by side, on synthetic in-memory photos (random
weights: the speed does not depend on them), and prints per image-view the plan's estimate
(``learning_plan.measure_stage_costs``), the chunked build and the whole-batch build, medians of
``--rounds`` builds, with the ratios.

    .venv/bin/python benchmarks/bench_feature_cache.py [--model efficientnet_lite2] [--images 256] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from dmlkit.data.transforms import batch_augmentation
from dmlkit.engine import frozen_stage_cache as feature_cache
from dmlkit.models import create_model
from dmlkit.recipe.learning_plan import measure_stage_costs


class InMemory:
    """A split held in memory, as the cache reads it (``get_batch``, ``labels``)."""

    def __init__(self, images: torch.Tensor):
        self.images, self.labels = images, torch.arange(len(images)) % 16

    def __len__(self) -> int:
        return len(self.images)

    def get_batch(self, indices) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.as_tensor(indices)
        return self.images[rows], self.labels[rows]


def build_seconds(model, data, augment, views: int, whole_batches: bool) -> float:
    """Seconds of one cache build; ``whole_batches``: the frozen stages on the build's whole batches (before)."""
    original = feature_cache.chunk_for
    if whole_batches:
        feature_cache.chunk_for = lambda *args, **kwargs: feature_cache.BUILD_BATCH
    try:
        cache = feature_cache.FrozenFeatureCache.build(model, data, augment, views=views, seed=0, echo=lambda _: None)
    finally:
        feature_cache.chunk_for = original
    return cache.build_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="efficientnet_lite2")
    parser.add_argument("--frozen-stages", type=int, default=4)
    parser.add_argument("--images", type=int, default=256, help="training images (84 px, as mini-ImageNet's)")
    parser.add_argument("--views", type=int, default=2)
    parser.add_argument("--crop", type=int, default=224)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = create_model(args.model, pretrained=False, embedding_size=128, frozen_stages=args.frozen_stages,
                         freeze_bn=True).train()
    data = InMemory(torch.rand(args.images, 3, 84, 84))
    augment = batch_augmentation("crop", crop_size=args.crop)
    planned = measure_stage_costs(model, [args.frozen_stages], args.crop, device=torch.device("cpu"), dtype=None)[0]
    per_view = args.images * args.views
    chunked, whole = [], []
    for _ in range(args.rounds):  # interleaved, so a change in the machine's speed hits both alike
        chunked.append(build_seconds(model, data, augment, args.views, whole_batches=False) / per_view)
        whole.append(build_seconds(model, data, augment, args.views, whole_batches=True) / per_view)
    c, w = statistics.median(chunked), statistics.median(whole)
    print(f"{args.model}, {args.frozen_stages} frozen stages, {args.images} images x {args.views} views at "
          f"{args.crop} px, {args.threads} threads, median of {args.rounds} builds")
    print("| ms per image-view | plan's estimate | chunked build (now) | whole batches (before) | before / now "
          "| now / estimate |")
    print("| --- | --- | --- | --- | --- | --- |")
    print(f"| {args.model} | {planned.prefix * 1e3:.1f} | {c * 1e3:.1f} | {w * 1e3:.1f} | {w / c:.2f}x | "
          f"{c / planned.prefix:.2f}x |")


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"({time.perf_counter() - start:.0f} s)")
