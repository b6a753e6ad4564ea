"""What a loss or miner call costs a launch-bound card, measured on the CPU: operators, host syncs, host time.

Run:  python benchmarks/bench_launches.py                      # the card benchmark's rows, B=32, D=16, 100 classes, 1 thread
      python benchmarks/bench_launches.py --only ProxyAnchor ArcFace --repeats 400 [--json-out FILE]

On a card where one call takes 1.5-4 ms the arithmetic is negligible: a call costs one kernel launch per
ATen operator plus PyTorch's dispatch, the Python around them, and every host synchronisation (a value read
by Python or an output sized by the data), which drains the queue. All three are visible on the CPU:

* ``ops``: ATen operators dispatched by one forward + backward (a ``TorchDispatchMode`` sees each one,
  the backward's included); views and metadata calls count too, as they cost dispatch on any device;
* ``syncs``: host synchronisations of the same call, counted by ``tests/unit/losses/_host_syncs.py`` with
  every tensor treated as device memory (``dmlkit.core.validation.reads_on_host`` answers False, the branch a
  card takes);
* ``ms``: CPU wall time per call at tiny sizes (``--batch-size`` 32, ``--dim`` 16, ``--num-classes`` 100,
  one thread), where host overhead is what is timed; dmlkit and PML alternate, medians of ``--repeats``;
  dmlkit runs the card's branch here too (label checks queued as assertions, not read).

The rows are those of ``bench_device.py`` (the card's benchmark), with the same factories and batches.
Ratios are PML / dmlkit (> 1: dmlkit dispatches fewer operators, syncs less, or is faster).
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from bench_device import LOSSES, MINERS, labelled_batch

import dmlkit.core.validation as validation

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "unit" / "losses"))
from _host_syncs import OperatorCounter, count_host_syncs  # noqa: E402 - the test suite's counters


@contextmanager
def as_on_an_accelerator() -> Iterator[None]:
    """Inside the block checks of data take the branch a card takes (``reads_on_host`` answers False)."""
    reads_on_host = validation.reads_on_host
    validation.reads_on_host = lambda tensor: False
    try:
        yield
    finally:
        validation.reads_on_host = reads_on_host


def census(call: Callable[[], object]) -> tuple[collections.Counter, collections.Counter]:
    """Operators and host syncs of one ``call``."""
    with count_host_syncs() as syncs, OperatorCounter() as ops:
        call()
    return ops.counts, collections.Counter(syncs)


def interleaved_medians(ours: Callable[[], object], theirs: Callable[[], object], warmup: int,
                        repeats: int) -> tuple[float, float]:
    """Median milliseconds of ``ours`` and ``theirs``, called alternately after ``warmup`` calls each."""
    for _ in range(warmup):
        ours(), theirs()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for side, fn in enumerate((ours, theirs)):
            start = time.perf_counter()
            fn()
            times[side].append((time.perf_counter() - start) * 1e3)
    return statistics.median(times[0]), statistics.median(times[1])


def calls(batch: int, dim: int, num_classes: int, only: list[str] | None) -> list[tuple[str, str, Callable, Callable]]:
    """``(kind, name, dmlkit call, PML call)`` of every selected row."""
    x, y = labelled_batch(batch, dim, num_classes, torch.device("cpu"))
    xm, ym = labelled_batch(batch, dim, batch, torch.device("cpu"))
    xm = torch.nn.functional.normalize(xm, dim=1)

    def step(loss: torch.nn.Module) -> Callable[[], None]:
        return lambda: loss(x.detach().requires_grad_(True), y).backward()

    def mine(miner: Callable) -> Callable[[], object]:
        return lambda: miner(xm, ym)

    rows = [("loss", name, step(ours(num_classes, dim)), step(theirs(num_classes, dim))) for name, ours, theirs in LOSSES]
    rows += [("miner", name, mine(ours()), mine(theirs())) for name, ours, theirs in MINERS]
    return [r for r in rows if not only or any(r[1].startswith(o) for o in only)]


def measure(kind: str, name: str, ours: Callable, theirs: Callable, warmup: int, repeats: int) -> dict:
    row: dict = {"kind": kind, "name": name}
    ours(), theirs()  # lazy buffers, first-call caches
    for side, fn in (("dmlkit", ours), ("pml", theirs)):
        ops, syncs = census(fn)
        row[f"{side}_ops"], row[f"{side}_syncs"] = sum(ops.values()), sum(syncs.values())
        row[f"{side}_top_ops"] = dict(ops.most_common(8))
        row[f"{side}_sync_ops"] = dict(syncs)
    row["dmlkit_ms"], row["pml_ms"] = interleaved_medians(ours, theirs, warmup, repeats)
    row["ops_ratio"] = row["pml_ops"] / row["dmlkit_ops"]
    row["ms_ratio"] = row["pml_ms"] / row["dmlkit_ms"]
    print(f"| {kind} | {name} | {row['dmlkit_ops']} | {row['pml_ops']} | {row['ops_ratio']:.2f}x "
          f"| {row['dmlkit_syncs']} | {row['pml_syncs']} "
          f"| {row['dmlkit_ms']:.3f} | {row['pml_ms']:.3f} | {row['ms_ratio']:.2f}x |", flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--num-classes", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--only", nargs="*", default=None, help="row names (prefixes) to run")
    parser.add_argument("--verbose", action="store_true", help="print each row's most frequent operators")
    parser.add_argument("--json-out", type=Path, help="write the rows and the medians as JSON")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"CPU, {torch.get_num_threads()} thread(s); torch {torch.__version__}; B={args.batch_size}, D={args.dim}, "
          f"{args.num_classes} classes; forward + backward (losses), one call (miners); median of {args.repeats}\n")
    print("| kind | row | ops dmlkit | ops PML | ops PML / dmlkit | syncs dmlkit | syncs PML "
          "| ms dmlkit | ms PML | ms PML / dmlkit |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    rows = []
    for kind, name, ours, theirs in calls(args.batch_size, args.dim, args.num_classes, args.only):
        with as_on_an_accelerator():
            rows.append(measure(kind, name, ours, theirs, args.warmup, args.repeats))
        if args.verbose:
            print(f"    dmlkit {rows[-1]['dmlkit_top_ops']} {rows[-1]['dmlkit_sync_ops']}\n"
                  f"    PML    {rows[-1]['pml_top_ops']} {rows[-1]['pml_sync_ops']}")
    summary = {key: statistics.median(r[key] for r in rows) for key in ("ops_ratio", "ms_ratio")}
    summary["fewer_ops_than_pml"] = sum(r["dmlkit_ops"] <= r["pml_ops"] for r in rows)
    summary["slower_than_pml"] = [f"{r['name']} {r['ms_ratio']:.2f}x" for r in rows if r["ms_ratio"] < 1.0]
    print(f"\nmedian ops PML / dmlkit {summary['ops_ratio']:.2f}x; median ms PML / dmlkit {summary['ms_ratio']:.2f}x; "
          f"at most PML's operators: {summary['fewer_ops_than_pml']} of {len(rows)}; "
          f"slower than PML: {', '.join(summary['slower_than_pml']) or 'none'}")
    if args.json_out:
        args.json_out.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
