"""Time every dmlkit miner against pytorch-metric-learning's same-named miner on the same batch (B=256, D=128).

Usage: .venv/bin/python benchmarks/bench_miners.py [--repeats 50] [--batch 256] [--dim 128] [--threads 2]
    [--only NAME ...] [--json]

Both libraries are timed in one run, interleaved call by call, and the median of the repeats is
reported with the speed-up PML / dmlkit (> 1 means dmlkit is faster). Each side is called in its
own idiom: dmlkit's miner returns its selection (the masks a loss reads), PML's its index tuple.
``--json`` adds one ``CATALOGUE_ROWS`` line for ``benchmarks/run_all.py --summary``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from pytorch_metric_learning import miners as pml

from dmlkit import mining as dml


def cases():
    """(name, dmlkit miner, PML miner) with matched settings."""
    return [
        ("TripletMarginMiner(semihard)", dml.TripletMarginMiner(0.2, "semihard"), pml.TripletMarginMiner(0.2, "semihard")),
        ("TripletMarginMiner(hard)", dml.TripletMarginMiner(0.2, "hard"), pml.TripletMarginMiner(0.2, "hard")),
        ("TripletMarginMiner(all)", dml.TripletMarginMiner(0.2, "all"), pml.TripletMarginMiner(0.2, "all")),
        ("BatchHardMiner", dml.BatchHardMiner(), pml.BatchHardMiner()),
        ("MultiSimilarityMiner", dml.MultiSimilarityMiner(0.1), pml.MultiSimilarityMiner(0.1)),
        ("PairMarginMiner", dml.PairMarginMiner(0.2, 0.8), pml.PairMarginMiner(0.2, 0.8)),
        ("DistanceWeightedMiner", dml.DistanceWeightedMiner(), pml.DistanceWeightedMiner()),
        ("AngularMiner", dml.AngularMiner(20), pml.AngularMiner(20)),
        ("BatchEasyHardMiner", dml.BatchEasyHardMiner(), pml.BatchEasyHardMiner()),
        ("BatchEasyHardMiner(all,hard)", dml.BatchEasyHardMiner("all", "hard"), pml.BatchEasyHardMiner("all", "hard")),
        ("HDCMiner", dml.HDCMiner(0.5), pml.HDCMiner(0.5)),
        ("UniformHistogramMiner", dml.UniformHistogramMiner(), pml.UniformHistogramMiner()),
        ("EmbeddingsAlreadyPackaged", dml.EmbeddingsAlreadyPackagedAsTriplets(), pml.EmbeddingsAlreadyPackagedAsTriplets()),
    ]


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--samples-per-class", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads for both libraries")
    parser.add_argument("--only", nargs="*", default=None, help="case names (prefixes) to run")
    parser.add_argument("--json", action="store_true", help="also print the rows as one CATALOGUE_ROWS json line")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    x_all = torch.randn(args.batch, args.dim, generator=g)
    labels_all = torch.arange(args.batch) // args.samples_per_class
    print(f"B={args.batch} D={args.dim} classes={labels_all.unique().numel()} repeats={args.repeats} "
          f"threads={torch.get_num_threads()} torch={torch.__version__}")
    print(f"{'miner':<30} {'dmlkit ms':>10} {'PML ms':>10} {'speed-up':>9}")
    rows = []
    for name, ours, theirs in cases():
        if args.only and not any(name.startswith(o) for o in args.only):
            continue
        if name.startswith("EmbeddingsAlreadyPackaged"):  # whole triplets only: the first 3 * (B // 3) rows
            x, labels = x_all[: len(x_all) // 3 * 3], labels_all[: len(x_all) // 3 * 3]
        else:
            x, labels = x_all, labels_all
        for _ in range(3):  # warm-up
            ours(x, labels)
            theirs(x, labels)
        t_ours, t_theirs = [], []
        for _ in range(args.repeats):
            t_ours.append(timed(lambda: ours(x, labels)))
            t_theirs.append(timed(lambda: theirs(x, labels)))
        m_ours, m_theirs = statistics.median(t_ours), statistics.median(t_theirs)
        rows.append({"name": name, "pml_class": type(theirs).__name__, "dmlkit_ms": m_ours, "pml_ms": m_theirs})
        print(f"{name:<30} {m_ours:>10.3f} {m_theirs:>10.3f} {m_theirs / m_ours:>8.2f}x", flush=True)
    if args.json:
        print("CATALOGUE_ROWS " + json.dumps(rows))


if __name__ == "__main__":
    main()
