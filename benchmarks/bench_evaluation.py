"""Leave-one-out P@1, R-Precision and MAP@R: dmlkit (torch / faiss backends) vs PML's AccuracyCalculator.

``calc`` is dmlkit's PML-compatible ``AccuracyCalculator`` (same call as PML's, exact k-NN underneath).

Run:  .venv/bin/python benchmarks/bench_evaluation.py [--repeats 3] [--sizes 60502 200000] [--impls torch faiss calc pml]
      [--allocator tuned|default] [--baseline-src DIR] [--device cpu|cuda]

``--device cuda`` puts the embeddings and labels on the GPU before each implementation is called (dmlkit
then searches and scores there, ``dmlkit.evaluation.knn_device``; PML gets the same CUDA tensors), runs
each implementation once on the first 1,000 rows first (CUDA context, cuBLAS, kernels loaded: not
timed, for every implementation alike), times to the end of the GPU's work and adds the peak GPU memory.
Its defaults are the issue's case: 50,000 x 128 (and 200,000 for dmlkit alone), ``calc torch pml``:
the ``calc`` row's ratio is AccuracyCalculator against PML's on the same card.

``--baseline-src DIR`` adds ``torch@baseline``: the torch backend imported from another checkout's
``src`` (e.g. ``git archive main src | tar -x -C /tmp/base``), interleaved with the others, so a
change is measured before and after in the same run. An archive holds no built C scan
(``_knn_scan.c``): build it there (``cd /tmp/base && ../path/.venv/bin/python ../path/setup.py
build_ext --inplace``, or copy the built ``.so``) or the baseline runs the PyTorch operations.

Data: L2-normalised 128-D embeddings around random class centres, SOP-like class sizes
(2..12 samples, about 5 on average). Each (case, implementation) runs in its own subprocess,
interleaved, so peak RSS is per run; the table shows median wall time over the repeats and the
highest 1-minute load average seen at the start of a run (other processes on the cores slow it).
PML is only run up to --pml-max samples (it needs minutes beyond SOP scale).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, os, resource, sys, time
import torch
torch.set_num_threads(2)
n, impl, allocator, device = int(sys.argv[1]), sys.argv[2], sys.argv[3], torch.device(sys.argv[4])
if allocator == "tuned":  # as the `dmlkit` command line runs; applied to PML's process too
    from dmlkit.engine.allocator import tune_cpu_allocator
    assert tune_cpu_allocator(), "--allocator tuned needs glibc (Linux)"
torch.manual_seed(0)  # the class sizes below draw from the global generator
g = torch.Generator().manual_seed(0)
sizes = (2 + torch.distributions.Geometric(probs=torch.tensor(0.3)).sample((n,))).clamp_max(12).long()
labels = torch.repeat_interleave(torch.arange(n), sizes)[:n]
labels = labels[torch.randperm(n, generator=g)]
centres = torch.randn(int(labels.max()) + 1, 128, generator=g)
x = centres[labels] + 1.3 * torch.randn(n, 128, generator=g)
x = torch.nn.functional.normalize(x, dim=1)
x, labels = x.to(device), labels.to(device)
on_gpu = device.type == "cuda"
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
load = os.getloadavg()[0]  # other processes share the cores: record how busy the machine was
c_scan = None  # for dmlkit's torch backend: whether the C scan (_knn_scan.c) was built
include = ("precision_at_1", "r_precision", "mean_average_precision_at_r")


def evaluate(x, labels):
    global c_scan
    if impl == "pml":
        import faiss
        faiss.omp_set_num_threads(2)
        from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
        r = AccuracyCalculator(include=include, k="max_bin_count", device=device).get_accuracy(x, labels)
    elif impl == "calc":
        from dmlkit.evaluation import AccuracyCalculator
        r = AccuracyCalculator(include=include, k="max_bin_count").get_accuracy(x, labels)
    else:
        from dmlkit.evaluation import retrieval_metrics
        r = retrieval_metrics(x, labels, ks=(1,), backend=impl.split("@")[0])
        r = {"precision_at_1": r["precision_at_1"], "r_precision": r["r_precision"],
             "mean_average_precision_at_r": r["map_at_r"]}
        import importlib
        c_scan = getattr(importlib.import_module("dmlkit.evaluation.knn"), "_knn_scan", None) is not None
    return {"precision_at_1": r["precision_at_1"], "r_precision": r["r_precision"],
            "map_at_r": r["mean_average_precision_at_r"]}


if on_gpu:  # CUDA context, cuBLAS handles, kernels: loaded once, not timed (every implementation alike)
    evaluate(x[:1000], labels[:1000])
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
t0 = time.perf_counter()
out = evaluate(x, labels)
if on_gpu:
    torch.cuda.synchronize(device)
elapsed = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
gpu_peak = torch.cuda.max_memory_allocated(device) / 2**20 if on_gpu else None
print(json.dumps({"c_scan": c_scan, "seconds": elapsed, "peak_rss_mib": peak / 1024, "data_rss_mib": base / 1024,
                  "metrics": out, "load": load, "gpu_peak_mib": gpu_peak}))
"""


