"""Latency of embedding one query image: the inference copy made at every call against made once.

Run:  .venv/bin/python benchmarks/bench_query_latency.py [--rounds 7] [--size 288] [--threads 2]

The model is the photo recipe's: EfficientNet-Lite0 with the offline ImageNet weights, GeM pooling,
a 1,280-D head, mirror averaging, bf16 autocast where the CPU has it. "copy every call" is
``embed_dataset(model, one_image)`` (the inference copy with its fp32 checks is made inside the call,
as the embedding of a split does); "copy kept" is ``embed_dataset(inference_copy(model, ...), ...)``,
what :class:`dmlkit.inference.RunEmbedder` does from its second call on (``dmlkit index query``,
``search``). Rounds interleave the two; the table shows medians.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--size", type=int, default=288, help="query image side (the photo recipe embeds at 288 px)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from dmlkit.core.cpu_ops import cpu_bf16_native
    from dmlkit.evaluation.embed import embed_dataset
    from dmlkit.models import create_model
    from dmlkit.models.inference_copy import inference_copy

    dtype = torch.bfloat16 if cpu_bf16_native() else None
    model = create_model("efficientnet_lite0", pretrained=True, embedding_size=1280, pooling="gem",
                         flip_average=True).eval()
    image = torch.rand(1, 3, args.size, args.size)
    query = torch.utils.data.TensorDataset(image, torch.zeros(1))
    kept = inference_copy(model, image, dtype)
    sides = {"copy every call": model, "copy kept": kept}
    times: dict[str, list[float]] = {name: [] for name in sides}
    for name, runner in sides.items():  # warm-up: oneDNN primitives
        embed_dataset(runner, query, 64, 0, dtype)
    for r in range(args.rounds):
        for name in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
            t0 = time.perf_counter()
            embed_dataset(sides[name], query, 64, 0, dtype)
            times[name].append(time.perf_counter() - t0)
    every, once = (statistics.median(times[name]) * 1e3 for name in sides)
    print(f"one {args.size}-px query, efficientnet_lite0, {args.threads} threads, autocast {dtype}, "
          f"medians of {args.rounds} rounds")
    print("| work | copy every call ms | copy kept ms | ratio |")
    print("| --- | --- | --- | --- |")
    print(f"| embed one query image | {every:.1f} | {once:.1f} | {every / once:.1f}x |")


if __name__ == "__main__":
    main()
