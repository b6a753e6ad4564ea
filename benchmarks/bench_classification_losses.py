"""Classification losses (ArcFace, CosFace, ...): dmlkit vs pytorch-metric-learning, forward + backward.

Run: .venv/bin/python benchmarks/bench_classification_losses.py [--repeats 11] [--threads 2] [--skip-large] [--json]

Each case runs in its own subprocess, so its peak memory is that process's: ``peak MB`` is the rise of
the resident set (``ru_maxrss``) above what the process held just before building the loss (torch,
the batch), i.e. the loss's weights, gradients, optimiser state and temporaries. Rows: B=256, D=128,
10,000 classes, median of N forward + backward calls per library, ``ratio`` = PML median / dmlkit
median. Then one training step (forward, backward, Adam) of ArcFace at 100,000 classes x 512
dimensions, both libraries (PML materialises the [B, C] logits and its temporaries), and partial FC
at 1,000,000 classes x 128 (``sample_rate=0.1``), which PML has no form of. ``--json`` adds one
``CATALOGUE_ROWS`` line of the 10,000-class rows for ``benchmarks/run_all.py --summary``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

SMALL = dict(batch=256, dim=128, classes=10_000)
LOSSES = {  # class name (the same in both libraries) -> keyword arguments both take
    "ArcFaceLoss": {},
    "SubCenterArcFaceLoss": dict(sub_centers=3),
    "CosFaceLoss": {},
    "SphereFaceLoss": {},
    "LargeMarginSoftmaxLoss": {},
    "NormalizedSoftmaxLoss": {},
    "P2SGradLoss": {},
}


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def run_case(spec: dict) -> dict:
    """Inside the subprocess: build the loss, time ``repeats`` steps, report median ms and peak MB."""
    import torch

    torch.set_num_threads(spec["threads"])
    if spec["library"] == "dmlkit":
        from dmlkit.engine.allocator import tune_cpu_allocator

        tune_cpu_allocator()
        import dmlkit.losses as lib
    else:
        import pytorch_metric_learning.losses as lib
    g = torch.Generator().manual_seed(0)
    x = torch.randn(spec["batch"], spec["dim"], generator=g, requires_grad=True)
    y = torch.randint(0, spec["classes"], (spec["batch"],), generator=g)
    before = _rss_mb()
    cls = getattr(lib, spec["loss"])
    kwargs = dict(spec.get("kwargs", {}))
    if spec["loss"] == "P2SGradLoss":
        loss = cls(spec["dim"], spec["classes"])
    else:
        loss = cls(num_classes=spec["classes"], embedding_size=spec["dim"], **kwargs)
    optimizer = torch.optim.Adam(loss.parameters(), lr=1e-3) if spec.get("optimizer") else None
    times = []
    for i in range(spec["repeats"] + 1):
        t0 = time.perf_counter()
        x.grad = None
        loss.zero_grad(set_to_none=True)
        loss(x, y).backward()
        if optimizer is not None:
            optimizer.step()
        if i:  # the first call warms up
            times.append((time.perf_counter() - t0) * 1e3)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"ms": statistics.median(times), "peak_mb": peak - before}


def measure(spec: dict, timeout: float) -> dict:
    """Run one case in a fresh interpreter; a failure (memory, timeout) is reported, not raised."""
    try:
        out = subprocess.run([sys.executable, __file__, "--case", json.dumps(spec)], capture_output=True, text=True,
                             timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout {timeout:.0f} s"}
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["killed"])[-1][:60]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def _cell(result: dict, key: str, fmt: str) -> str:
    return format(result[key], fmt) if key in result else result.get("error", "-")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-large", action="store_true", help="only the 10,000-class rows")
    parser.add_argument("--json", action="store_true", help="also print the 10,000-class rows as one CATALOGUE_ROWS json line")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(json.loads(args.case))))
        return
    base = dict(SMALL, repeats=args.repeats, threads=args.threads)
    print(f"B={SMALL['batch']}, D={SMALL['dim']}, C={SMALL['classes']:,}: forward + backward, median of "
          f"{args.repeats}, {args.threads} threads")
    print(f"{'loss':<24}{'dmlkit ms':>11}{'PML ms':>11}{'ratio':>8}{'dmlkit peak MB':>16}{'PML peak MB':>13}")
    rows = []
    for name, kwargs in LOSSES.items():
        ours = measure(dict(base, loss=name, kwargs=kwargs, library="dmlkit"), 600)
        theirs = measure(dict(base, loss=name, kwargs=kwargs, library="pml"), 600)
        ratio = f"{theirs['ms'] / ours['ms']:.2f}" if "ms" in ours and "ms" in theirs else "-"
        print(f"{name:<24}{_cell(ours, 'ms', '.1f'):>11}{_cell(theirs, 'ms', '.1f'):>11}{ratio:>8}"
              f"{_cell(ours, 'peak_mb', '.0f'):>16}{_cell(theirs, 'peak_mb', '.0f'):>13}", flush=True)
        if "ms" in ours and "ms" in theirs:
            rows.append({"name": f"{name} C=10,000", "pml_class": name, "dmlkit_ms": ours["ms"], "pml_ms": theirs["ms"]})
    if args.json:
        print("CATALOGUE_ROWS " + json.dumps(rows))
    if args.skip_large:
        return
    print("\nOne training step (forward, backward, Adam), B=256, median of 3 after one warm-up")
    print(f"{'case':<52}{'dmlkit ms':>11}{'dmlkit peak MB':>16}{'PML ms':>11}{'PML peak MB':>13}")
    large = dict(batch=256, dim=512, classes=100_000, repeats=3, threads=args.threads, optimizer=True,
                 loss="ArcFaceLoss")
    ours = measure(dict(large, library="dmlkit"), 1800)
    theirs = measure(dict(large, library="pml"), 1800)
    print(f"{'ArcFaceLoss 100,000 x 512':<52}{_cell(ours, 'ms', '.0f'):>11}{_cell(ours, 'peak_mb', '.0f'):>16}"
          f"{_cell(theirs, 'ms', '.0f'):>11}{_cell(theirs, 'peak_mb', '.0f'):>13}")
    million = dict(large, dim=128, classes=1_000_000, kwargs=dict(sample_rate=0.1))
    ours = measure(dict(million, library="dmlkit"), 1800)
    print(f"{'ArcFaceLoss 1,000,000 x 128, partial FC sample_rate=0.1':<52}{_cell(ours, 'ms', '.0f'):>11}"
          f"{_cell(ours, 'peak_mb', '.0f'):>16}{'(none)':>11}{'-':>13}")


if __name__ == "__main__":
    main()
