"""Losses, miners and the AccuracyCalculator against PML on one device (a CUDA card or the CPU), one table.

Run:  python benchmarks/bench_device.py --device cuda --batch-size 256 1024 [--repeats 25] [--json-out FILE]
      python benchmarks/bench_device.py --device cpu --quick          # a smoke run of every row (seconds)

The card's setting: forward + backward of each loss at ``--batch-size`` (4 samples per class), D = 512,
1,000 classes for the proxy and classification losses; the miner call for miners (D = 128); the
AccuracyCalculator's P@1, R-Precision and MAP@R on ``--eval-size`` x 128 embeddings already on the device
(around 10,000 class centres, leave-one-out). Both libraries get the same inputs on the device (labels
too), their calls are interleaved (dmlkit, PML, dmlkit, ...) after ``--warmup`` calls each, and a cell is
the median of ``--repeats`` calls, each timed from one ``torch.cuda.synchronize()`` to the next on a
card (``perf_counter`` alone on the CPU). The ratio is PML / dmlkit (> 1: dmlkit faster). A row that
raises is reported as an error and the others go on. ``--json-out`` writes every row and the summary
(median ratio, the rows slower than PML) for ``scripts/gpu_check.sh``; ``--quick`` shrinks every size.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from pytorch_metric_learning import losses as pml
from pytorch_metric_learning import miners as pml_miners
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator as PMLAccuracyCalculator

import dmlkit.losses as dml
import dmlkit.mining as dml_miners
from dmlkit.evaluation import AccuracyCalculator

PER_CLASS = 4

#: ``(name, dmlkit factory, PML factory)`` of a loss; a factory takes ``(num_classes, dim)``.
LOSSES: list[tuple[str, Callable, Callable]] = [
    ("NormalizedSoftmaxLoss", lambda c, d: dml.NormalizedSoftmaxLoss(c, d), lambda c, d: pml.NormalizedSoftmaxLoss(c, d)),
    ("SubCenterArcFaceLoss", lambda c, d: dml.SubCenterArcFaceLoss(num_classes=c, embedding_size=d),
     lambda c, d: pml.SubCenterArcFaceLoss(num_classes=c, embedding_size=d)),
    ("ArcFaceLoss", lambda c, d: dml.ArcFaceLoss(c, d), lambda c, d: pml.ArcFaceLoss(c, d)),
    ("CosFaceLoss", lambda c, d: dml.CosFaceLoss(c, d), lambda c, d: pml.CosFaceLoss(c, d)),
    ("SoftTripleLoss", lambda c, d: dml.SoftTripleLoss(c, d), lambda c, d: pml.SoftTripleLoss(c, d)),
    ("ProxyAnchorLoss", lambda c, d: dml.ProxyAnchorLoss(c, d), lambda c, d: pml.ProxyAnchorLoss(c, d)),
    ("ProxyNCALoss", lambda c, d: dml.ProxyNCALoss(c, d), lambda c, d: pml.ProxyNCALoss(c, d)),
    ("TripletMarginLoss", lambda c, d: dml.TripletMarginLoss(), lambda c, d: pml.TripletMarginLoss()),
    ("LiftedStructureLoss", lambda c, d: dml.LiftedStructureLoss(), lambda c, d: pml.LiftedStructureLoss()),
    ("GeneralizedLiftedStructureLoss", lambda c, d: dml.GeneralizedLiftedStructureLoss(),
     lambda c, d: pml.GeneralizedLiftedStructureLoss()),
    ("ContrastiveLoss", lambda c, d: dml.ContrastiveLoss(), lambda c, d: pml.ContrastiveLoss()),
    ("MultiSimilarityLoss", lambda c, d: dml.MultiSimilarityLoss(), lambda c, d: pml.MultiSimilarityLoss()),
    ("CircleLoss", lambda c, d: dml.CircleLoss(), lambda c, d: pml.CircleLoss()),
    ("NTXentLoss", lambda c, d: dml.NTXentLoss(), lambda c, d: pml.NTXentLoss()),
    ("SupConLoss", lambda c, d: dml.SupConLoss(), lambda c, d: pml.SupConLoss()),
    ("NPairsLoss", lambda c, d: dml.NPairsLoss(), lambda c, d: pml.NPairsLoss()),
]

#: ``(name, dmlkit factory, PML factory)`` of a miner.
MINERS: list[tuple[str, Callable, Callable]] = [
    ("BatchHardMiner", lambda: dml_miners.BatchHardMiner(), lambda: pml_miners.BatchHardMiner()),
    ("MultiSimilarityMiner", lambda: dml_miners.MultiSimilarityMiner(0.1), lambda: pml_miners.MultiSimilarityMiner(0.1)),
    ("TripletMarginMiner(semihard)", lambda: dml_miners.TripletMarginMiner(0.2, "semihard"),
     lambda: pml_miners.TripletMarginMiner(0.2, "semihard")),
    ("PairMarginMiner", lambda: dml_miners.PairMarginMiner(0.2, 0.8), lambda: pml_miners.PairMarginMiner(0.2, 0.8)),
    ("BatchEasyHardMiner", lambda: dml_miners.BatchEasyHardMiner(), lambda: pml_miners.BatchEasyHardMiner()),
]

EVAL_METRICS = ("precision_at_1", "r_precision", "mean_average_precision_at_r")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def interleaved_medians(ours: Callable[[], object], theirs: Callable[[], object], device: torch.device,
                        warmup: int, repeats: int) -> tuple[float, float]:
    """Median milliseconds of ``ours`` and ``theirs``, called alternately, each call fenced by a synchronize."""
    for _ in range(warmup):
        ours(), theirs()
    times: dict[int, list[float]] = {0: [], 1: []}
    for _ in range(repeats):
        for side, fn in enumerate((ours, theirs)):
            synchronize(device)
            start = time.perf_counter()
            fn()
            synchronize(device)
            times[side].append((time.perf_counter() - start) * 1e3)
    return statistics.median(times[0]), statistics.median(times[1])


def labelled_batch(batch: int, dim: int, num_classes: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``[batch, dim]`` embeddings and labels of ``batch / 4`` classes drawn from ``num_classes``, 4 samples each."""
    g = torch.Generator().manual_seed(batch)
    classes = torch.randperm(num_classes, generator=g)[: max(batch // PER_CLASS, 1)] if num_classes >= batch // PER_CLASS \
        else torch.arange(batch // PER_CLASS) % num_classes
    labels = classes.repeat_interleave(PER_CLASS)[:batch]
    return torch.randn(len(labels), dim, generator=g).to(device), labels.to(device)


def forward_backward(loss: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> Callable[[], None]:
    def run() -> None:
        loss(x.detach().requires_grad_(True), y).backward()

    return run


def loss_rows(batch: int, dim: int, num_classes: int, device: torch.device, warmup: int, repeats: int,
              only: list[str] | None) -> list[dict]:
    x, y = labelled_batch(batch, dim, num_classes, device)
    rows = []
    for name, ours, theirs in LOSSES:
        if only and not any(name.startswith(o) for o in only):
            continue
        rows.append(_row("loss", name, batch, lambda o=ours, t=theirs: (
            forward_backward(o(num_classes, dim).to(device), x, y), forward_backward(t(num_classes, dim).to(device), x, y)),
            device, warmup, repeats))
    return rows


def miner_rows(batch: int, device: torch.device, warmup: int, repeats: int, only: list[str] | None) -> list[dict]:
    x, y = labelled_batch(batch, 128, batch, device)
    x = torch.nn.functional.normalize(x, dim=1)
    rows = []
    for name, ours, theirs in MINERS:
        if only and not any(name.startswith(o) for o in only):
            continue
        rows.append(_row("miner", name, batch, lambda o=ours, t=theirs: (
            lambda m=o(): m(x, y), lambda m=t(): m(x, y)), device, warmup, repeats))
    return rows


def accuracy_row(size: int, device: torch.device, repeats: int) -> dict:
    """Leave-one-out P@1, R-Precision and MAP@R of ``size`` x 128 unit embeddings on ``device``."""
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, max(size // 5, 2), (size,), generator=g)
    centres = torch.randn(int(labels.max()) + 1, 128, generator=g)
    x = torch.nn.functional.normalize(centres[labels] + 0.7 * torch.randn(size, 128, generator=g), dim=1).to(device)
    labels = labels.to(device)

    def call(cls):
        calc = cls(include=EVAL_METRICS, k="max_bin_count")
        return lambda: calc.get_accuracy(x, labels)

    return _row("evaluation", f"AccuracyCalculator {size:,} x 128", size,
                lambda: (call(AccuracyCalculator), call(PMLAccuracyCalculator)), device, 1, repeats)


def _row(kind: str, name: str, batch: int, make: Callable, device: torch.device, warmup: int, repeats: int) -> dict:
    row = {"kind": kind, "name": name, "batch": batch, "device": str(device)}
    try:
        ours, theirs = make()
        row["dmlkit_ms"], row["pml_ms"] = interleaved_medians(ours, theirs, device, warmup, repeats)
        row["ratio"] = row["pml_ms"] / row["dmlkit_ms"]
    except Exception as err:  # noqa: BLE001 - one failing row is reported, the others still run
        row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}"
    cells = (f"{row['dmlkit_ms']:.3f} | {row['pml_ms']:.3f} | {row['ratio']:.2f}x" if "error" not in row
             else f"- | - | error: {row['error']}")
    print(f"| {kind} | {name} | {batch} | {cells} |", flush=True)
    return row


def summarise(rows: list[dict]) -> dict:
    """Median ratio of the loss and miner rows, the rows below 1.0x, the errors, the evaluation ratio."""
    timed = [r for r in rows if "ratio" in r and r["kind"] != "evaluation"]
    ratios = [r["ratio"] for r in timed]
    evaluation = [r for r in rows if r["kind"] == "evaluation" and "ratio" in r]
    return {
        "median_ratio": statistics.median(ratios) if ratios else None,
        "slower_than_pml": [f"{r['name']} (B={r['batch']}) {r['ratio']:.2f}x" for r in timed if r["ratio"] < 1.0],
        "errors": [f"{r['name']} (B={r['batch']}): {r['error']}" for r in rows if "error" in r],
        "evaluation_ratio": evaluation[0]["ratio"] if evaluation else None,
        "rows": len(rows),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch-size", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--dim", type=int, default=512, help="loss rows' embedding size")
    parser.add_argument("--num-classes", type=int, default=1000, help="classes of the proxy and classification losses")
    parser.add_argument("--eval-size", type=int, default=50_000, help="AccuracyCalculator rows (0: no evaluation row)")
    parser.add_argument("--repeats", type=int, default=25)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--only", nargs="*", default=None, help="row names (prefixes) to run")
    parser.add_argument("--quick", action="store_true", help="tiny sizes and 3 repeats: checks that every row runs")
    parser.add_argument("--json-out", type=Path, help="write the rows and the summary as JSON")
    args = parser.parse_args(argv)
    if args.quick:
        args.batch_size, args.dim, args.num_classes, args.eval_size, args.repeats, args.warmup = [32], 32, 50, 600, 3, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    torch.manual_seed(0)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"{name}; torch {torch.__version__}; D={args.dim}, {args.num_classes} classes; median of {args.repeats}\n")
    print("| kind | row | B | dmlkit ms | PML ms | PML / dmlkit |\n| --- | --- | --- | --- | --- | --- |")
    rows = []
    for batch in args.batch_size:
        rows += loss_rows(batch, args.dim, args.num_classes, device, args.warmup, args.repeats, args.only)
        rows += miner_rows(batch, device, args.warmup, args.repeats, args.only)
    if args.eval_size and not args.only:
        rows.append(accuracy_row(args.eval_size, device, max(3, args.repeats // 8)))
    summary = summarise(rows)
    median = f"{summary['median_ratio']:.2f}x" if summary["median_ratio"] is not None else "n/a"
    print(f"\nmedian PML / dmlkit over the loss and miner rows: {median}; "
          f"slower than PML: {', '.join(summary['slower_than_pml']) or 'none'}; errors: {len(summary['errors'])}")
    if args.json_out:
        args.json_out.write_text(json.dumps({"device": name, "summary": summary, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
