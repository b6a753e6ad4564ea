"""The ``compressed`` index kind: IVF lists of product-quantised codes, then an exact re-rank.

Each vector is stored as ``code_size`` bytes of PQ codes (Jegou et al., TPAMI 2011, Sec. IV: IVFADC),
optionally after an OPQ rotation (Ge et al., CVPR 2013) when a measurement on the gallery says it
lowers the quantisation error. A query scans the ``nprobe`` nearest of ``nlist`` lists with the
asymmetric distance, keeps a ``shortlist`` of candidates and re-ranks them by their exact cosine
similarity, reading only those rows of the float vectors from a file on disk (memory-mapped), so
the memory an index holds grows with its codes, not with its floats.

The float file is raw float32, one row per item id (ids are consecutive and never reused, so row =
id); it only grows: a removed item's row stays in the file and is never read again.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
import weakref
from pathlib import Path

import numpy as np

from dmlkit.exceptions import DataError, InvalidParameterError

log = logging.getLogger(__name__)

#: The file beside an index file that holds the compressed kind's float vectors.
VECTORS_SUFFIX = ".vectors"
#: Fewest vectors the first add of a compressed index trains on: twice the smallest PQ codebook (4 bits, 16 entries).
MIN_TRAIN = 32
#: Largest default code size in bytes per vector (64 bytes = 64 MB per million vectors).
MAX_DEFAULT_CODE_SIZE = 64
#: OPQ is kept when it lowers the PQ reconstruction error of held-out gallery vectors by at least this fraction.
OPQ_GAIN = 0.05
#: Vectors the OPQ measurement trains and tests on (at most), the fewest it needs (smaller first adds get
#: no OPQ by default), and its rotation's training iterations (a measurement, not the final rotation).
OPQ_SAMPLE, OPQ_MIN_SAMPLE, OPQ_MEASURE_ITERATIONS = 12_000, 12_000, 10
#: Training iterations of the index's own OPQ rotation (faiss's default is 50; most of the gain comes early).
OPQ_ITERATIONS = 25
#: Rows encoded (and written to the float file) per step of a large add.
ADD_CHUNK = 262_144
#: Queries re-ranked per step: their shortlists' float rows are read together.
RERANK_CHUNK = 256


def default_nlist(n: int) -> int:
    """Inverted lists for ``n`` vectors: about ``sqrt(n)``, at least 39 training points each (as the ivf kind)."""
    return max(1, min(int(round(math.sqrt(n))), n // 39))


def default_code_size(dim: int) -> int:
    """Bytes per vector: the largest divisor of ``dim`` not above ``min(64, dim / 4)`` (32 for 128-d):
    PQ sub-vectors of at least 4 dimensions, 8-bit codes."""
    cap = max(1, min(MAX_DEFAULT_CODE_SIZE, dim // 4))
    return max(m for m in range(1, cap + 1) if dim % m == 0)


def default_pq_bits(n: int) -> int:
    """Bits per PQ code: 8 (256 centroids per sub-quantiser) once there are 39 training vectors per
    centroid, fewer for a small first gallery (at least 4)."""
    return int(min(8, max(4, math.floor(math.log2(max(n, 1) / 39)) if n >= 39 else 4)))


def default_nprobe(nlist: int) -> int:
    """Lists scanned per query: 32, or nlist / 64 when that is more (large galleries), at most ``nlist``."""
    return max(1, min(nlist, max(32, nlist // 64)))


def default_shortlist(n: int) -> int:
    """Candidates re-ranked exactly per query: one per 10,000 vectors, at least 100 and at most 2,000 (more
    items share each neighbourhood as the gallery grows, and the PQ order inside one is noise: at 10M a
    shortlist of 200 kept recall@10 at 0.60, 1,000 at 0.9997)."""
    return int(min(2_000, max(100, math.ceil(n / 10_000))))


def check_params(dim: int, code_size, pq_bits, opq, shortlist) -> None:
    """Up-front checks of the compressed kind's own parameters (None = chosen at the first add)."""
    from dmlkit.core.validation import BOOL, NONE, Interval, validate_params

    validate_params("Index", {"code_size": code_size, "pq_bits": pq_bits, "opq": opq, "shortlist": shortlist},
                    {"code_size": [Interval(int, 1, dim), NONE], "pq_bits": [Interval(int, 4, 8), NONE],
                     "opq": [BOOL, NONE], "shortlist": [Interval(int, 1, None), NONE]})
    if code_size is not None and dim % code_size:
        divisors = [m for m in range(1, dim + 1) if dim % m == 0 and m >= 4]
        raise InvalidParameterError(
            f"The 'code_size' parameter of Index must divide the embedding size {dim} (one PQ sub-quantiser per "
            f"byte). Got {code_size} instead; try one of {divisors[:8]}.")


