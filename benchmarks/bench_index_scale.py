"""Search at scale: every index kind on clustered vectors, with build time, memory, queries/s and recall@10.

Run:  .venv/bin/python benchmarks/bench_index_scale.py --n 1000000 --kinds flat,ivf,hnsw,compressed --work DIR
      .venv/bin/python benchmarks/bench_index_scale.py --n 10000000 --kinds compressed --work DIR

``--n`` x 128 synthetic vectors around 10,000 Gaussian centres (noise 0.35 per dimension, normalised)
are written in chunks straight to a float32 file in ``--work`` (a memory map: 5.1 GB at 10M, never
held in memory), with 10,000 held-out queries from the same centres and their exact 10 nearest
neighbours (inner product, searched one chunk of the file at a time). Each kind then runs in its
own process (faiss on 2 threads): build time and the build's peak resident memory; the index is
saved, loaded back in a fresh state, and its resident memory measured (anonymous memory added by
loading, i.e. what the index holds; the compressed kind's float file is mapped and only the
pages a query reads are cached, reported apart as file-backed memory); then the 10,000 queries in
one batch (queries/s) and recall@10 against the exact neighbours, before re-rank (faiss's own
order) and after (what ``Index.query_embeddings`` returns). flat, ivf and hnsw load the whole
gallery into memory to build. The files in ``--work`` are reused by a later run with the same
``--n`` (delete them to start over).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

DIM, CENTRES, NOISE, QUERIES, CHUNK = 128, 10_000, 0.35, 10_000, 500_000
# OpenMP threads that wait passively: on a shared machine spinning threads slow faiss's small k-means steps 10x
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

CHILD = r"""
import gc, json, resource, sys, time
from pathlib import Path
import numpy as np
import faiss
faiss.omp_set_num_threads(2)
import torch
torch.set_num_threads(2)
from dmlkit.index import Index
from dmlkit.index.compressed import vectors_path

def status():
    fields = {}
    for line in open("/proc/self/status"):
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            fields[key] = int(value.split()[0]) / 1024  # MB
    return fields

work, n, kind = sys.argv[1], int(sys.argv[2]), sys.argv[3]
options = json.loads(sys.argv[4])
gallery = np.memmap(f"{work}/gallery-{n}.f32", dtype=np.float32, mode="r", shape=(n, 128))
queries = np.load(f"{work}/queries-{n}.npy")
before = status()
t0 = time.perf_counter()
index = Index.from_embeddings(gallery if kind == "compressed" else np.array(gallery), kind=kind,
                              measure_recall=False, **options)
build = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
path = f"{work}/index-{kind}-{n}.index"
index.save(path)
params, training = dict(index.params), index.training
del index
gc.collect()
truth = None
while truth is None:  # the exact neighbours may still be computed beside the build
    try:
        truth = np.load(f"{work}/truth-{n}.npy")
    except (OSError, ValueError):
        time.sleep(10)
base = status()
index = Index.load(path)
gc.collect()
loaded = status()

def recall(found):
    return float(np.mean([len(set(t.tolist()) & set(f.tolist())) for t, f in zip(truth, found)]) / 10)

q = (queries / np.linalg.norm(queries, axis=1, keepdims=True)).astype(np.float32)
raw = None
if kind == "compressed":
    t = time.perf_counter()
    _, raw = index.faiss_index.search(q, 10)
    raw_s = time.perf_counter() - t
t = time.perf_counter()
found = index.query_embeddings(q, 10).ids
query_s = time.perf_counter() - t
after = status()
disk = Path(path).stat().st_size + (vectors_path(path).stat().st_size if kind == "compressed" else 0)
print(json.dumps({"kind": kind, "n": n, "build_s": build, "build_peak_mb": peak,
                  "index_mb": loaded["RssAnon"] - base["RssAnon"], "mapped_file_mb": after["RssFile"] - base["RssFile"],
                  "qps": len(q) / query_s, "raw_qps": None if raw is None else len(q) / raw_s,
                  "recall_raw": None if raw is None else recall(raw), "recall": recall(found),
                  "disk_mb": disk / 2**20, "params": params, "training": training}))
