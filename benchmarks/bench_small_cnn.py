"""SmallCNN training-step time: block order, memory layout and bf16, side by side in one run.

Run:  .venv/bin/python benchmarks/bench_small_cnn.py [--repeats 7] [--threads 2]

One optimiser step (forward, backward, AdamW) of a batch of 64 28x28 grey images through three
conv blocks of 32/64/128 channels. "pool last" is the earlier block, conv -> BN -> ReLU -> 2x2 max
pool, in NCHW (what `downsample="max"` built formerly); "dmlkit" is ``SmallCNN(width=32)``
as it is now: conv -> pool -> BN -> ReLU in channels-last layout. Each cell is the median over
``--repeats`` rounds of 10 steps; rounds of all variants are interleaved, so machine drift hits
every column alike. Ratios are against "pool last, fp32".
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from dmlkit.models import SmallCNN


def pool_last_net(width: int = 32) -> nn.Module:
    """The earlier block order, written out: conv-BN-ReLU-maxpool x3, NCHW."""
    layers: list[nn.Module] = []
    channels = 1
    for out in (width, 2 * width, 4 * width):
        layers += [nn.Conv2d(channels, out, 3, padding=1, bias=False), nn.BatchNorm2d(out), nn.ReLU(inplace=True),
                   nn.MaxPool2d(2)]
        channels = out
    return nn.Sequential(*layers)


def step_fn(trunk: nn.Module, bf16: bool):
    head = nn.Linear(trunk(torch.zeros(1, 1, 28, 28)).shape[1], 64)
    model = nn.Sequential(trunk, nn.AdaptiveAvgPool2d(1), nn.Flatten(), head)
    optimizer = torch.optim.AdamW(model.parameters(), 1e-3)
    x = torch.randn(64, 1, 28, 28)

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = model(x)
        loss = out.float().square().sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    return step


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    variants = {
        "pool last, fp32": step_fn(pool_last_net(), bf16=False),
        "pool last, bf16": step_fn(pool_last_net(), bf16=True),
        "dmlkit, fp32": step_fn(SmallCNN(width=32), bf16=False),
        "dmlkit, bf16": step_fn(SmallCNN(width=32), bf16=True),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    for step in variants.values():  # warm-up (oneDNN primitive caches)
        for _ in range(5):
            step()
    for _ in range(args.repeats):
        for name, step in variants.items():
            t0 = time.perf_counter()
            for _ in range(10):
                step()
            times[name].append((time.perf_counter() - t0) / 10 * 1000)
    base = statistics.median(times["pool last, fp32"])
    print(f"{'variant':<18}{'ms/step (median)':>18}{'speed-up':>10}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:<18}{median:>18.2f}{base / median:>9.2f}x")


if __name__ == "__main__":
    main()
