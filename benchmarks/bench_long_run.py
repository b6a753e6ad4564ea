"""Long and large runs: evaluation memory on N x 128 embeddings and RSS over a long training run.

Evaluation: ``dmlkit.evaluation.retrieval_metrics`` and, as the reference, PML's
``AccuracyCalculator`` (faiss k-NN) on the same leave-one-out embeddings, each in its own
subprocess (so peak RSS is its own), alternated, median of ``--repeats``. Prints one table: name,
dmlkit ms, reference ms, ratio, and the peak extra memory of each next to dmlkit's documented bound
(docs/reliability.md). Training: RSS after a warm-up and after ``--steps`` steps of a tiny run.

    .venv/bin/python benchmarks/bench_long_run.py                  # N = 200,000 (slow on 2 cores)
    .venv/bin/python benchmarks/bench_long_run.py --sizes 20000 --steps 3000
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile

MiB = 2**20

EVAL = r"""
import json, sys, time, torch
from pathlib import Path

def status(key):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

which, n, d, per_class = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(2)
g = torch.Generator().manual_seed(0)
labels = torch.arange(n, dtype=torch.int64) // per_class
centers = torch.randn(n // per_class + 1, d, generator=g)
emb = torch.nn.functional.normalize(centers[labels] + 0.7 * torch.randn(n, d, generator=g), dim=1)
if which == "dmlkit":
    from dmlkit.evaluation import retrieval_metrics
    run = lambda e, l: retrieval_metrics(e, l, ks=(1,))["map_at_r"]
else:
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
    calc = AccuracyCalculator(include=("mean_average_precision_at_r",), device=torch.device("cpu"))
    run = lambda e, l: calc.get_accuracy(e, l)["mean_average_precision_at_r"]
run(emb[:512], labels[:512])
Path("/proc/self/clear_refs").write_text("5")
base = status("VmRSS")
t = time.perf_counter()
score = run(emb, labels)
ms = (time.perf_counter() - t) * 1000
print(json.dumps({"ms": ms, "extra": status("VmHWM") - base, "map_at_r": float(score)}))
"""

TRAIN = r"""
import json, sys, torch
from pathlib import Path
from dmlkit.config import load_config
from dmlkit.methods.hooks import MethodHooks
from dmlkit.recipe import Trainer

def rss():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024

steps, warmup, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
samples = {}
class Probe(MethodHooks):
    def after_backward(self, trainer):
        if (trainer.step + 1) in (warmup, steps // 2, steps):
            samples[trainer.step + 1] = rss()
cfg = load_config(overrides=[
    "data.name=digits", "model.embedding_size=8", "sampler.batch_size=8", "sampler.m=2",
    f"train.max_steps={steps}", "train.log_every=50", "train.checkpoint_every=500", "train.progress=false",
    "eval.clustering=false", "eval.save_embeddings=false", "train.num_threads=1"])
Trainer(cfg, out, hooks=Probe(), echo=lambda _: None).fit()
print(json.dumps(samples))
"""


def bound(n: int, d: int, k: int) -> int:
    """The documented bound on the extra peak memory of retrieval_metrics (tests/reliability/test_long_runs.py)."""
    return 16 * n * d + 64 * n * k + 256 * MiB


def run_eval(which: str, n: int, d: int, per_class: int) -> dict:
    proc = subprocess.run([sys.executable, "-c", EVAL, which, str(n), str(d), str(per_class)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"{which} N={n} failed (exit {proc.returncode}): {proc.stderr.strip()[-600:]}", file=sys.stderr)
        return {"ms": float("nan"), "extra": float("nan"), "map_at_r": float("nan")}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[200_000])
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--per-class", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--no-reference", action="store_true", help="skip PML (faster)")
    args = parser.parse_args()

    rows = []
    for n in args.sizes:
        ours, ref = [], []
        for _ in range(args.repeats):
            ours.append(run_eval("dmlkit", n, args.dim, args.per_class))
            if not args.no_reference:
                ref.append(run_eval("pml", n, args.dim, args.per_class))
        ms = statistics.median(r["ms"] for r in ours)
        ref_ms = statistics.median(r["ms"] for r in ref) if ref else float("nan")
        rows.append((f"retrieval_metrics N={n} D={args.dim}", ms, ref_ms,
                     max(r["extra"] for r in ours) / MiB,
                     max(r["extra"] for r in ref) / MiB if ref else float("nan"),
                     bound(n, args.dim, max(8, args.per_class)) / MiB,
                     ours[0]["map_at_r"], ref[0]["map_at_r"] if ref else float("nan")))
    print(f"{'name':40s} {'dmlkit ms':>10s} {'reference ms':>13s} {'ratio':>6s} {'dmlkit MiB':>11s} "
          f"{'ref MiB':>8s} {'bound MiB':>10s} {'MAP@R':>7s} {'ref MAP@R':>9s}")
    for name, ms, ref_ms, mem, ref_mem, lim, score, ref_score in rows:
        print(f"{name:40s} {ms:10.0f} {ref_ms:13.0f} {ms / ref_ms:6.2f} {mem:11.0f} {ref_mem:8.0f} {lim:10.0f} "
              f"{score:7.4f} {ref_score:9.4f}")

    if args.steps:
        with tempfile.TemporaryDirectory() as tmp:
            proc = subprocess.run([sys.executable, "-c", TRAIN, str(args.steps), "300", f"{tmp}/run"],
                                  capture_output=True, text=True, check=True)
        samples = {int(k): v for k, v in json.loads(proc.stdout.strip().splitlines()[-1]).items()}
        first, last = samples[min(samples)], samples[max(samples)]
        print("\ntraining RSS: " + ", ".join(f"step {s}: {v / MiB:.1f} MiB" for s, v in sorted(samples.items()))
              + f"; growth {(last - first) / MiB:+.1f} MiB over {max(samples) - min(samples)} steps")


if __name__ == "__main__":
    main()
