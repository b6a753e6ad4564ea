"""Retrieval metrics: P@1, Recall@K, R-Precision and MAP@R, leave-one-out or query -> gallery.

Definitions (ASAP, Appendix A.2; Musgrave et al. 2020): for query ``i`` let ``R_i`` be its
number of true references (same label; in leave-one-out the query itself is not counted).

* ``precision_at_1``: 1 if the nearest reference has the query's label.
* ``recall_at_<k>``: 1 if any of the ``k`` nearest references has the query's label
  (Proxy-Anchor / DRO tables); ``recall_at_1 == precision_at_1``.
* ``r_precision``: ``r_i / R_i`` with ``r_i`` the true references among the ``R_i`` nearest.
* ``map_at_r``: ``(1 / R_i) * sum_{j <= R_i} P@j * [j-th neighbour is true]``.

Every metric is averaged over queries with ``R_i > 0``; the others are counted in
``num_queries_excluded`` (they can never score, so P@1 and Recall@K exclude them too).
Neighbours are ranked exactly (see :mod:`dmlkit.evaluation.knn`): float64 keys. Equal distances
are ordered at random (seeded, so the metrics are deterministic), not by the references' positions:
the references are taken in a fixed seeded permutation (which of many tied references reach the
shortlist) and each query shuffles its own tied neighbours. Ties then favour no class: identical
embeddings score what chance would, however the data set orders its classes. With a single class
every neighbour matches and the metrics are 1 by construction: a warning says so.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from dmlkit.core.validation import Options, validate_params
from dmlkit.evaluation._checks import BACKENDS, METRICS, check_evaluation_inputs, check_ks
from dmlkit.evaluation.knn import drop_own_neighbours, iter_knn_blocks, searches_on_device
from dmlkit.exceptions import DataError

#: Seed of the permutation that orders tied references (fixed: the metrics stay deterministic).
TIE_SEED = 0


def _tie_order(n: int) -> torch.Tensor:
    """A fixed seeded permutation of ``n`` references: the order in which equal distances are ranked."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(TIE_SEED))


def _shuffle_ties(keys: torch.Tensor, start: int) -> torch.Tensor | None:
    """Column order ``[b, k]`` that shuffles each row's runs of equal ``keys`` (sorted best first) with a
    generator seeded by :data:`TIE_SEED` and the block's first query: each query breaks its ties its own way.

    None when the block has no tie (the order would be the identity). The noise is drawn on the CPU
    whatever the keys' device, so a block shuffles the same way on a GPU."""
    if keys.shape[1] < 2:
        return None
    changes = keys[:, 1:] != keys[:, :-1]
    if bool(changes.all()):
        return None
    group = torch.zeros_like(keys, dtype=torch.float64)
    group[:, 1:] = changes.cumsum(dim=1).to(torch.float64)
    noise = torch.rand(keys.shape, generator=torch.Generator().manual_seed(TIE_SEED + start), dtype=torch.float64)
    return torch.argsort(group + noise.to(keys.device), dim=1)


def _warn_single_class(labels: torch.Tensor, reference_labels: torch.Tensor) -> None:
    """Warn when queries and references hold one class: every neighbour matches, every metric is 1."""
    first = reference_labels[:1]
    if bool((reference_labels == first).all()) and bool((labels == first).all()):
        import warnings

        warnings.warn(f"the evaluated split has a single class ({len(reference_labels)} samples): every neighbour "
                      "matches, so P@1, Recall@K, MAP@R (and NMI) are 1 by construction and say nothing about the "
                      "embedding. Evaluate on a split with several classes.", UserWarning, stacklevel=3)


def true_reference_counts(
    labels: torch.Tensor, reference_labels: torch.Tensor, leave_one_out: bool
) -> torch.Tensor:
    """``R_i`` ``[Nq]`` int64: references sharing query ``i``'s label (minus itself in leave-one-out)."""
    classes, counts = torch.unique(reference_labels, return_counts=True)
    pos = torch.searchsorted(classes, labels).clamp_max(max(len(classes) - 1, 0))
    found = classes[pos] == labels
    r = torch.where(found, counts[pos], torch.zeros_like(counts[pos]))
    return r - int(leave_one_out)


