"""Forward+backward time of dmlkit's pair losses against pytorch-metric-learning (same run).

    .venv/bin/python benchmarks/bench_pair_losses.py [--repeats 15] [--threads 2] [--clock wall|cpu] [--only NAME ...]
        [--batch 128]
        [--allocator tuned|default] [--json]

B=128 (``--batch``), D=128, 4 samples per class, 2 threads; plus cross-batch memory with a full
44,800-entry memory at B=32 with the contrastive loss. Calls are interleaved (dmlkit, PML,
dmlkit, ...) and the median of ``--repeats`` timed calls is reported after warm-up.
``--json`` adds one ``CATALOGUE_ROWS`` line for ``benchmarks/run_all.py --summary``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from pytorch_metric_learning import losses as pml

import dmlkit.losses.pair as dml
from dmlkit.engine.allocator import tune_cpu_allocator
from dmlkit.memory import CrossBatchMemory


def timed(fn, clock=time.perf_counter) -> float:
    start = clock()
    fn()
    return (clock() - start) * 1e3


def forward_backward(loss, x, y):
    def run():
        e = x.detach().requires_grad_(True)
        loss(e, y).backward()

    return run


def batch(n, d, per_class, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    y = (torch.arange(n) // per_class)[torch.randperm(n, generator=g)]
    return x, y


def full_memories(size, dim, classes, seed=0):
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(size, dim, generator=g)
    lab = torch.randint(0, classes, (size,), generator=g)
    ours = CrossBatchMemory(dml.ContrastiveLoss(), dim, memory_size=size)
    ours.embedding_memory.copy_(emb)
    ours.label_memory.copy_(lab)
    ours.num_filled.fill_(size)
    ref = pml.CrossBatchMemory(pml.ContrastiveLoss(), dim, memory_size=size)
    ref.embedding_memory.copy_(emb)
    ref.label_memory.copy_(lab)
    ref.has_been_filled = True
    return ours, ref


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--clock", choices=("wall", "cpu"), default="wall",
        help="cpu: process CPU time, steadier on a shared machine (with --threads 1)",
    )
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these rows (e.g. xbm_contrastive_44800_b32)")
    parser.add_argument(
        "--allocator", choices=("tuned", "default"), default="tuned",
        help="tuned: dmlkit.engine.allocator.tune_cpu_allocator() for the whole process, as `dmlkit` runs "
        "(applies to both libraries); default: glibc's own settings",
    )
    parser.add_argument("--batch", type=int, default=128, help="batch size of the pair-loss rows (4 samples per class)")
    parser.add_argument("--json", action="store_true", help="also print the rows as one CATALOGUE_ROWS json line")
    args = parser.parse_args()
    if args.allocator == "tuned" and not tune_cpu_allocator():
        parser.error("--allocator tuned needs glibc (Linux)")
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    torch.set_num_threads(args.threads)

    x, y = batch(args.batch, 128, 4, seed=0)
    cases = [
        ("contrastive", dml.ContrastiveLoss(), pml.ContrastiveLoss(), x, y),
        ("triplet_margin", dml.TripletMarginLoss(), pml.TripletMarginLoss(), x, y),
        ("margin", dml.MarginLoss(), pml.MarginLoss(), x, y),
        ("multi_similarity", dml.MultiSimilarityLoss(), pml.MultiSimilarityLoss(), x, y),
        ("lifted_structure", dml.LiftedStructureLoss(), pml.LiftedStructureLoss(), x, y),
        ("generalized_lifted_structure", dml.GeneralizedLiftedStructureLoss(), pml.GeneralizedLiftedStructureLoss(), x, y),
        ("npairs", dml.NPairsLoss(), pml.NPairsLoss(), x, y),
    ]
    xbm_x, xbm_y = batch(32, 128, 4, seed=1)
    ours_xbm, ref_xbm = full_memories(44_800, 128, 11_318)
    cases.append(("xbm_contrastive_44800_b32", ours_xbm, ref_xbm, xbm_x, xbm_y))

    if args.only:
        unknown = sorted(set(args.only) - {case[0] for case in cases})
        if unknown:
            parser.error(f"unknown rows {unknown}; choose from {[case[0] for case in cases]}")
        cases = [case for case in cases if case[0] in args.only]
    rows = []
    for name, ours, ref, xs, ys in cases:
        run_ours, run_ref = forward_backward(ours, xs, ys), forward_backward(ref, xs, ys)
        for _ in range(args.warmup):
            run_ours(), run_ref()
        t_ours, t_ref = [], []
        for _ in range(args.repeats):
            t_ours.append(timed(run_ours, clock))
            t_ref.append(timed(run_ref, clock))
        rows.append((name, statistics.median(t_ours), statistics.median(t_ref), type(ref).__name__))

    print(f"{'loss (forward+backward)':<30} {'dmlkit ms':>10} {'PML ms':>10} {'speed-up':>9}")
    for name, a, b, _ in rows:
        print(f"{name:<30} {a:>10.2f} {b:>10.2f} {b / a:>8.1f}x")
    if args.json:
        print("CATALOGUE_ROWS " + json.dumps([{"name": n, "pml_class": c, "dmlkit_ms": a, "pml_ms": b} for n, a, b, c in rows]))


if __name__ == "__main__":
    main()
