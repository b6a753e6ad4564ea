"""A saved search index over a gallery of images: faiss vectors + paths, labels, model fingerprint.

Scores are cosine similarities of L2-normalised embeddings (faiss inner product); the distance
printed is ``1 - score``. Ids are stable: each item keeps the id it was given when added, removed
ids are never reused (``faiss.IndexIDMap2``). The whole index is one file (an uncompressed
``.npz`` holding the serialised faiss index, ids, paths, labels and a JSON header), written to a
temporary name and renamed, so an interrupted ``save`` leaves the previous file intact. The
``compressed`` kind (:mod:`dmlkit.index.compressed`) keeps its float vectors in a second file beside
it, ``<index>.vectors``, read memory-mapped.
"""

from __future__ import annotations

import io
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from dmlkit.exceptions import ConfigError, DataError, InvalidParameterError
from dmlkit.index.classify import Classification

KINDS = ("flat", "ivf", "hnsw", "compressed")
FORMAT = "dmlkit-index-1"
#: The arrays of an index file (:meth:`Index.save`).
INDEX_ARRAYS = ("header", "faiss", "ids", "paths", "has_path", "labels", "has_label")
#: Queries used to measure an approximate index's recall@10 against exact search at build time.
RECALL_SAMPLE = 1000
#: Default HNSW graph: links per node (faiss's M), candidate list while building (efConstruction) and
#: while searching (efSearch). Chosen on 1,000,000 x 128 clustered vectors on 2 cores (docs/results.md):
#: efConstruction sets how close to exact the graph can get, efSearch whether a query finds its region.
HNSW_M = 20
HNSW_EF_CONSTRUCTION = 64
HNSW_EF_SEARCH = 256


def _faiss():
    from dmlkit.core.validation import require_module

    return require_module("faiss", "faiss-cpu", "the search index", "faiss-cpu")


def _unit_rows(x: torch.Tensor | np.ndarray) -> np.ndarray:
    """float32 C-contiguous rows scaled to unit length (cosine similarity = inner product)."""
    arr = np.array(x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else x, dtype=np.float32, order="C")
    if arr.ndim != 2:
        raise DataError(f"embeddings must be [N, D]. Got shape {arr.shape}.")
    if not np.isfinite(arr).all():
        raise DataError("embeddings contain NaN or infinite values.")
    norms = np.linalg.norm(arr, axis=1, keepdims=True)
    return arr / np.maximum(norms, np.finfo(np.float32).tiny)


def ivf_lists(n: int) -> int:
    """Default number of IVF lists for ``n`` vectors: about ``sqrt(n)``, at least 39 training points each."""
    from dmlkit.index.compressed import default_nlist

    return default_nlist(n)


@dataclass
class QueryResult:
    """Neighbours of ``Q`` queries, best first: ``ids``, ``scores`` (cosine), ``distances``
    (``1 - score``, or the re-ranked distance), ``paths``, ``labels`` (``[Q][k]`` lists) and
    ``match`` (score >= the index's threshold; None without a threshold)."""

    ids: np.ndarray
    scores: np.ndarray
    distances: np.ndarray
    paths: list[list[str | None]]
    labels: list[list[str | None]]
    match: np.ndarray | None

    def records(self, names: Sequence[str]) -> list[dict[str, Any]]:
        """One JSON-ready dict per query: ``{"query", "neighbours": [{rank, id, path, label, score, distance[, match]}]}``."""
        out = []
        for qi, name in enumerate(names):
            rows = []
            for j in range(self.ids.shape[1]):
                if self.ids[qi, j] < 0:
                    continue
                row = {"rank": j + 1, "id": int(self.ids[qi, j]), "path": self.paths[qi][j],
                       "label": self.labels[qi][j], "score": float(self.scores[qi, j]),
                       "distance": float(self.distances[qi, j])}
                if self.match is not None:
                    row["match"] = bool(self.match[qi, j])
                rows.append(row)
            out.append({"query": str(name), "neighbours": rows})
        return out


