"""ASAP's per-step overhead over the same proxy loss without it, and k-center at SOP scale.

Run: .venv/bin/python benchmarks/bench_asap.py [--steps 30] [--repeats 5]

Row 1-2: median ms per training step of the engine on the MNIST small CNN with ``proxy_pair``
(contrastive, K=4 proxies per class) with and without ASAP (proximal gradient on every
parameter). Row 3: greedy k-center proxy selection for 11,318 classes, b=7, K=4, D=128 from
cached embeddings (ASAP Alg. 2). Measured side by side, interleaved, in one run.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

COMMON = [
    "loss.name=proxy_pair",
    "loss.args.pair_loss={name: contrastive, args: {pos_margin: 0.0, neg_margin: 0.5}}",
    "loss.args.proxies_per_class=4",
    "protocol.val_fraction=0.2",
    "train.progress=false",
    "train.max_steps=100000",
    "sampler.batch_size=64",
    "sampler.m=16",
]
ASAP = ["asap.enabled=true", "asap.proxies_per_class=4", "asap.pool_size=8"]


def step_times(trainer, steps: int) -> list[float]:
    from dmlkit.engine.batches import iterate_training_batches

    batches = iterate_training_batches(trainer.splits.train, trainer.sampler, trainer.position)
    out = []
    for _ in range(steps):
        idx, images, raw, _pos = next(batches)
        labels = trainer.label_map(raw)
        t0 = time.perf_counter()
        trainer.training_step(images, labels, idx)
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(2)
    from dmlkit.config import load_config
    from dmlkit.recipe import Trainer

    with tempfile.TemporaryDirectory() as tmp:
        plain = Trainer(load_config(overrides=COMMON), f"{tmp}/plain")
        asap = Trainer(load_config(overrides=COMMON + ASAP), f"{tmp}/asap")
        asap.run_dir.prepare(asap.cfg, asap.splits)
        asap.hooks.on_train_start(asap)
        times = {"plain": [], "asap": []}
        step_times(plain, 5)
        step_times(asap, 5)  # warm-up
        for _ in range(args.repeats):
            times["plain"] += step_times(plain, args.steps)
            times["asap"] += step_times(asap, args.steps)

    from dmlkit.proxies.kcenter import greedy_k_center

    pool = torch.nn.functional.normalize(torch.randn(11318, 7, 128), dim=-1)
    existing = torch.nn.functional.normalize(torch.randn(11318, 4, 128), dim=-1)
    kc = []
    for _ in range(max(3, args.repeats)):
        t0 = time.perf_counter()
        greedy_k_center(pool, 4, existing_centers=existing)
        kc.append(time.perf_counter() - t0)

    p, a = statistics.median(times["plain"]) * 1e3, statistics.median(times["asap"]) * 1e3
    print(f"{'case':<52}{'ms (median)':>14}{'ratio':>10}")
    print(f"{'proxy_pair contrastive K=4, plain step':<52}{p:>14.2f}{1.0:>10.3f}")
    print(f"{'proxy_pair contrastive K=4, ASAP step':<52}{a:>14.2f}{a / p:>10.3f}")
    print(f"{'greedy k-center 11,318 classes b=7 K=4 D=128':<52}{statistics.median(kc) * 1e3:>14.1f}{'':>10}")
    print(f"ASAP overhead: {100 * (a / p - 1):+.1f}% (target < 5%); k-center target < 200 ms")


if __name__ == "__main__":
    main()
