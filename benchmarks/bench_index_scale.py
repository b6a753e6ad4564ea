"""Search at scale: every index kind on clustered vectors, with build time, memory, queries/s and recall@10.

Run:  .venv/bin/python benchmarks/bench_index_scale.py --n 1000000 --kinds flat,ivf,hnsw,compressed --work DIR
      .venv/bin/python benchmarks/bench_index_scale.py --n 10000000 --kinds compressed --work DIR

``--n`` x 128 synthetic vectors around 10,000 Gaussian centres (noise 0.35 per dimension, normalised)
are written in chunks straight to a float32 file in ``--work`` (a memory map: 5.1 GB at 10M, never
held in memory), with 10,000 held-out queries from the same centres and their exact 10 nearest
neighbours (inner product; :func:`exact_by_centres` searches only the groups of rows drawn around
the centres that can hold a neighbour, skipping the others by a Cauchy-Schwarz bound, which keeps
the answer exact: at 1M it returned the brute-force neighbour sets for 9,998 of 10,000 queries and
the other two differ by a tie at float32 precision). Each kind then runs in its
own process (faiss on 2 threads): build time and the build's peak resident memory; the index is
saved, loaded back in a fresh state, and its resident memory measured (anonymous memory added by
loading, i.e. what the index holds; the compressed kind's float file is mapped and only the
pages a query reads are cached, reported apart as file-backed memory); then the 10,000 queries in
one batch (queries/s; wall and process CPU seconds are both recorded, the machine may be
shared) and recall@10 against the exact neighbours, before re-rank (faiss's own
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
def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime

before = status()
t0, c0 = time.perf_counter(), cpu()
index = Index.from_embeddings(gallery if kind == "compressed" else np.array(gallery), kind=kind,
                              measure_recall=False, **options)
build, build_cpu = time.perf_counter() - t0, cpu() - c0
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
t, c = time.perf_counter(), cpu()
found = index.query_embeddings(q, 10).ids
query_s, query_cpu = time.perf_counter() - t, cpu() - c
after = status()
disk = Path(path).stat().st_size + (vectors_path(path).stat().st_size if kind == "compressed" else 0)
print(json.dumps({"kind": kind, "n": n, "build_s": build, "build_cpu_s": build_cpu, "query_cpu_s": query_cpu,
                  "build_peak_mb": peak,
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
        log(f"exact 10 nearest of {QUERIES:,} queries over {n:,} vectors")
        t = time.perf_counter()
        rows = exact_by_centres(np.memmap(gallery, dtype=np.float32, mode="r", shape=(n, DIM)),
                                *gallery_centres(n, seed), np.load(queries))[1]
        np.save(truth.with_suffix(".tmp.npy"), rows)
        truth.with_suffix(".tmp.npy").rename(truth)
        log(f"exact search took {time.perf_counter() - t:.0f} s")


def gallery_centres(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The centres and the centre each gallery row of :func:`make_data` was drawn around (its generator replayed)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(CENTRES, DIM)).astype(np.float32)
    labels = np.empty(n, dtype=np.int64)
    for start in range(0, n, CHUNK):
        m = min(CHUNK, n - start)
        labels[start:start + m] = rng.integers(0, CENTRES, m)
        rng.normal(size=(m, DIM))  # the noise draw, to stay in step with the generator
    return centres, labels


def exact_by_centres(gallery: np.ndarray, centres: np.ndarray, labels: np.ndarray, queries: np.ndarray,
                     k: int = 10) -> tuple[np.ndarray, np.ndarray, float]:
    """Exact ``k`` nearest rows (inner product) of unit ``queries``, searching only the centres' groups
    that can hold one. Every row ``x`` of centre ``c`` has ``q . x <= q . u_c + r_c`` (Cauchy-Schwarz;
    ``u_c`` the unit centre, ``r_c`` the group's largest ``|x - u_c|``), so a group whose bound is below a
    score already found is skipped without changing the answer. Returns (scores, rows, groups searched
    per query)."""
    unit = centres / np.linalg.norm(centres, axis=1, keepdims=True)
    order = np.argsort(labels, kind="stable")
    starts = np.searchsorted(labels[order], np.arange(CENTRES + 1))
    radius = np.zeros(CENTRES, dtype=np.float64)
    for start in range(0, len(gallery), CHUNK):
        block, lab = np.asarray(gallery[start:start + CHUNK]), labels[start:start + CHUNK]
        np.maximum.at(radius, lab, np.linalg.norm(block - unit[lab], axis=1))
    bound = queries @ unit.T + radius.astype(np.float32) + 1e-5  # [Q, C]; 1e-5 covers float32 rounding
    top_s = np.full((len(queries), k), -np.inf, dtype=np.float32)
    top_i = np.full((len(queries), k), -1, dtype=np.int64)

    def search(pairs_q: np.ndarray, pairs_c: np.ndarray) -> None:
        if len(pairs_q) == 0:
            return
        by_group = np.argsort(pairs_c, kind="stable")
        pairs_q, pairs_c = pairs_q[by_group], pairs_c[by_group]
        cuts = np.flatnonzero(np.diff(pairs_c)) + 1
        for qs, cs in zip(np.split(pairs_q, cuts), np.split(pairs_c, cuts)):
            rows = order[starts[cs[0]]:starts[cs[0] + 1]]
            if len(rows) == 0:
                continue
            scores = queries[qs] @ np.asarray(gallery[rows]).T
            all_s = np.concatenate([top_s[qs], scores], axis=1)
            all_i = np.concatenate([top_i[qs], np.broadcast_to(rows, scores.shape)], axis=1)
            best = np.argsort(-all_s, axis=1, kind="stable")[:, :k]
            top_s[qs], top_i[qs] = np.take_along_axis(all_s, best, 1), np.take_along_axis(all_i, best, 1)

    first = np.argsort(-bound, axis=1)[:, :2]  # the two most promising groups give a k-th score to beat
    search(np.repeat(np.arange(len(queries)), 2), first.ravel())
    searched = np.zeros_like(bound, dtype=bool)
    np.put_along_axis(searched, first, True, 1)
    rest_q, rest_c = np.nonzero((bound >= top_s[:, -1:]) & ~searched)
    search(rest_q, rest_c)
    return top_s, top_i, 2 + len(rest_q) / len(queries)


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