"""


def log(message: str) -> None:
    print(time.strftime("%H:%M:%S"), message, file=sys.stderr, flush=True)


def make_data(work: Path, n: int, seed: int = 0) -> None:
    """The gallery file, the queries and their exact neighbours in ``work`` (kept: a rerun reuses them)."""
    import faiss

    from dmlkit.index.compressed import exact_top_k

    faiss.omp_set_num_threads(2)
    gallery, queries, truth = work / f"gallery-{n}.f32", work / f"queries-{n}.npy", work / f"truth-{n}.npy"
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(CENTRES, DIM)).astype(np.float32)

    def sample(m: int, rng: np.random.Generator) -> np.ndarray:
        x = centres[rng.integers(0, CENTRES, m)] + NOISE * rng.normal(size=(m, DIM)).astype(np.float32)
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    if not gallery.exists():
        log(f"writing {n:,} x {DIM} vectors to {gallery}")
        tmp = gallery.with_suffix(".tmp")
        out = np.memmap(tmp, dtype=np.float32, mode="w+", shape=(n, DIM))
        for start in range(0, n, CHUNK):
            out[start:start + CHUNK] = sample(min(CHUNK, n - start), rng)
        out.flush()
        del out
        tmp.rename(gallery)
    if not truth.exists():
        np.save(queries, sample(QUERIES, np.random.default_rng(seed + 1)))  # same centres, not in the gallery
        log(f"exact 10 nearest of {QUERIES:,} queries over {n:,} vectors, {CHUNK:,} rows at a time")
        t = time.perf_counter()
        _, rows = exact_top_k(np.load(queries), np.memmap(gallery, dtype=np.float32, mode="r", shape=(n, DIM)), 10,
                              chunk=CHUNK)
        np.save(truth.with_suffix(".tmp.npy"), rows)
        truth.with_suffix(".tmp.npy").rename(truth)
        log(f"exact search took {time.perf_counter() - t:.0f} s")


def run_kind(work: Path, n: int, kind: str, options: dict) -> dict:
    log(f"{kind}: build, save, load, query")
    out = subprocess.run([sys.executable, "-c", CHILD, str(work), str(n), kind, json.dumps(options)],
                         capture_output=True, text=True)
    if out.returncode:
        sys.stderr.write(out.stderr[-4000:])
        raise SystemExit(f"{kind} failed (exit {out.returncode})")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    log(json.dumps(result))
    return result


def table(results: list[dict], n: int) -> list[str]:
    lines = [f"{n:,} x {DIM} clustered vectors, {QUERIES:,} queries, k=10, 2 threads:",
             "| kind | build (s) | build peak RSS (MB) | index RSS (MB) | on disk (MB) | queries/s | "
             "recall@10 before re-rank | recall@10 | parameters |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    keys = {"flat": (), "ivf": ("nlist", "nprobe"), "hnsw": ("hnsw_m", "ef_construction", "ef_search"),
            "compressed": ("nlist", "nprobe", "code_size", "pq_bits", "opq", "shortlist")}
    for r in results:
        params = ", ".join(f"{k}={r['params'][k]}" for k in keys[r["kind"]])
        raw = "-" if r["recall_raw"] is None else f"{r['recall_raw']:.4f}"
        lines.append(f"| {r['kind']} | {r['build_s']:.0f} | {r['build_peak_mb']:.0f} | {r['index_mb']:.0f} | "
                     f"{r['disk_mb']:.0f} | {r['qps']:.0f} | {raw} | {r['recall']:.4f} | {params} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--kinds", default="flat,ivf,hnsw,compressed")
    parser.add_argument("--work", required=True, help="folder for the vectors, the ground truth and the indexes")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an Index parameter for every kind, e.g. --set shortlist=300")
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    options = {key: json.loads(value) for key, value in (s.split("=", 1) for s in args.set)}
    make_data(work, args.n)
    results = [run_kind(work, args.n, kind, options) for kind in args.kinds.split(",")]
    (work / f"results-{args.n}.json").write_text(json.dumps(results, indent=2))
    print("\n".join(table(results, args.n)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
