"""AdamW's update on the CPU: PyTorch's fused kernel against the foreach one.

``engine.optim.build_optimizer`` gives Adam/AdamW ``fused=True`` wherever every parameter is a
floating-point tensor on CUDA or the CPU. The models trained from scratch on a CPU are small, so the
update is a visible share of their step: this script times ``optimizer.step()`` over the parameters
of ``--members`` glyph ensemble members (small CNN of width 16, 64-D head, Proxy-Anchor proxies of
54 classes), foreach and fused side by side, and prints the medians and the ratio.

    .venv/bin/python benchmarks/bench_optimizer_step.py [--members 3] [--steps 200] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from dmlkit.losses import ProxyAnchorLoss
from dmlkit.models import create_model


def member_parameters(members: int) -> list[nn.Parameter]:
    """The trainable parameters of ``members`` ensemble members and their losses, with random gradients."""
    params = []
    for _ in range(members):
        model = create_model("small_cnn", embedding_size=64, width=16, in_chans=1)
        loss = ProxyAnchorLoss(num_classes=54, embedding_size=64)
        params += [p for module in (model, loss) for p in module.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.randn_like(p)
    return params


def median_step_ms(members: int, steps: int, **options) -> float:
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(member_parameters(members), lr=1e-3, weight_decay=1e-4, **options)
    for _ in range(10):  # the optimiser's state, allocations
        optimizer.step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        optimizer.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--members", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    foreach = median_step_ms(args.members, args.steps, foreach=True)
    fused = median_step_ms(args.members, args.steps, fused=True)
    print(f"AdamW step over {args.members} glyph members' parameters, {args.threads} threads, median of {args.steps}")
    print("| ms per step | foreach | fused (dmlkit on the CPU now) | foreach / fused |")
    print("| --- | --- | --- | --- |")
    print(f"| {args.members} members | {foreach:.3f} | {fused:.3f} | {foreach / fused:.2f}x |")


if __name__ == "__main__":
    main()