class Index:
    """A gallery's embeddings in a faiss index (``flat`` exact; ``ivf`` or ``hnsw`` approximate)
    with each item's id, path and label, the fingerprint of the model that embedded them, and an
    optional match threshold on the cosine score.

    ``Index.build(embedder, images)`` embeds and indexes images with a
    :class:`dmlkit.inference.RunEmbedder`; ``Index.from_embeddings`` indexes vectors directly.
    ``add``, ``remove``, ``query``, ``save`` and ``load`` do what they say; ``query`` refuses an
    embedder whose fingerprint differs from the index's.

    ``ivf`` takes ``nlist`` (default about ``sqrt(N)``) and ``nprobe`` (default 32, at most
    ``nlist``); ``hnsw`` takes ``hnsw_m`` (default 20), ``ef_construction`` (64) and ``ef_search``
    (256). ``compressed`` (IVF + product quantisation, exact re-rank of a shortlist from float
    vectors on disk) takes ``nlist``, ``nprobe``, ``code_size`` (bytes per vector), ``pq_bits``,
    ``opq`` (None: measured) and ``shortlist``; None picks each from the first add's size
    (:mod:`dmlkit.index.compressed`). The parameters are stored in the index file, so an index
    loads with the ones it was built with.
    """

    def __init__(self, dim: int, kind: str = "flat", *, fingerprint: dict | None = None, run_dir: str | None = None,
                 nlist: int | None = None, nprobe: int | None = None, hnsw_m: int = HNSW_M,
                 ef_search: int = HNSW_EF_SEARCH, ef_construction: int = HNSW_EF_CONSTRUCTION,
                 code_size: int | None = None, pq_bits: int | None = None, opq: bool | None = None,
                 shortlist: int | None = None):
        from dmlkit.index import compressed

        if kind not in KINDS:
            raise InvalidParameterError(f"The 'kind' parameter of Index must be one of {KINDS}. Got {kind!r} instead.")
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise InvalidParameterError(f"The 'dim' parameter of Index must be an int >= 1. Got {dim!r} instead.")
        own = {"code_size": code_size, "pq_bits": pq_bits, "opq": opq, "shortlist": shortlist}
        if kind == "compressed":
            compressed.check_params(dim, **own)
        elif any(v is not None for v in own.values()):
            given = ", ".join(name for name, v in own.items() if v is not None)
            raise InvalidParameterError(f"The {given} parameter(s) of Index apply to kind 'compressed' only. "
                                        f"Got kind {kind!r}.")
        self.dim, self.kind = dim, kind
        self.fingerprint = dict(fingerprint) if fingerprint else None
        self.run_dir = run_dir
        self.threshold: float | None = None
        self.threshold_fmr: float | None = None
        self.params = {"nlist": nlist, "nprobe": nprobe, "hnsw_m": hnsw_m, "ef_search": ef_search,
                       "ef_construction": ef_construction}
        if kind == "compressed":
            self.params.update(own)
        self.store: compressed.FloatStore | None = None  # the compressed kind's float vectors on disk
        self.training: dict | None = None  # what training the compressed kind measured
        self.ids = np.zeros(0, dtype=np.int64)
        self.paths: list[str | None] = []
        self.labels: list[str | None] = []
        self.next_id = 0
        self.faiss_index = None  # built by the first add (IVF needs data to train)
        self.build_recall_at_10: float | None = None

    # ----- building ---------------------------------------------------------------------------
    def _new_faiss_index(self, train: np.ndarray):
        faiss = _faiss()
        p = self.params
        if self.kind == "flat":
            base = faiss.IndexFlatIP(self.dim)
        elif self.kind == "hnsw":
            base = faiss.IndexHNSWFlat(self.dim, int(p["hnsw_m"]), faiss.METRIC_INNER_PRODUCT)
            base.hnsw.efConstruction = int(p["ef_construction"])
            base.hnsw.efSearch = int(p["ef_search"])
        else:
            nlist = int(p["nlist"] or ivf_lists(len(train)))
            p["nlist"] = nlist
            p["nprobe"] = int(p["nprobe"] or max(1, min(nlist, 32)))
            quantizer = faiss.IndexFlatIP(self.dim)
            base = faiss.IndexIVFFlat(quantizer, self.dim, nlist, faiss.METRIC_INNER_PRODUCT)
            sample = train
            if len(train) > 64 * nlist:  # k-means on a seeded sample, as faiss would subsample
                rows = np.random.default_rng(0).choice(len(train), 64 * nlist, replace=False)
                sample = train[np.sort(rows)]
            base.train(sample)
            base.nprobe = p["nprobe"]
            base.set_direct_map_type(faiss.DirectMap.Hashtable)  # reconstruct and remove by id
            return base  # IVF lists hold the ids themselves
        return faiss.IndexIDMap2(base)  # ids for flat and HNSW; the wrapper keeps a reference to base

    @classmethod
    def from_embeddings(cls, embeddings, *, labels: Sequence[str | None] | None = None,
                        paths: Sequence[str | None] | None = None, kind: str = "flat", measure_recall: bool = True,
                        **options) -> "Index":
        """An index over ``embeddings [N, D]`` (ids 0..N-1); approximate kinds measure recall@10.
        The compressed kind reads ``embeddings`` in chunks (a memory-mapped array stays on disk)."""
        vectors = embeddings if kind == "compressed" and isinstance(embeddings, np.ndarray) else _unit_rows(embeddings)
        if vectors.ndim != 2:
            raise DataError(f"embeddings must be [N, D]. Got shape {vectors.shape}.")
        index = cls(vectors.shape[1], kind, **options)
        index.add_embeddings(vectors, labels=labels, paths=paths)
        if kind != "flat" and measure_recall:
            index.build_recall_at_10 = index.recall_at_10(vectors)
        return index

    @classmethod
    def build(cls, embedder, images, *, labels: Sequence[str | None] | None = None, kind: str = "flat",
              **options) -> "Index":
        """Embed ``images`` (paths, PIL images or a pixel tensor) with a :class:`RunEmbedder` and index them."""
        emb = embedder.embed(images)
        run_dir = getattr(embedder, "run_dir", None)
        return cls.from_embeddings(emb, labels=labels, paths=_paths_of(images), kind=kind, fingerprint=embedder.fingerprint,
                                   run_dir=None if run_dir is None else str(run_dir), **options)

    def add_embeddings(self, embeddings, *, labels=None, paths=None) -> np.ndarray:
        """Add ``embeddings [n, D]``; returns the new items' ids (consecutive, never reused)."""
        if self.kind == "compressed":
            return self._add_compressed(embeddings, labels, paths)
        vectors = _unit_rows(embeddings)
        n = vectors.shape[0]
        if vectors.shape[1] != self.dim:
            raise DataError(f"embeddings have size {vectors.shape[1]} but the index holds size {self.dim}.")
        labels = [None] * n if labels is None else [None if v is None else str(v) for v in labels]
        paths = [None] * n if paths is None else [None if v is None else str(v) for v in paths]
        if len(labels) != n or len(paths) != n:
            raise DataError(f"embeddings has {n} rows but labels has {len(labels)} and paths {len(paths)}.")
        if self.faiss_index is None:
            if n == 0:
                return np.zeros(0, dtype=np.int64)
            self.faiss_index = self._new_faiss_index(vectors)
        ids = np.arange(self.next_id, self.next_id + n, dtype=np.int64)
        self.faiss_index.add_with_ids(vectors, ids)
        self.ids = np.concatenate([self.ids, ids])
        self.paths += paths
        self.labels += labels
        self.next_id += n
        return ids

    def _add_compressed(self, embeddings, labels, paths) -> np.ndarray:
        """The compressed kind's add: chunk by chunk, normalised rows go to the float file and their
        codes to faiss, so a memory-mapped gallery is never loaded whole."""
        from dmlkit.index import compressed

        vectors = embeddings if isinstance(embeddings, np.ndarray) else _unit_rows(embeddings)
        if vectors.ndim != 2 or vectors.shape[1] != self.dim:
            raise DataError(f"embeddings must be [N, {self.dim}] (the index's size). Got shape {vectors.shape}.")
        n = vectors.shape[0]
        labels = [None] * n if labels is None else [None if v is None else str(v) for v in labels]
        paths = [None] * n if paths is None else [None if v is None else str(v) for v in paths]
        if len(labels) != n or len(paths) != n:
            raise DataError(f"embeddings has {n} rows but labels has {len(labels)} and paths {len(paths)}.")
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        for start in range(0, n, compressed.ADD_CHUNK):  # every row checked before anything changes
            if not np.isfinite(vectors[start:start + compressed.ADD_CHUNK]).all():
                raise DataError("embeddings contain NaN or infinite values.")
        if self.faiss_index is None:
            self.faiss_index, self.training = compressed.new_compressed_index(vectors, self.params, _unit_rows)
        if self.store is None:
            self.store = compressed.FloatStore(self.dim)
        ids = np.arange(self.next_id, self.next_id + n, dtype=np.int64)
        for start in range(0, n, compressed.ADD_CHUNK):
            chunk = _unit_rows(vectors[start:start + compressed.ADD_CHUNK])
            self.store.append(chunk)  # row = id
            self.faiss_index.add_with_ids(chunk, ids[start:start + len(chunk)])
        self.ids = np.concatenate([self.ids, ids])
        self.paths += paths
        self.labels += labels
        self.next_id += n
        return ids

    def add(self, embedder, images, *, labels: Sequence[str | None] | None = None) -> np.ndarray:
        """Embed and add ``images``; the embedder must be the index's model. Returns the new ids."""
        self.check_model(embedder)
        return self.add_embeddings(embedder.embed(images), labels=labels, paths=_paths_of(images))

    def remove(self, ids: Sequence[int]) -> int:
        """Remove the items with these ids (unknown ids are ignored); returns how many were removed."""
        faiss = _faiss()
        ids = np.unique(np.asarray(list(ids), dtype=np.int64))
        keep = ~np.isin(self.ids, ids)
        removed = int((~keep).sum())
        if removed == 0:
            return 0
        if self.kind == "hnsw":  # HNSW graphs cannot drop nodes: rebuild from the kept vectors
            vectors = self.vectors()[keep]
            self.faiss_index = self._new_faiss_index(vectors)
            if len(vectors):
                self.faiss_index.add_with_ids(vectors, self.ids[keep])
        else:
            self.faiss_index.remove_ids(faiss.IDSelectorArray(ids) if self.kind == "ivf" else faiss.IDSelectorBatch(ids))
        self.ids = self.ids[keep]
        self.paths = [p for p, k in zip(self.paths, keep) if k]
        self.labels = [v for v, k in zip(self.labels, keep) if k]
        return removed

    def __len__(self) -> int:
        return len(self.ids)

    def vectors(self) -> np.ndarray:
        """The indexed unit vectors ``[N, D]`` in the order of ``self.ids``."""
        if len(self.ids) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        if self.kind == "compressed":  # the float rows from disk: all of them are read into memory
            return self.store.rows_of(self.ids)
        return np.asarray(self.faiss_index.reconstruct_batch(self.ids), dtype=np.float32).reshape(-1, self.dim)

    # ----- thresholds -------------------------------------------------------------------------
    def _label_codes(self, what: str, *, every: bool = True) -> tuple[list[str], np.ndarray]:
        """Sorted label names and each item's code ``[N]`` (-1: unlabelled); ``every``: all items must be
        labelled for ``what``, else at least one."""
        labelled = np.array([v is not None for v in self.labels], dtype=bool)
        if not labelled.all() if every else not labelled.any():
            raise DataError(f"{what} needs {'every' if every else 'a'} gallery item labelled "
                            "(give --images a <class>/<image> folder or a CSV with a label column).")
        names = sorted({v for v in self.labels if v is not None})
        number = {name: i for i, name in enumerate(names)}
        return names, np.array([number.get(v, -1) for v in self.labels], dtype=np.int64)

    def threshold_at_fmr(self, fmr: float) -> float:
        """The cosine threshold whose false match rate on the labelled gallery's pairs is ``fmr``
        (:func:`dmlkit.evaluation.verification.threshold_at_fmr`)."""
        from dmlkit.evaluation.verification import threshold_at_fmr

        _, codes = self._label_codes("a threshold at a false match rate")
        return float(threshold_at_fmr(torch.from_numpy(self.vectors()), torch.from_numpy(codes), fmr))

    def set_threshold_at_fmr(self, fmr: float) -> float:
        """Store :meth:`threshold_at_fmr` as the index's match threshold; returns it."""
        self.threshold = self.threshold_at_fmr(fmr)
        self.threshold_fmr = float(fmr)
        return self.threshold

    # ----- querying ---------------------------------------------------------------------------
    def check_model(self, embedder) -> None:
        """Refuse an embedder whose fingerprint (config and weights) is not the index's."""
        if self.fingerprint is not None and dict(embedder.fingerprint) != self.fingerprint:
            raise ConfigError(
                f"the model does not match the index: the index was built with model {self.fingerprint} "
                f"(run {self.run_dir}), the query model is {dict(embedder.fingerprint)}. Query with the run that "
                "built the index, or build a new index."
            )

    def query(self, embedder, images, k: int = 10, **rerank) -> QueryResult:
        """The ``k`` nearest gallery items of each image; see :meth:`query_embeddings` for re-ranking."""
        self.check_model(embedder)
        return self.query_embeddings(embedder.embed(images), k, **rerank)

    def query_embeddings(self, queries, k: int = 10, *, query_expansion: int = 0, database_augmentation: int = 0,
                         alpha: float = 3.0, k_reciprocal: bool = False, k1: int = 20, k2: int = 6,
                         lambda_value: float = 0.3) -> QueryResult:
        """Nearest items of ``queries [Q, D]``, best first.

        Without re-ranking the faiss index answers. ``query_expansion=n`` (alpha-QE),
        ``database_augmentation=n`` (DBA) and ``k_reciprocal`` (Zhong et al.) re-rank exactly
        against the whole gallery in memory (see :mod:`dmlkit.index.rerank`).
        """
        from dmlkit.core.validation import Interval, validate_params
        from dmlkit.index import rerank as rr

        validate_params("Index.query", {"k": k, "query_expansion": query_expansion,
                                        "database_augmentation": database_augmentation, "alpha": alpha},
                        {"k": [Interval(int, 1, None)], "query_expansion": [Interval(int, 0, None)],
                         "database_augmentation": [Interval(int, 0, None)],
                         "alpha": [Interval(float, 0, math.inf, closed="left")]})
        q = _unit_rows(queries)
        if q.shape[1] != self.dim:
            raise DataError(f"query embeddings have size {q.shape[1]} but the index holds size {self.dim}.")
        n = len(self)
        kk = min(k, n)
        if kk == 0:
            raise DataError("the index is empty.")
        if not (query_expansion or database_augmentation or k_reciprocal):
            scores, ids = self._search(q, kk)
            distances = np.maximum(1 - scores, 0)
            rows = _rows_of(self.ids, ids)
        else:
            gallery = torch.from_numpy(self.vectors())
            query_t = torch.from_numpy(q)
            if database_augmentation:
                gallery = rr.database_augmentation(gallery, database_augmentation, alpha)
            if query_expansion:
                query_t = rr.alpha_query_expansion(query_t, gallery, query_expansion, alpha)
            if k_reciprocal:
                dist = rr.k_reciprocal_distance(query_t, gallery, k1, k2, lambda_value)
            else:
                dist = (1 - query_t @ gallery.T).clamp_min(0)
            order = torch.sort(dist, dim=1, stable=True).indices[:, :kk]
            rows = order.numpy()
            distances = torch.gather(dist, 1, order).numpy()
            original = torch.from_numpy(q) @ torch.from_numpy(self.vectors()).T
            scores = torch.gather(original, 1, order).numpy()
            ids = self.ids[rows]
        valid = rows >= 0
        paths = [[self.paths[r] if r >= 0 else None for r in row] for row in rows]
        labels = [[self.labels[r] if r >= 0 else None for r in row] for row in rows]
        match = None if self.threshold is None else (scores >= self.threshold) & valid
        return QueryResult(np.where(valid, ids, -1), scores.astype(np.float32), distances.astype(np.float32),
                           paths, labels, match)

    def _search(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """faiss's ``k`` nearest ids of unit queries ``q``; the compressed kind re-ranks its shortlist exactly."""
        if self.kind != "compressed":
            return self.faiss_index.search(q, k)
        from dmlkit.index.compressed import rerank

        _, candidates = self.faiss_index.search(q, max(k, int(self.params["shortlist"])))
        return rerank(q, candidates, self.store, k)

    # ----- classifying ------------------------------------------------------------------------
    def classify(self, embedder, images, k: int = 5, *, fmr: float | None = None,
                 threshold: float | None = None) -> "Classification":
        """Predicted label of each image by its ``k`` nearest gallery items; see :meth:`classify_embeddings`."""
        self.check_model(embedder)
        return self.classify_embeddings(embedder.embed(images), k, fmr=fmr, threshold=threshold)

    def classify_embeddings(self, queries, k: int = 5, *, fmr: float | None = None,
                            threshold: float | None = None) -> "Classification":
        """A distance-weighted vote of the ``k`` nearest gallery items of ``queries [Q, D]``
        (:mod:`dmlkit.index.classify`; unlabelled items do not vote), with its confidence; a query with
        no labelled neighbour at or above the cosine threshold is unknown (label None). The threshold is
        ``threshold``, else the one at false match rate ``fmr`` on the gallery's pairs (not stored), else
        the index's own (``--threshold-fmr`` at build), else none."""
        from dmlkit.core.validation import NONE, Interval, validate_params
        from dmlkit.index.classify import vote

        validate_params("Index.classify", {"k": k, "fmr": fmr, "threshold": threshold},
                        {"k": [Interval(int, 1, None)], "fmr": [Interval(float, 0, 1, closed="neither"), NONE],
                         "threshold": [Interval(float, -1, 1), NONE]})
        if fmr is not None and threshold is not None:
            raise InvalidParameterError("Index.classify takes either 'fmr' or 'threshold', not both.")
        names, codes = self._label_codes("classifying", every=False)
        if fmr is not None:
            threshold = self.threshold_at_fmr(fmr)
        elif threshold is None:
            threshold = self.threshold
        found = self.query_embeddings(queries, k)
        rows = _rows_of(self.ids, found.ids)
        scores = np.where(rows >= 0, found.scores, -np.inf)  # fewer than k items found (IVF)
        return vote(scores, np.where(rows >= 0, codes[np.maximum(rows, 0)], -1), names, threshold)

    def recall_at_10(self, queries: np.ndarray, sample: int = RECALL_SAMPLE) -> float:
        """Mean fraction of the exact 10 nearest items (flat inner product) that this index returns,
        over up to ``sample`` seeded rows of ``queries``."""
        faiss = _faiss()
        if len(queries) > sample:
            queries = queries[np.sort(np.random.default_rng(0).choice(len(queries), sample, replace=False))]
        q = _unit_rows(queries)
        k = min(10, len(self))
        if self.kind == "compressed":  # exact search over the float file, a chunk at a time
            from dmlkit.index.compressed import exact_top_k

            truth = _rows_of(self.ids, exact_top_k(q, self.store.array, k, ids=self.ids)[1])
        else:
            exact = faiss.IndexFlatIP(self.dim)
            exact.add(self.vectors())
            _, truth = exact.search(q, k)
        _, found = self._search(q, k)
        found_rows = _rows_of(self.ids, found)
        hits = [len(set(t.tolist()) & set(f.tolist())) for t, f in zip(truth, found_rows)]
        return float(np.mean(hits) / k)

    # ----- files ------------------------------------------------------------------------------
    def header(self) -> dict[str, Any]:
        return {"format": FORMAT, "dim": self.dim, "kind": self.kind, "fingerprint": self.fingerprint,
                "run_dir": self.run_dir, "threshold": self.threshold, "threshold_fmr": self.threshold_fmr,
                "params": self.params, "next_id": self.next_id, "build_recall_at_10": self.build_recall_at_10,
                **({"training": self.training} if self.kind == "compressed" else {})}

    def save(self, path: str | os.PathLike) -> Path:
        """Write the index to one file atomically (temp file + rename); returns the path."""
        from dmlkit.engine.checkpoint_files import atomic_write_bytes

        faiss = _faiss()
        path = Path(path)
        if self.store is not None:  # the float file first: the index file that points at it is renamed last
            from dmlkit.index.compressed import vectors_path

            self.store.save_as(vectors_path(path))
        buf = io.BytesIO()
        np.savez(
            buf,
            header=np.asarray(json.dumps(self.header())),
            faiss=faiss.serialize_index(self.faiss_index) if self.faiss_index is not None else np.zeros(0, np.uint8),
            ids=self.ids,
            paths=np.asarray(["" if p is None else p for p in self.paths], dtype=str),
            has_path=np.asarray([p is not None for p in self.paths], dtype=bool),
            labels=np.asarray(["" if v is None else v for v in self.labels], dtype=str),
            has_label=np.asarray([v is not None for v in self.labels], dtype=bool),
        )
        atomic_write_bytes(path, buf.getvalue())
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Index":
        """Read an index written by :meth:`save` (a DataError names a missing or unreadable file)."""
        from dmlkit.data._files import read_npz

        faiss = _faiss()
        data = read_npz(path, "index file")
        where = f"index file {str(path)!r}"
        missing = [key for key in INDEX_ARRAYS if key not in data]
        if missing:
            raise DataError(f"{where} is not a dmlkit index file: it has no {', '.join(missing)} array(s).")
        try:
            header = json.loads(str(data["header"]))
        except ValueError as exc:
            raise DataError(f"{where} is not a dmlkit index file: its header is not JSON ({exc}).") from None
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            found = header.get("format") if isinstance(header, dict) else type(header).__name__
            raise DataError(f"{where} is not a dmlkit index file (format {found!r}, expected {FORMAT!r}).")
        try:
            p = dict(header["params"])
            index = cls(header["dim"], header["kind"], fingerprint=header["fingerprint"], run_dir=header["run_dir"], **p)
            index.threshold, index.threshold_fmr = header["threshold"], header["threshold_fmr"]
            index.next_id, index.build_recall_at_10 = int(header["next_id"]), header["build_recall_at_10"]
        except (KeyError, TypeError, ValueError) as exc:  # InvalidParameterError is a ValueError
            raise DataError(f"{where} has a damaged header ({type(exc).__name__}: {str(exc)[:200]}).") from None
        ids = data["ids"]
        lengths = {key: len(data[key]) if data[key].ndim == 1 else -1
                   for key in ("ids", "paths", "has_path", "labels", "has_label")}
        if ids.dtype.kind not in "iu" or len(set(lengths.values())) != 1 or data["faiss"].dtype != np.uint8:
            raise DataError(f"{where} is damaged: its arrays do not describe the same items "
                            f"({', '.join(f'{k} {v}' for k, v in lengths.items())}; ids {ids.dtype}).")
        index.ids = ids.astype(np.int64)
        index.paths = [str(v) if ok else None for v, ok in zip(data["paths"].tolist(), data["has_path"].tolist())]
        index.labels = [str(v) if ok else None for v, ok in zip(data["labels"].tolist(), data["has_label"].tolist())]
        if len(index.ids) and (np.any(np.diff(index.ids) <= 0) or index.ids[-1] >= index.next_id):
            raise DataError(f"{where} is damaged: its ids are not increasing below next_id={index.next_id}.")
        if data["faiss"].size:
            try:
                index.faiss_index = faiss.deserialize_index(data["faiss"])
            except Exception as exc:  # faiss raises RuntimeError on a payload cut short or corrupted
                raise DataError(f"{where} is damaged: its faiss index cannot be read "
                                f"({str(exc).strip().splitlines()[-1][:200] if str(exc).strip() else exc!r}).") from None
            if index.faiss_index.ntotal != len(index.ids) or index.faiss_index.d != index.dim:
                raise DataError(f"{where} is damaged: its faiss index holds {index.faiss_index.ntotal} vectors of size "
                                f"{index.faiss_index.d} but the file lists {len(index.ids)} items of size {index.dim}.")
            if index.kind == "hnsw":
                faiss.downcast_index(index.faiss_index.index).hnsw.efSearch = int(p["ef_search"])
            elif index.kind == "ivf":
                index.faiss_index.nprobe = int(p["nprobe"])
            elif index.kind == "compressed":
                from dmlkit.index.compressed import FloatStore, set_nprobe, vectors_path

                set_nprobe(index.faiss_index, p["nprobe"])
                index.training = header.get("training")
                index.store = FloatStore.open(vectors_path(path), index.dim, index.next_id, where)
        elif len(index.ids):
            raise DataError(f"{where} is damaged: it lists {len(index.ids)} items but holds no vectors.")
        return index


def _rows_of(ids: np.ndarray, found: np.ndarray) -> np.ndarray:
    """Positions in ``ids`` (sorted ascending: ids only grow) of the faiss result ids ``found`` (-1 stays -1)."""
    rows = np.searchsorted(ids, np.maximum(found, 0))
    return np.where(found >= 0, rows, -1)


def _paths_of(images) -> list[str | None]:
    """The path of each image given as a file (None for PIL images and tensors)."""
    if isinstance(images, (str, os.PathLike)):
        return [str(images)]
    if isinstance(images, torch.Tensor):
        return [None] * (1 if images.dim() == 3 else images.shape[0])
    return [str(x) if isinstance(x, (str, os.PathLike)) else None for x in images]


def gallery_images(source: str | os.PathLike) -> tuple[list[str], list[str | None]]:
    """Image paths and labels from a folder (``<class>/<image>``: the label is the sub-folder's name;
    images directly in the folder are unlabelled; searched recursively, sorted) or from a CSV file
    with a ``path`` column and an optional ``label`` column (paths relative to the CSV's folder)."""
    import csv

    from dmlkit.data.folder import IMAGE_EXTENSIONS

    root = Path(source)
    if root.is_dir():
        files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
        if not files:
            raise DataError(f"no images ({', '.join(IMAGE_EXTENSIONS)}) under {str(root)!r}.")
        labels = [None if f.parent == root else f.parent.relative_to(root).as_posix() for f in files]
        return [str(f) for f in files], labels
    if root.is_file() and root.suffix.lower() == ".csv":
        with open(root, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        if not rows or "path" not in rows[0]:
            raise DataError(f"{str(root)!r} must be a CSV file with a header 'path' or 'path,label' and one row per image.")
        paths = [str((root.parent / r["path"]).resolve()) if not os.path.isabs(r["path"]) else r["path"] for r in rows]
        return paths, [r.get("label") or None for r in rows]
    if root.is_file():
        return [str(root)], [None]
    raise DataError(f"--images {str(root)!r} is neither a folder of images nor a CSV file nor an image file.")
