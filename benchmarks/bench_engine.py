"""Engine overhead: ``Trainer`` vs a minimal hand-written PyTorch loop doing the same steps.

Both sides train the default config (``dmlkit.config.load_config()``: MNIST-5k, small CNN,
Proxy-Anchor, m-per-class batches of 64, AdamW with the proxies at 100x lr) for ``--steps``
steps from the same initial weights on the same batches. The engine is timed by its own
training clock (``Trainer.elapsed``: evaluation and checkpoint cadence pushed past the window,
progress bar off, the final test evaluation skipped); the hand loop by ``perf_counter`` around
its loop. Repeats are interleaved; the table shows medians of ms per step.

    .venv/bin/python benchmarks/bench_engine.py --steps 60 --repeats 7
    .venv/bin/python benchmarks/bench_engine.py --profile   # where the engine's extra time goes
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from dmlkit.config import load_config
from dmlkit.data.samplers import create_sampler
from dmlkit.engine import builders
from dmlkit.engine.seeding import seed_everything
from dmlkit.engine.trainer import Trainer
from dmlkit.losses import create_loss


def bench_config(steps: int):
    """The default config with evaluation/checkpoints beyond the measured window and no progress bar."""
    far = steps + 1_000_000
    return load_config(overrides=[
        f"train.max_steps={steps}", f"train.eval_every={far}", f"train.checkpoint_every={far}",
        "train.progress=false", "train.num_threads=2",
    ])


def run_engine(steps: int) -> tuple[float, float]:
    """``(seconds for steps, last logged loss)`` of ``Trainer.fit`` on the default config."""
    cfg = bench_config(steps)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(cfg, Path(tmp) / "run", echo=lambda _: None)
        trainer.finish = lambda has_val: None  # the final test evaluation is not a training step
        trainer.fit()
        records = [json.loads(line) for line in (Path(tmp) / "run" / "log.jsonl").read_text().splitlines()]
    logged = [r["loss"] for r in records if r.get("kind") == "train" and r["step"] == steps]
    return trainer.elapsed, float(logged[0]) if logged else float("nan")


def run_hand_loop(steps: int, splits_cache: dict) -> tuple[float, float]:
    """The same steps written by hand: the split's batched read (else a DataLoader) over the sampler's
    batches, forward, loss, backward, AdamW."""
    cfg = bench_config(steps)
    torch.set_num_threads(2)
    seed_everything(cfg.seed)
    model = builders.build_model(cfg)  # same constructor and seed as the Trainer -> same initial weights
    if "splits" not in splits_cache:
        splits_cache["splits"] = builders.build_splits(cfg, model)
    train = splits_cache["splits"].train
    num_classes = int(train.labels.max()) + 1
    loss_fn = create_loss("proxy_anchor", num_classes=num_classes, embedding_size=cfg.model.embedding_size)
    o = cfg.optimizer
    optimizer = torch.optim.AdamW(
        [
            {"params": list(model.trunk_parameters()), "lr": o.lr},
            {"params": list(model.head_parameters()), "lr": o.lr},
            {"params": list(loss_fn.parameters()), "lr": o.lr * o.loss_lr_multiplier},
        ],
        lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay,
    )
    sampler = create_sampler("m_per_class", labels=train.labels, m=cfg.sampler.m,
                             batch_size=cfg.sampler.batch_size, seed=cfg.seed)
    batches = itertools.chain.from_iterable(sampler.batches(e).tolist() for e in itertools.count())
    if hasattr(train, "get_batch"):  # in-memory splits: one batched read, as the engine does
        loader = (train.get_batch(indices) for indices in batches)
    else:
        loader = torch.utils.data.DataLoader(train, batch_sampler=batches)
    model.train()
    start = time.perf_counter()
    for _, (images, labels) in zip(range(steps), loader):
        loss = loss_fn(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        value = loss.item()
    return time.perf_counter() - start, value


def profile_engine(steps: int) -> None:
    """cProfile of ``Trainer.fit`` (cumulative time, top entries) to find engine overhead."""
    import cProfile
    import pstats

    cfg = bench_config(steps)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(cfg, Path(tmp) / "run", echo=lambda _: None)
        trainer.finish = lambda has_val: None
        profiler = cProfile.Profile()
        profiler.runcall(trainer.fit)
    stats = pstats.Stats(profiler).sort_stats("cumulative")
    stats.print_stats(r"trainer.py|builders.py|clip_grad|lr_scheduler|run_dir|optimizer.py|samplers.py", 25)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(2)
    if args.profile:
        profile_engine(args.steps)
        return
    cache: dict = {}
    run_engine(10)  # warm-up: imports, data set load, allocator
    run_hand_loop(10, cache)
    engine_ms, hand_ms, ratios = [], [], []
    losses = None
    for repeat in range(args.repeats):
        if repeat % 2:  # alternate which side runs first, so drifting machine load hits both alike
            h_sec, h_loss = run_hand_loop(args.steps, cache)
            e_sec, e_loss = run_engine(args.steps)
        else:
            e_sec, e_loss = run_engine(args.steps)
            h_sec, h_loss = run_hand_loop(args.steps, cache)
        engine_ms.append(1e3 * e_sec / args.steps)
        hand_ms.append(1e3 * h_sec / args.steps)
        ratios.append(e_sec / h_sec)
        losses = (e_loss, h_loss)
    print(f"{args.steps} steps x {args.repeats} interleaved repeats (alternating order), 2 threads; "
          "ms per step (median)")
    print(f"{'name':<34}{'dmlkit ms':>11}{'reference ms':>14}{'ratio':>8}")
    print(f"{'Trainer vs hand loop (default cfg)':<34}{statistics.median(engine_ms):>11.2f}"
          f"{statistics.median(hand_ms):>14.2f}{statistics.median(ratios):>8.3f}")
    print(f"per-repeat ratios: {', '.join(f'{r:.3f}' for r in ratios)}")
    print(f"loss after the last step: engine {losses[0]:.6f}, hand loop {losses[1]:.6f} (same steps -> same value)")


if __name__ == "__main__":
    main()