def _sample(vectors, rows: int, seed: int = 0) -> np.ndarray:
    """Up to ``rows`` seeded rows of ``vectors`` (sorted, so a memory-mapped array is read in order)."""
    if len(vectors) <= rows:
        return np.asarray(vectors)
    return np.asarray(vectors[np.sort(np.random.default_rng(seed).choice(len(vectors), rows, replace=False))])


def opq_gain(sample: np.ndarray, code_size: int, pq_bits: int) -> dict:
    """PQ reconstruction error (mean squared, held-out quarter of ``sample``) with and without an OPQ
    rotation, and whether OPQ is kept (error at least :data:`OPQ_GAIN` lower)."""
    import faiss

    split = len(sample) * 3 // 4
    fit, test = np.ascontiguousarray(sample[:split]), np.ascontiguousarray(sample[split:])
    errors = {}
    for name in ("pq", "opq"):
        if name == "opq":
            rotation = faiss.OPQMatrix(sample.shape[1], code_size)
            rotation.niter = OPQ_MEASURE_ITERATIONS
            rotation.train(fit)
            fit_t, test_t = rotation.apply(fit), rotation.apply(test)  # orthonormal: errors compare as they are
        else:
            fit_t, test_t = fit, test
        pq = faiss.ProductQuantizer(sample.shape[1], code_size, pq_bits)
        pq.train(fit_t)
        errors[name] = float(((pq.decode(pq.compute_codes(test_t)) - test_t) ** 2).sum(1).mean())
    return {"pq_error": errors["pq"], "opq_error": errors["opq"],
            "opq": errors["opq"] <= (1 - OPQ_GAIN) * errors["pq"]}


def new_compressed_index(vectors, params: dict, unit_rows) -> tuple[object, dict]:
    """A trained faiss ``[OPQ,]IVF,PQ`` index (inner product) for the gallery ``vectors [N, D]`` (a first
    add; rows normalised by ``unit_rows``), filling the defaults left as None in ``params``; returns it
    with what training measured (the factory string, the OPQ measurement)."""
    import faiss

    n, dim = len(vectors), vectors.shape[1]
    if n < MIN_TRAIN:
        raise DataError(f"the compressed index kind trains its quantisers on the first vectors added and needs at "
                        f"least {MIN_TRAIN} of them. Got {n}; use kind 'flat' for a gallery this small.")
    p = params
    p["nlist"] = int(p["nlist"] or default_nlist(n))
    p["nprobe"] = int(p["nprobe"] or default_nprobe(p["nlist"]))
    p["code_size"] = int(p["code_size"] or default_code_size(dim))
    p["pq_bits"] = int(p["pq_bits"] or default_pq_bits(n))
    p["shortlist"] = int(p["shortlist"] or default_shortlist(n))
    if p["nlist"] > n:
        raise InvalidParameterError(f"The 'nlist' parameter of Index must be at most the number of vectors of the first "
                                    f"add ({n}): each list needs vectors to train on. Got {p['nlist']} instead.")
    if p["nprobe"] > p["nlist"]:
        raise InvalidParameterError(f"The 'nprobe' parameter of Index must be at most nlist={p['nlist']}. "
                                    f"Got {p['nprobe']} instead.")
    train = unit_rows(_sample(vectors, min(n, max(32 * p["nlist"], 64 * 2 ** p["pq_bits"]))))
    training: dict = {}
    if p["opq"] is None:  # measured on the gallery itself, not assumed
        if len(train) >= OPQ_MIN_SAMPLE:
            training = opq_gain(train[:OPQ_SAMPLE], p["code_size"], p["pq_bits"])
            p["opq"] = bool(training["opq"])
        else:
            p["opq"] = False
            training = {"opq": False, "reason": f"fewer than {OPQ_MIN_SAMPLE} vectors to measure OPQ on"}
    # "np": no polysemous training (code reordering for Hamming filtering, unused here and slow to train)
    factory = f"{'OPQ%d,' % p['code_size'] if p['opq'] else ''}IVF{p['nlist']},PQ{p['code_size']}x{p['pq_bits']}np"
    index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    if p["opq"]:
        faiss.downcast_VectorTransform(index.chain.at(0)).niter = OPQ_ITERATIONS
    try:
        index.train(train)
    except RuntimeError as exc:  # faiss refuses too few training vectors for its codebooks
        raise DataError(f"the compressed index ({factory}) cannot train on {len(train)} vectors: "
                        f"{str(exc).strip().splitlines()[-1][:200]}") from None
    set_nprobe(index, p["nprobe"])
    training["factory"] = factory
    training["train_vectors"] = len(train)
    log.info("compressed index %s trained on %d vectors (%s)", factory, len(train), training)
    return index, training


