"""Engine overhead: ``Trainer`` vs a minimal hand-written PyTorch loop doing the same steps.

Both sides train the default job (the ``mnist-proxy-anchor`` preset that ``dmlkit train`` runs
with no preset: MNIST-5k, 32-wide small CNN, Proxy-Anchor with margin 0.1 / alpha 32, m-per-class
batches of 64, batched +-2 px translations, AdamW with the proxies at 100x lr, cosine decay) for
``--steps`` steps from the same initial weights on the same batches with the same shifts, so both
must end at the same loss (checked). The engine is timed by its own training clock
(``Trainer.elapsed`` on ``Trainer.clock``: evaluation and checkpoint cadence pushed past the
window, progress bar off, the final test evaluation skipped; its log interval stays the default);
the hand loop by the same clock around its loop (``--clock wall``: ``perf_counter``; ``--clock
cpu``: this process's CPU time, which other jobs on shared cores disturb far less). Repeats are
interleaved with alternating order; the table shows medians of ms per step and of the per-repeat
ratio. ``--interleave`` alternates the two loops step by step inside one run instead (a hand step
runs inside each engine step, after its backward, and is subtracted from the engine's clock), so
load that drifts on shared cores hits both sides alike.

    .venv/bin/python benchmarks/bench_engine.py --steps 40 --repeats 7
    .venv/bin/python benchmarks/bench_engine.py --threads 1 --clock cpu --interleave   # on a busy machine
    .venv/bin/python benchmarks/bench_engine.py --profile   # where the engine's extra time goes
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from pathlib import Path
from typing import Iterator

import torch

from dmlkit.config import load_config
from dmlkit.data.samplers import create_sampler
from dmlkit.data.transforms import RandomTranslate
from dmlkit.engine.model import build_model
from dmlkit.engine.rng_state import seed_everything
from dmlkit.engine.splits import build_splits
from dmlkit.losses import create_loss
from dmlkit.methods.hooks import MethodHooks
from dmlkit.recipe import Trainer

PRESET = "mnist-proxy-anchor"


def bench_config(steps: int, threads: int):
    """The default job with evaluation/checkpoints beyond the measured window and no progress bar."""
    far = steps + 1_000_000
    return load_config(preset=PRESET, overrides=[
        f"train.max_steps={steps}", f"train.eval_every={far}", f"train.checkpoint_every={far}",
        "train.progress=false", f"train.num_threads={threads}",
    ])


def run_engine(steps: int, threads: int, clock, hooks: MethodHooks | None = None) -> tuple[float, float]:
    """``(seconds for steps, last logged loss)`` of ``Trainer.fit`` on the default job."""
    cfg = bench_config(steps, threads)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(cfg, Path(tmp) / "run", echo=lambda _: None, hooks=hooks)
        trainer.clock = clock
        trainer.finish = lambda has_val: None  # the final test evaluation is not a training step
        trainer.fit()
        records = [json.loads(line) for line in (Path(tmp) / "run" / "log.jsonl").read_text().splitlines()]
    logged = [r["loss"] for r in records if r.get("kind") == "train" and r["step"] == steps]
    return trainer.elapsed, float(logged[0]) if logged else float("nan")


def hand_loop(steps: int, threads: int) -> Iterator[float]:
    """The same steps written by hand: the split's batched read over the sampler's batches, the
    seeded batch translation, forward, loss, backward, AdamW, cosine learning rate.

    Set-up happens here (untimed); each ``next()`` of the returned iterator is one step and
    yields its loss."""
    cfg = bench_config(steps, threads)
    torch.set_num_threads(threads)
    seed_everything(cfg.seed)
    model = build_model(cfg)  # same constructor and seed as the Trainer -> same initial weights
    train = build_splits(cfg, model).train  # read afresh per run, as each Trainer does
    assert torch.equal(train.labels.unique(), torch.arange(5))  # MNIST-5k training digits: already 0..4
    loss_fn = create_loss(cfg.loss.name, num_classes=5, embedding_size=cfg.model.embedding_size, **cfg.loss.args)
    o = cfg.optimizer
    optimizer = torch.optim.AdamW(
        [
            {"params": list(model.trunk_parameters()), "lr": o.lr},
            {"params": list(model.head_parameters()), "lr": o.lr},
            {"params": list(loss_fn.parameters()), "lr": o.lr * o.loss_lr_multiplier},
        ],
        lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay,
    )
    base_lrs = [g["lr"] for g in optimizer.param_groups]
    translate = RandomTranslate(cfg.data.max_shift)
    sampler = create_sampler("m_per_class", labels=train.labels, m=cfg.sampler.m,
                             batch_size=cfg.sampler.batch_size, length_before_new_iter=len(train.labels),
                             seed=cfg.seed)

    def batches():
        epoch = 0
        while True:
            for b, indices in enumerate(sampler.batches(epoch).tolist()):
                yield epoch, b + 1, indices
            epoch += 1

    def loop():
        model.train()
        for step, (epoch, batch, indices) in zip(range(steps), batches()):
            images, labels = train.get_batch(indices)
            g = torch.Generator().manual_seed(hash((cfg.seed, epoch, batch)) & (2**62 - 1))  # the engine's seeding
            images = translate(images, g)
            loss = loss_fn(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            factor = 0.5 * (1.0 + math.cos(math.pi * (step + 1) / steps))
            for group, lr in zip(optimizer.param_groups, base_lrs):
                group["lr"] = lr * factor
            yield loss.item()

    return loop()


def run_hand_loop(steps: int, threads: int, clock) -> tuple[float, float]:
    """``(seconds for steps, last loss)`` of :func:`hand_loop`."""
    loop = hand_loop(steps, threads)
    value = float("nan")
    start = clock()
    for value in loop:
        pass
    return clock() - start, value


class Interleaved(MethodHooks):
    """Runs one hand-loop step inside each engine step (after its backward) and times it apart."""

    def __init__(self, loop: Iterator[float], clock):
        self.loop, self.clock, self.seconds, self.value = loop, clock, 0.0, float("nan")

    def after_backward(self, trainer: Trainer) -> None:
        start = self.clock()
        self.value = next(self.loop)
        self.seconds += self.clock() - start


def run_interleaved(steps: int, threads: int, clock) -> tuple[float, float, float, float]:
    """``(engine seconds, hand seconds, engine loss, hand loss)`` with the two loops taking steps in turn.

    Machine load that drifts (other jobs on shared cores) then hits both sides alike, step by
    step; the engine's time is its training clock minus the hand steps run inside it."""
    hooks = Interleaved(hand_loop(steps, threads), clock)
    e_sec, e_loss = run_engine(steps, threads, clock, hooks=hooks)
    return e_sec - hooks.seconds, hooks.seconds, e_loss, hooks.value