def run(n: int, impl: str, allocator: str, baseline_src: str | None = None, device: str = "cpu") -> dict:
    env = dict(os.environ)
    if impl.endswith("@baseline"):
        env["PYTHONPATH"] = os.pathsep.join([baseline_src, env.get("PYTHONPATH", "")])
    res = subprocess.run([sys.executable, "-c", CHILD, str(n), impl, allocator, device], capture_output=True,
                         text=True, check=True, env=env)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu", help="where the embeddings live: cpu (default) or cuda[:N]")
    ap.add_argument("--sizes", type=int, nargs="+", default=None,
                    help="samples (default: 60502 200000; with --device cuda 50000 200000)")
    ap.add_argument("--pml-max", type=int, default=70000)
    ap.add_argument("--impls", nargs="+", default=None, choices=["torch", "faiss", "calc", "pml"],
                    help="default: torch faiss pml; with --device cuda calc torch pml")
    ap.add_argument("--allocator", choices=("tuned", "default"), default="tuned",
                    help="tuned: dmlkit.engine.allocator.tune_cpu_allocator() in every child process (as `dmlkit` "
                    "runs); default: glibc's own settings")
    ap.add_argument("--baseline-src", metavar="DIR", help="also run the torch backend imported from DIR (another src/)")
    args = ap.parse_args()
    on_gpu = args.device.startswith("cuda")
    if args.sizes is None:
        args.sizes = [50000, 200000] if on_gpu else [60502, 200000]
    if args.impls is None:
        args.impls = ["calc", "torch", "pml"] if on_gpu else ["torch", "faiss", "pml"]
    if args.baseline_src:
        args.impls = [*args.impls, "torch@baseline"]
    rows = []
    for n in args.sizes:
        impls = [i for i in args.impls if i != "pml" or n <= args.pml_max]
        runs: dict[str, list[dict]] = {i: [] for i in impls}
        for _ in range(args.repeats if n <= args.pml_max else 1):
            for impl in impls:  # interleaved
                runs[impl].append(run(n, impl, args.allocator, args.baseline_src, args.device))
        ref = statistics.median(r["seconds"] for r in runs["pml"]) if runs.get("pml") else float("nan")
        for impl in impls:
            med = statistics.median(r["seconds"] for r in runs[impl])
            peak = max(r["peak_rss_mib"] for r in runs[impl])
            data = min(r["data_rss_mib"] for r in runs[impl])
            load = max(r["load"] for r in runs[impl])
            note = " (no C scan)" if runs[impl][0].get("c_scan") is False and not on_gpu else ""  # an unbuilt _knn_scan.c
            gpu = max(r["gpu_peak_mib"] for r in runs[impl]) if on_gpu else float("nan")
            rows.append((f"{impl}{note} N={n}", med * 1e3, ref * 1e3, ref / med, peak, data, load, gpu,
                         runs[impl][0]["metrics"]))
    print(f"device: {args.device}" + (f" ({_gpu_name(args.device)})" if on_gpu else ""))
    print(f"{'name':<26}{'ms':>10}{'PML ms':>10}{'speedup':>9}{'peak RSS MiB':>14}{'RSS before':>12}{'load':>6}"
          + (f"{'GPU MiB':>9}" if on_gpu else "") + "  metrics")
    for name, ms, ref_ms, ratio, peak, data, load, gpu, met in rows:
        m = " ".join(f"{k}={v:.6f}" for k, v in met.items())
        print(f"{name:<26}{ms:>10.1f}{ref_ms:>10.1f}{ratio:>9.2f}{peak:>14.0f}{data:>12.0f}{load:>6.1f}"
              + (f"{gpu:>9.0f}" if on_gpu else "") + f"  {m}")


def _gpu_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name(torch.device(device))


if __name__ == "__main__":
    main()