def set_nprobe(index, nprobe: int) -> None:
    """Lists scanned per query of a (possibly OPQ-wrapped) IVF index."""
    import faiss

    faiss.extract_index_ivf(index).nprobe = int(nprobe)


class FloatStore:
    """The gallery's float32 vectors in one raw file, row ``i`` = item id ``i``, read memory-mapped.

    A store without a path writes to a temporary file until the index is saved. Rows past ``rows``
    (left by an add that was interrupted before its index was saved) are cut off by the next append.
    """

    def __init__(self, dim: int, path: str | os.PathLike | None = None, rows: int = 0):
        self.dim, self.rows = dim, rows
        self.temporary = path is None
        if path is None:
            fd, path = tempfile.mkstemp(prefix="dmlkit-vectors-", suffix=VECTORS_SUFFIX)
            os.close(fd)
            self._cleanup = weakref.finalize(self, _unlink_quietly, path)
        self.path = Path(path)
        self._array: np.memmap | None = None

    @classmethod
    def open(cls, path: str | os.PathLike, dim: int, rows: int, where: str) -> "FloatStore":
        """The saved store ``path`` of an index file; a DataError when it is missing or too short."""
        path = Path(path)
        need = rows * dim * 4
        if not path.is_file():
            raise DataError(f"{where} keeps its float vectors in {str(path)!r}, which does not exist: copy or move "
                            f"the two files together.")
        if path.stat().st_size < need:
            raise DataError(f"{where} is damaged: its vectors file {str(path)!r} holds {path.stat().st_size:,} bytes, "
                            f"fewer than the {need:,} of its {rows} rows.")
        return cls(dim, path, rows)

    @property
    def array(self) -> np.ndarray:
        """``[rows, D]`` float32, memory-mapped read-only (pages are read on demand, not loaded)."""
        if self.rows == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        if self._array is None or self._array.shape[0] != self.rows:
            self._array = np.memmap(self.path, dtype=np.float32, mode="r", shape=(self.rows, self.dim))
        return self._array

    def append(self, unit_vectors: np.ndarray) -> None:
        """Write rows ``[n, D]`` (float32, normalised) after the first ``rows`` rows."""
        from dmlkit.engine.checkpoint_files import raise_if_out_of_space

        data = np.ascontiguousarray(unit_vectors, dtype=np.float32)
        try:
            with open(self.path, "r+b") as f:
                f.truncate(self.rows * self.dim * 4)  # drop rows an interrupted add left behind
                f.seek(0, os.SEEK_END)
                f.write(data.tobytes())
        except OSError as err:
            raise_if_out_of_space(err, self.path, data.nbytes)
            raise
        self.rows += len(data)
        self._array = None

    def save_as(self, target: Path) -> None:
        """Make ``target`` hold this store's rows (moved from a temporary file, else copied then renamed)
        and read from it from now on; nothing to do when it is the file already."""
        from dmlkit.engine.checkpoint_files import raise_if_out_of_space

        if target.exists() and os.path.samefile(target, self.path):
            with open(self.path, "r+b") as f:
                os.fsync(f.fileno())
            return
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        os.close(fd)
        try:
            if self.temporary:
                shutil.move(self.path, tmp)  # a rename on the same file system
            else:
                shutil.copyfile(self.path, tmp)
            with open(tmp, "r+b") as f:
                f.truncate(self.rows * self.dim * 4)
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException as err:
            if os.path.exists(tmp):
                os.unlink(tmp)
            if isinstance(err, OSError):
                raise_if_out_of_space(err, target, self.rows * self.dim * 4)
            raise
        if self.temporary:
            self._cleanup.detach()
            self.temporary = False
        self.path, self._array = target, None

    def rows_of(self, ids: np.ndarray) -> np.ndarray:
        """The float rows of item ``ids`` ``[n]`` as ``[n, D]`` (only those rows are read)."""
        return np.asarray(self.array[ids], dtype=np.float32)