def profile_engine(steps: int, threads: int) -> None:
    """cProfile of ``Trainer.fit`` (cumulative time, top entries) to find engine overhead."""
    import cProfile
    import pstats

    cfg = bench_config(steps, threads)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(cfg, Path(tmp) / "run", echo=lambda _: None)
        trainer.finish = lambda has_val: None
        profiler = cProfile.Profile()
        profiler.runcall(trainer.fit)
    stats = pstats.Stats(profiler).sort_stats("cumulative")
    stats.print_stats(r"trainer.py|batches.py|objective.py|clip_grad|lr_scheduler|run_dir|optimizer.py|samplers.py|"
                      r"transforms.py", 30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="steps per run (a multiple of train.log_every=10)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="wall: perf_counter (the issue's measure); cpu: this process's CPU time, steadier when "
                             "other jobs share the cores (use with --threads 1)")
    parser.add_argument("--interleave", action="store_true",
                        help="alternate the two loops step by step inside one run instead of run by run")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    if args.steps % 10:
        parser.error("--steps must be a multiple of 10 (the engine logs the loss every 10 steps)")
    torch.set_num_threads(args.threads)
    if args.profile:
        profile_engine(args.steps, args.threads)
        return
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    run_engine(10, args.threads, clock)  # warm-up: imports, data set load, allocator
    run_hand_loop(10, args.threads, clock)
    engine_ms, hand_ms, ratios = [], [], []
    losses = None
    for repeat in range(args.repeats):
        if args.interleave:
            e_sec, h_sec, e_loss, h_loss = run_interleaved(args.steps, args.threads, clock)
        elif repeat % 2:  # alternate which side runs first, so drifting machine load hits both alike
            h_sec, h_loss = run_hand_loop(args.steps, args.threads, clock)
            e_sec, e_loss = run_engine(args.steps, args.threads, clock)
        else:
            e_sec, e_loss = run_engine(args.steps, args.threads, clock)
            h_sec, h_loss = run_hand_loop(args.steps, args.threads, clock)
        engine_ms.append(1e3 * e_sec / args.steps)
        hand_ms.append(1e3 * h_sec / args.steps)
        ratios.append(e_sec / h_sec)
        losses = (e_loss, h_loss)
    order = "interleaved step by step" if args.interleave else "interleaved repeats (alternating order)"
    print(f"{PRESET}: {args.steps} steps x {args.repeats} {order}, "
          f"{args.threads} threads, {args.clock} clock; ms per step (median)")
    print(f"{'name':<34}{'dmlkit ms':>11}{'reference ms':>14}{'ratio':>8}")
    print(f"{'Trainer vs hand loop (default job)':<34}{statistics.median(engine_ms):>11.2f}"
          f"{statistics.median(hand_ms):>14.2f}{statistics.median(ratios):>8.3f}")
    print(f"per-repeat ratios: {', '.join(f'{r:.3f}' for r in ratios)}")
    same = math.isclose(losses[0], losses[1], rel_tol=1e-5, abs_tol=1e-6)
    print(f"loss after the last step: engine {losses[0]:.6f}, hand loop {losses[1]:.6f} "
          f"({'same' if same else 'DIFFERENT: the two loops do not compute the same steps'})")
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
