"""MAP@R with query-time re-ranking: alpha-QE, DBA, k-reciprocal, on a run's saved test embeddings.

Run:  .venv/bin/python benchmarks/bench_rerank.py RUN_DIR [RUN_DIR ...]

Leave-one-out retrieval on ``RUN_DIR/embeddings/test.npz`` (the embeddings the run scored): every
test image queries all others; MAP@R (and P@1) from the full re-ranked distance matrix, the query
itself excluded. alpha-QE skips the query's own row; DBA replaces every item (queries included, as
they are the database) before searching; k-reciprocal uses ``k_reciprocal_distance(None, x)``.
The first row (no re-ranking) equals ``retrieval_metrics`` on the same embeddings (checked).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch


def loo_metrics(dist: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """P@1 and MAP@R of leave-one-out rankings by ``dist [N, N]`` (ascending; the diagonal is skipped)."""
    from dmlkit.evaluation.retrieval import _RetrievalSums, true_reference_counts

    dist = dist.clone().double()
    dist.fill_diagonal_(float("inf"))
    r = true_reference_counts(labels, labels, True)
    k = int(r.max())
    order = torch.sort(dist, dim=1, stable=True).indices[:, :k]
    sums = _RetrievalSums((1,))
    sums.add(labels[order] == labels.unsqueeze(1), r)
    out = sums.result()
    return {"map_at_r": out["map_at_r"], "precision_at_1": out["precision_at_1"]}


def variants(x: torch.Tensor, r_mean: float):
    from dmlkit.index.rerank import alpha_query_expansion, database_augmentation, k_reciprocal_distance

    unit = torch.nn.functional.normalize(x, dim=1)
    yield "none", 1 - unit.double() @ unit.double().T
    for n in (1, 2, 4):
        q = alpha_query_expansion(unit, unit, n=n, alpha=3.0, exclude_self=True)
        yield f"alpha-QE n={n}, alpha=3", 1 - q @ unit.T
    for n in (2, 4):
        g = database_augmentation(unit, n=n, alpha=3.0)
        yield f"DBA n={n}, alpha=3", 1 - g @ g.T
    g = database_augmentation(unit, n=2, alpha=3.0)
    q = alpha_query_expansion(g, g, n=2, alpha=3.0, exclude_self=True)
    yield "DBA n=2 + alpha-QE n=2", 1 - q @ g.T
    yield "k-reciprocal k1=20, k2=6, lambda=0.3 (paper)", k_reciprocal_distance(None, unit, 20, 6, 0.3)
    k1 = max(2, int(round(r_mean)))
    yield f"k-reciprocal k1={k1} (mean R), k2=3, lambda=0.3", k_reciprocal_distance(None, unit, k1, 3, 0.3)


def main() -> int:
    from dmlkit.evaluation import retrieval_metrics

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for run in args.runs:
        with np.load(Path(run) / "embeddings" / "test.npz") as z:
            x, labels = torch.from_numpy(z["embeddings"]).float(), torch.from_numpy(z["labels"]).long()
        r_mean = float(torch.unique(labels, return_counts=True)[1].double().mean()) - 1
        print(f"{run}: {len(x)} test images, {int(labels.max()) + 1} classes, mean R = {r_mean:.1f}")
        print("| re-ranking | MAP@R | change | P@1 |")
        print("| --- | ---: | ---: | ---: |")
        base = None
        for name, dist in variants(x, r_mean):
            m = loo_metrics(dist, labels)
            if base is None:
                base = m["map_at_r"]
                ref = retrieval_metrics(x, labels, ks=(1,), metric="cosine")["map_at_r"]
                assert abs(ref - base) < 1e-6, (ref, base)
            print(f"| {name} | {m['map_at_r']:.4f} | {m['map_at_r'] - base:+.4f} | {m['precision_at_1']:.4f} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