def _unlink_quietly(path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def vectors_path(index_path: str | os.PathLike) -> Path:
    """The float vectors file beside an index file: ``<index>.vectors``."""
    index_path = Path(index_path)
    return index_path.with_name(index_path.name + VECTORS_SUFFIX)


def rerank(queries: np.ndarray, candidates: np.ndarray, store: FloatStore, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact cosine scores of each query's candidate ids ``[Q, S]`` (-1: none) from the float rows, best
    ``k`` first: ``(scores [Q, k], ids [Q, k])``, missing entries as ``-inf`` / -1."""
    q_count = len(queries)
    scores = np.full((q_count, k), -np.inf, dtype=np.float32)
    ids = np.full((q_count, k), -1, dtype=np.int64)
    for start in range(0, q_count, RERANK_CHUNK):
        cand = candidates[start:start + RERANK_CHUNK]
        unique, where = np.unique(np.maximum(cand, 0), return_inverse=True)  # each row read once, in file order
        rows = store.rows_of(unique)
        s = np.einsum("qsd,qd->qs", rows[where.reshape(cand.shape)], queries[start:start + RERANK_CHUNK])
        s = np.where(cand >= 0, s, -np.inf).astype(np.float32)
        order = np.argsort(-s, axis=1, kind="stable")[:, :k]
        top = np.take_along_axis(s, order, 1)
        scores[start:start + len(cand), :order.shape[1]] = top
        ids[start:start + len(cand), :order.shape[1]] = np.where(np.isfinite(top), np.take_along_axis(cand, order, 1), -1)
    return scores, ids


def exact_top_k(queries: np.ndarray, gallery, k: int, ids: np.ndarray | None = None,
                chunk: int = ADD_CHUNK) -> tuple[np.ndarray, np.ndarray]:
    """Exact inner-product ``k`` nearest rows of ``gallery [N, D]`` (may be memory-mapped; read ``chunk``
    rows at a time, or only rows ``ids`` when given) for ``queries [Q, D]``: ``(scores, rows)``, rows
    numbered as in ``gallery`` (``ids`` values when given)."""
    import faiss

    rows_total = len(gallery) if ids is None else len(ids)
    heap = faiss.ResultHeap(len(queries), k, keep_max=True)
    for start in range(0, rows_total, chunk):
        if ids is None:
            block, numbers = np.asarray(gallery[start:start + chunk], dtype=np.float32), None
        else:
            numbers = ids[start:start + chunk]
            block = np.asarray(gallery[numbers], dtype=np.float32)
        flat = faiss.IndexFlatIP(gallery.shape[1])
        flat.add(np.ascontiguousarray(block))
        s, i = flat.search(queries, min(k, len(block)))
        if s.shape[1] < k:
            s = np.pad(s, ((0, 0), (0, k - s.shape[1])), constant_values=-np.inf)
            i = np.pad(i, ((0, 0), (0, k - i.shape[1])), constant_values=-1)
        found = np.where(i >= 0, (i + start) if numbers is None else numbers[np.maximum(i, 0)], -1)
        heap.add_result(np.ascontiguousarray(s, dtype=np.float32), np.ascontiguousarray(found, dtype=np.int64))
    heap.finalize()
    return heap.D, heap.I