def _within_r(hits: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """``[b, k]`` bool: rank ``j`` (1-based) is at most the query's ``R``."""
    rank = torch.arange(1, hits.shape[1] + 1, device=hits.device)
    return rank.unsqueeze(0) <= r.unsqueeze(1)


def _average_precision_at_r(hits: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """Per-query AP@R ``[b]`` float64: ``(1 / R) * sum_{j <= R} P@j * [j-th neighbour is true]`` (``R > 0``)."""
    hits_r = hits & _within_r(hits, r)
    rank = torch.arange(1, hits.shape[1] + 1, dtype=torch.float64, device=hits.device)
    precision_at_rank = hits_r.cumsum(1).double() / rank
    return (precision_at_rank * hits_r).sum(1) / r.double()


def map_at_r_per_query(
    embeddings: torch.Tensor, labels: torch.Tensor, *, metric: str = "euclidean", backend: str = "torch"
) -> torch.Tensor:
    """Leave-one-out AP@R of every query ``[N]`` float64 (NaN where the query has no true reference).

    Their mean over the non-NaN entries is :func:`retrieval_metrics`' ``map_at_r``; per query they
    allow paired comparisons of two embeddings of the same images (model selection).
    """
    validate_params(
        "map_at_r_per_query",
        {"metric": metric, "backend": backend},
        {"metric": [Options(METRICS)], "backend": [Options(BACKENDS)]},
    )
    check_evaluation_inputs(embeddings, labels, None, None)
    device = embeddings.device if searches_on_device(embeddings, backend) else torch.device("cpu")
    labels = labels.to(device).long()
    r = true_reference_counts(labels, labels, True)
    k = max(1, min(embeddings.shape[0] - 1, int(r.max()) if len(r) else 1))
    out = torch.full((len(labels),), float("nan"), dtype=torch.float64, device=device)
    for start, end, _, idx in iter_knn_blocks(embeddings, embeddings, k, exclude_self=True, metric=metric,
                                              backend=backend):
        block_r = r[start:end]
        valid = block_r > 0
        hits = labels[idx] == labels[start:end].unsqueeze(1)
        out[start:end][valid] = _average_precision_at_r(hits[valid], block_r[valid])
    return out.cpu()


def paired_gain(per_query: torch.Tensor, baseline: torch.Tensor) -> tuple[float, float]:
    """Mean per-query AP@R gain over ``baseline`` and its standard error (queries scored by both).

    Both are :func:`map_at_r_per_query` of the same images; the error is the standard deviation of
    the paired differences over the square root of their number (inf with fewer than 2 queries).
    """
    both = ~(per_query.isnan() | baseline.isnan())
    diff = (per_query - baseline)[both].double()
    if diff.numel() < 2:
        return float(diff.sum()), float("inf")
    return float(diff.mean()), float(diff.std() / diff.numel() ** 0.5)


class _RetrievalSums:
    """Accumulates per-query scores (float64 sums over queries with R > 0), as tensors on the blocks' device
    until :meth:`result` (a GPU keeps them; the same float64 additions as Python floats)."""

    def __init__(self, ks: tuple[int, ...]):
        self.ks = ks
        self.count = 0
        self.excluded = 0
        self.sums = {name: 0.0 for name in self.names()}

    def names(self) -> list[str]:
        return ["precision_at_1", *[f"recall_at_{k}" for k in self.ks], "r_precision", "map_at_r"]

    def add(self, hits: torch.Tensor, r: torch.Tensor) -> None:
        """Add a block: ``hits [b, k]`` bool (neighbour j is true), ``r [b]`` true-reference counts."""
        valid = r > 0
        self.excluded += (~valid).sum()
        hits, r = hits[valid], r[valid]
        self.count += len(r)
        hits_r = hits & _within_r(hits, r)
        self.sums["precision_at_1"] += hits[:, 0].double().sum()
        for k in self.ks:
            self.sums[f"recall_at_{k}"] += hits[:, :k].any(1).double().sum()
        self.sums["r_precision"] += (hits_r.sum(1).double() / r.double()).sum()
        self.sums["map_at_r"] += _average_precision_at_r(hits, r).sum()

    def result(self) -> dict[str, float | int]:
        count = int(self.count)
        out: dict[str, float | int] = {name: (float(s) / count if count else float("nan")) for name, s in self.sums.items()}
        out["num_queries_excluded"] = int(self.excluded)
        return out


def own_reference_rows(query_ids: Sequence, reference_ids: Sequence) -> torch.Tensor:
    """``[Nq]`` int64: the reference row holding each query itself (same id, e.g. the image path), -1 if none.

    A row that is both a query and a gallery item (open-metric-learning's ``is_query`` and ``is_gallery``)
    must not retrieve itself; :func:`retrieval_metrics` excludes these rows with ``own_reference``.
    """
    where = {ident: row for row, ident in enumerate(reference_ids)}
    return torch.tensor([where.get(ident, -1) for ident in query_ids], dtype=torch.int64)


def query_gallery_union(
    queries: torch.Tensor, query_labels: torch.Tensor, gallery: torch.Tensor, gallery_labels: torch.Tensor,
    own_reference: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every embedding of a query/gallery split once (``[N, D]``, ``[N]``): queries, then the gallery rows that
    are not a query's own row (verification and clustering pairs would otherwise count an image with itself)."""
    keep = torch.ones(gallery.shape[0], dtype=torch.bool)
    if own_reference is not None:
        keep[own_reference[own_reference >= 0]] = False
    rows = keep.nonzero().flatten()
    return (torch.cat([queries, gallery.index_select(0, rows.to(gallery.device))]),
            torch.cat([query_labels, gallery_labels.index_select(0, rows.to(gallery_labels.device))]))


def _retrieval_blocks(embeddings, labels, reference, reference_labels, ks, metric, backend, own_reference):
    """Yield ``(query rows [b], hits [b, k], R [b])`` (hits with ties shuffled) for blocks of queries."""
    validate_params(
        "retrieval_metrics",
        {"metric": metric, "backend": backend},
        {"metric": [Options(METRICS)], "backend": [Options(BACKENDS)]},
    )
    ks = check_ks(ks)
    check_evaluation_inputs(embeddings, labels, reference, reference_labels)
    leave_one_out = reference is None
    device = embeddings.device if searches_on_device(embeddings, backend) else torch.device("cpu")
    query_rows = torch.arange(embeddings.shape[0])
    own = None
    if leave_one_out:  # queries and references permuted together (self-exclusion needs the same order)
        order = _tie_order(embeddings.shape[0]).to(embeddings.device)
        embeddings, labels = embeddings.index_select(0, order), labels.index_select(0, order.to(labels.device))
        reference, reference_labels = embeddings, labels
        query_rows = order.cpu()
    else:
        order = _tie_order(reference.shape[0]).to(reference.device)
        reference = reference.index_select(0, order)
        reference_labels = reference_labels.index_select(0, order.to(reference_labels.device))
        if own_reference is not None and bool((own_reference >= 0).any()):
            if own_reference.shape != (embeddings.shape[0],):
                raise DataError(f"own_reference must have one entry per query ({embeddings.shape[0]}). "
                                f"Got shape {tuple(own_reference.shape)}.")
            position = torch.empty_like(order.cpu())
            position[order.cpu()] = torch.arange(len(order))  # where each reference row went
            own_reference = own_reference.cpu().long()
            own = torch.where(own_reference >= 0, position[own_reference.clamp_min(0)], own_reference).to(device)
    labels, reference_labels = labels.to(device).long(), reference_labels.to(device).long()
    _warn_single_class(labels, reference_labels)
    r = true_reference_counts(labels, reference_labels, leave_one_out)
    if own is not None:  # a query's own row is not one of its true references
        r = r - (own >= 0).long()
    available = reference.shape[0] - int(leave_one_out or own is not None)
    k = min(available, max(max(ks), int(r.max()) if len(r) else 1))
    search_k = k + 1 if own is not None else k
    for start, end, keys, idx in iter_knn_blocks(
        embeddings, reference, search_k, exclude_self=leave_one_out, metric=metric, backend=backend
    ):
        keys, idx = keys.to(device), idx.to(device)
        if own is not None:
            idx, keys = drop_own_neighbours(idx, own[start:end], keys)
        hits = reference_labels[idx] == labels[start:end].unsqueeze(1)
        order = _shuffle_ties(keys, start)
        yield query_rows[start:end], hits if order is None else hits.gather(1, order), r[start:end]


def retrieval_metrics(
    embeddings: torch.Tensor,
    labels: torch.Tensor,
    *,
    reference: torch.Tensor | None = None,
    reference_labels: torch.Tensor | None = None,
    ks: Sequence[int] = (1, 2, 4, 8),
    metric: str = "euclidean",
    backend: str = "torch",
    own_reference: torch.Tensor | None = None,
) -> dict[str, float | int]:
    """P@1, Recall@K, R-Precision and MAP@R of ``embeddings [N, D]`` (ASAP App. A.2).

    Without ``reference`` each sample queries all others (leave-one-out: CUB, Cars, SOP);
    with ``reference [M, D]`` and ``reference_labels [M]`` the embeddings query that gallery
    (In-Shop). ``own_reference [N]`` (:func:`own_reference_rows`) names the gallery row that is the
    query itself (-1: none), left out of that query's neighbours and true references. ``metric`` ranks
    by Euclidean distance (default, as PML's AccuracyCalculator), cosine similarity or dot product; on
    L2-normalised embeddings Euclidean and cosine give the same ranking. Returns floats plus
    ``num_queries_excluded`` (int).
    """
    sums = _RetrievalSums(check_ks(ks))
    for _, hits, r in _retrieval_blocks(embeddings, labels, reference=reference, reference_labels=reference_labels,
                                        ks=ks, metric=metric, backend=backend, own_reference=own_reference):
        sums.add(hits, r)
    return sums.result()


def retrieval_metrics_per_group(
    embeddings: torch.Tensor, labels: torch.Tensor, groups: Sequence[str], **options: Any
) -> dict[str, dict[str, float | int]]:
    """:func:`retrieval_metrics` of each group of queries (e.g. a product category), keyed by sorted group name.

    ``groups`` names the group of every query ``[N]``; ``options`` are :func:`retrieval_metrics`'
    keyword arguments. Each query still retrieves from the whole gallery (all other samples in
    leave-one-out), so a group's metrics are the means of its queries' scores in the overall metrics.
    """
    if len(groups) != embeddings.shape[0]:
        raise DataError(f"groups has {len(groups)} entries but embeddings has {embeddings.shape[0]} rows.")
    names = sorted(set(groups))
    number = {name: i for i, name in enumerate(names)}
    group_ids = torch.tensor([number[g] for g in groups], dtype=torch.int64)
    options = {"reference": None, "reference_labels": None, "ks": (1, 2, 4, 8), "metric": "euclidean",
               "backend": "torch", "own_reference": None, **options}
    sums = [_RetrievalSums(check_ks(options["ks"])) for _ in names]
    for rows, hits, r in _retrieval_blocks(embeddings, labels, **options):
        block_groups = group_ids[rows]
        for g in block_groups.unique().tolist():
            mine = (block_groups == g).to(hits.device)
            sums[g].add(hits[mine], r[mine])
    return {name: s.result() for name, s in zip(names, sums)}
