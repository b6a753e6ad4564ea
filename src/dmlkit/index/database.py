"""A gallery in a vector database (Qdrant): export from an index or a run, query as the index does.

A dmlkit index lives in one process and one file; a vector database shards, replicates and serves
a gallery beyond one machine. :class:`QdrantCollection` writes a gallery into a Qdrant collection
and queries it with the same scores as :class:`dmlkit.index.Index` (cosine similarity of
L2-normalised vectors, distance ``1 - score``):

* each point is one gallery item; its point id is the item's id (an index's own id, or the item's
  position in a sorted folder listing), so writing it again replaces it: an interrupted export run
  again continues where it stopped and never duplicates an item;
* each point's payload holds the item's ``id``, ``path`` and ``label``; the collection's metadata
  holds a header with the format, the vector size, the model's fingerprint, the run directory and the
  index's match threshold, and a collection written by another model or of another size is refused;
* every request is retried with a growing wait when the server does not answer (connection refused,
  timeout, HTTP 5xx); after the last try a :class:`~dmlkit.exceptions.DatabaseError` names the URI
  and how many items are already written, which stay written. A full disk (the server's, or the
  local folder's) is a :class:`~dmlkit.exceptions.StorageError`; the index file is never touched.

URIs: ``qdrant:PATH`` is Qdrant's local mode, a folder on this machine with no server (laptops,
tests; brute-force search, so exact); ``http://HOST:PORT`` or ``https://HOST:PORT`` (``qdrant://HOST:PORT``
is ``http``) is a Qdrant server or cluster, where queries use its HNSW index unless ``exact=True``.
``?collection=NAME`` picks the collection (default ``dmlkit``); ``QDRANT_API_KEY`` in the
environment is sent to a server.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence
from urllib.parse import parse_qs, urlsplit

import numpy as np

from dmlkit.exceptions import ConfigError, DatabaseError, DataError, InvalidParameterError, StorageError

logger = logging.getLogger(__name__)

FORMAT = "dmlkit-vectors-1"
DEFAULT_COLLECTION = "dmlkit"
#: Points written per request, tries per request, seconds before the first retry (doubled each time).
BATCH_SIZE = 512
RETRIES = 3
RETRY_WAIT = 1.0


@dataclass(frozen=True)
class DatabaseURI:
    """Where a collection lives: ``path`` (Qdrant local mode) or ``url`` (a server), and its ``collection``."""

    uri: str
    collection: str
    path: str | None = None
    url: str | None = None

    @property
    def local(self) -> bool:
        return self.path is not None


def parse_uri(uri: str) -> DatabaseURI:
    """``qdrant:PATH``, ``qdrant://HOST:PORT``, ``http(s)://HOST:PORT``, each with an optional ``?collection=NAME``."""
    text = str(uri)
    base, _, query = text.partition("?")
    options = parse_qs(query, keep_blank_values=True) if query else {}
    unknown = sorted(set(options) - {"collection"})
    collection = options.get("collection", [DEFAULT_COLLECTION])[-1]
    if unknown or not collection:
        raise ConfigError(f"the database URI {text!r} takes only '?collection=NAME' (a non-empty name); "
                          f"got {query!r}.")
    if base.startswith(("http://", "https://", "qdrant://")):
        parts = urlsplit(base)
        if not parts.hostname:
            raise ConfigError(f"the database URI {text!r} names no host (expected e.g. http://localhost:6333).")
        scheme = "http" if parts.scheme == "qdrant" else parts.scheme
        port = f":{parts.port}" if parts.port else ""
        return DatabaseURI(text, collection, url=f"{scheme}://{parts.hostname}{port}{parts.path.rstrip('/')}")
    if base.startswith("qdrant:") and len(base) > len("qdrant:"):
        return DatabaseURI(text, collection, path=os.path.abspath(base[len("qdrant:"):]))
    raise ConfigError(f"{text!r} is not a vector database URI: expected qdrant:PATH (a local folder, no server) or "
                      "http(s)://HOST:PORT (a Qdrant server), optionally with ?collection=NAME.")


def is_database_uri(text: str) -> bool:
    """Whether ``text`` names a vector database rather than a file."""
    return str(text).startswith(("qdrant:", "http://", "https://"))


def _qdrant():
    from dmlkit.core.extras import require

    return require("qdrant_client", "qdrant", "a Qdrant vector database")


def _out_of_space(exc: BaseException) -> bool:
    """Whether ``exc`` says the database's disk is full (local folder or server)."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return True
    text = str(exc).lower()
    return "disk is full" in text or "no space left" in text or "disk full" in text


def _transient(exc: BaseException) -> bool:
    """Whether a failed request may succeed when tried again (no answer, timeout, a server error)."""
    from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

    if isinstance(exc, UnexpectedResponse):
        return exc.status_code is None or exc.status_code >= 500 or exc.status_code == 429
    if isinstance(exc, (ResponseHandlingException, ConnectionError, TimeoutError)):
        return True
    import httpx

    return isinstance(exc, httpx.TransportError)


@dataclass
class ExportSummary:
    """What an export did: ``written`` items, ``already`` there from an earlier (interrupted) export, ``total`` held."""

    written: int
    already: int
    total: int


class QdrantCollection:
    """A Qdrant collection holding a dmlkit gallery; see the module docstring for the URI, ids and header.

    ``retries`` tries per request and ``retry_wait`` seconds before the first retry (doubled each time)
    ride out a server that restarts or is briefly overloaded; ``timeout`` is each request's limit in
    seconds. Use it as a context manager (or call :meth:`close`): a local folder is locked while open.
    """

    def __init__(self, uri: str, *, timeout: float = 10.0, retries: int = RETRIES, retry_wait: float = RETRY_WAIT):
        from dmlkit.core.validation import Interval, validate_params

        validate_params("QdrantCollection", {"timeout": timeout, "retries": retries, "retry_wait": retry_wait},
                        {"timeout": [Interval(float, 0, None, closed="neither")], "retries": [Interval(int, 1, None)],
                         "retry_wait": [Interval(float, 0, None)]})
        self.where = parse_uri(uri)
        self.retries, self.retry_wait = retries, retry_wait
        qdrant = _qdrant()
        if self.where.local:
            if os.path.exists(self.where.path) and not os.path.isdir(self.where.path):
                raise ConfigError(f"{uri!r}: {self.where.path!r} is a file; qdrant:PATH names a folder (Qdrant's local "
                                  "mode keeps its collections there).")
            os.makedirs(self.where.path, exist_ok=True)
            try:
                self.client = qdrant.QdrantClient(path=self.where.path)
            except RuntimeError as exc:  # another process holds the folder's lock
                raise DatabaseError(f"cannot open the Qdrant folder {self.where.path!r}: {exc}") from None
            except Exception as exc:
                self._raise_if_full(exc, "opening")
                raise
        else:
            self.client = qdrant.QdrantClient(url=self.where.url, api_key=os.environ.get("QDRANT_API_KEY") or None,
                                              timeout=int(max(1, round(timeout))), prefer_grpc=False,
                                              check_compatibility=False)  # no request before the first real one
        self._header: dict[str, Any] | None = None

    # ----- plumbing ---------------------------------------------------------------------------
    def __enter__(self) -> "QdrantCollection":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.client.close()

    @property
    def name(self) -> str:
        return self.where.collection

    def describe(self) -> str:
        return f"collection {self.name!r} at {self.where.uri.partition('?')[0]}"

    def _raise_if_full(self, exc: BaseException, doing: str, written: int | None = None) -> None:
        if _out_of_space(exc):
            kept = "" if written is None else f" The {written} items written before it are kept."
            raise StorageError(f"the database's disk is full while {doing} {self.describe()} ({exc}).{kept} Nothing "
                               "else was changed (the index file is untouched); free some space and run the same "
                               "command again: it continues where it stopped.") from None

    def _call(self, what: str, fn: Callable[[], Any], written: int | None = None) -> Any:
        """``fn()`` with retries on transient failures; a clear error (disk full, no answer) otherwise."""
        wait = self.retry_wait
        for attempt in range(1, self.retries + 1):
            try:
                return fn()
            except Exception as exc:  # the client raises its own types, httpx's, sqlite3's and OSError
                self._raise_if_full(exc, what, written)
                if not _transient(exc):
                    raise DatabaseError(f"{self.describe()} refused {what}: {str(exc).strip()[:300]}") from None
                if attempt == self.retries:
                    kept = "" if written is None else (f" The {written} items written before it are kept; run the "
                                                       "same command again to continue.")
                    raise DatabaseError(f"{self.describe()} did not answer {what} after {self.retries} tries "
                                        f"({type(exc).__name__}: {str(exc).strip()[:200]}). Is the server running "
                                        f"and the URI right?{kept}") from None
                logger.warning("%s: %s failed (%s); trying again in %.1f s", self.describe(), what,
                               type(exc).__name__, wait)
                time.sleep(wait)
                wait *= 2

    # ----- the header -------------------------------------------------------------------------
    def header(self) -> dict[str, Any] | None:
        """The collection's dmlkit header, or None when the collection does not exist."""
        if self._header is not None:
            return self._header
        if not self._call("a question about its collections", lambda: self.client.collection_exists(self.name)):
            return None
        info = self._call("a question about the collection", lambda: self.client.get_collection(self.name))
        metadata = dict(info.config.metadata or {})
        header = metadata.get("dmlkit")
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise DataError(f"{self.describe()} was not written by `dmlkit index export` (no {FORMAT!r} header in "
                            "its metadata); choose another ?collection=NAME.")
        vectors = info.config.params.vectors
        size = getattr(vectors, "size", None)
        if size != header.get("dim"):
            raise DataError(f"{self.describe()} holds vectors of size {size} but its header says {header.get('dim')}.")
        self._header = header
        return header

    def check(self, dim: int, fingerprint: dict | None) -> None:
        """Refuse a gallery of another size or model than the collection's (when it exists)."""
        header = self.header()
        if header is None:
            return
        if header["dim"] != dim:
            raise DataError(f"{self.describe()} holds embeddings of size {header['dim']}, these are of size {dim}: "
                            "they come from another model. Export to another ?collection=NAME.")
        theirs = header.get("fingerprint")
        if (theirs or None) != (dict(fingerprint) if fingerprint else None):
            raise ConfigError(f"{self.describe()} was written by another model: its fingerprint is {theirs} (run "
                              f"{header.get('run_dir')}), this one is {fingerprint}. Use the run that wrote it, or "
                              "export to another ?collection=NAME.")

    def check_model(self, embedder) -> None:
        """Refuse a query model whose fingerprint is not the collection's."""
        header = self.require_header()
        self.check(header["dim"], dict(embedder.fingerprint))

    def require_header(self) -> dict[str, Any]:
        header = self.header()
        if header is None:
            raise DataError(f"{self.describe()} does not exist; write it with `dmlkit index export ... --to "
                            f"{self.where.uri}`.")
        return header

    def _create(self, dim: int, fingerprint: dict | None, run_dir: str | None, threshold: float | None,
                threshold_fmr: float | None) -> None:
        models = _qdrant().models
        header = {"format": FORMAT, "dim": int(dim), "fingerprint": dict(fingerprint) if fingerprint else None,
                  "run_dir": run_dir, "threshold": threshold, "threshold_fmr": threshold_fmr}
        self._call("creating the collection", lambda: self.client.create_collection(
            self.name, vectors_config=models.VectorParams(size=int(dim), distance=models.Distance.COSINE),
            metadata={"dmlkit": header}))
        self._header = header

    def __len__(self) -> int:
        self.require_header()
        return int(self._call("counting points", lambda: self.client.count(self.name, exact=True)).count)

    # ----- writing ----------------------------------------------------------------------------
    def export(self, ids: np.ndarray, paths: Sequence[str | None], labels: Sequence[str | None],
               vectors_of: Callable[[np.ndarray], np.ndarray], *, dim: int, fingerprint: dict | None,
               run_dir: str | None = None, threshold: float | None = None, threshold_fmr: float | None = None,
               batch_size: int = BATCH_SIZE, progress: bool = False) -> ExportSummary:
        """Write items ``ids [N]`` (non-negative, unique) with their ``paths`` and ``labels``, batch by batch;
        ``vectors_of(rows)`` gives the vectors ``[n, dim]`` of the items at positions ``rows``, and is only
        asked for items the collection does not hold yet. An item already there must have the same path and
        label (else the gallery changed since the earlier export, and the export stops)."""
        from dmlkit.core.validation import Interval, validate_params

        validate_params("QdrantCollection.export", {"batch_size": batch_size}, {"batch_size": [Interval(int, 1, None)]})
        ids = np.asarray(ids, dtype=np.int64)
        if len(paths) != len(ids) or len(labels) != len(ids):
            raise DataError(f"ids has {len(ids)} rows but paths has {len(paths)} and labels {len(labels)}.")
        if len(ids) and (ids.min() < 0 or len(np.unique(ids)) != len(ids)):
            raise DataError("item ids must be unique and non-negative (they are the database's point ids).")
        self.check(dim, fingerprint)
        if self.header() is None:
            self._create(dim, fingerprint, run_dir, threshold, threshold_fmr)
        models = _qdrant().models
        written = already = 0
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(ids), desc="export", unit="item", dynamic_ncols=True, leave=False)
        try:
            for start in range(0, len(ids), batch_size):
                rows = np.arange(start, min(start + batch_size, len(ids)))
                batch = [int(i) for i in ids[rows]]
                there = self._call("reading points", lambda: self.client.retrieve(
                    self.name, ids=batch, with_payload=["path", "label"], with_vectors=False), written)
                held = {int(p.id): p.payload or {} for p in there}
                for row in rows:
                    item = held.get(int(ids[row]))
                    if item is not None and (item.get("path"), item.get("label")) != (paths[row], labels[row]):
                        raise DataError(
                            f"{self.describe()} holds item {int(ids[row])} as path {item.get('path')!r}, label "
                            f"{item.get('label')!r}, but this gallery has path {paths[row]!r}, label {labels[row]!r} "
                            "there: the gallery changed since the earlier export. Export to another ?collection=NAME.")
                missing = np.array([row for row in rows if int(ids[row]) not in held], dtype=np.int64)
                already += len(rows) - len(missing)
                if len(missing):
                    vectors = _unit(vectors_of(missing), dim)
                    points = [models.PointStruct(id=int(ids[row]), vector=vector.tolist(),
                                                 payload={"id": int(ids[row]), "path": paths[row], "label": labels[row]})
                              for row, vector in zip(missing, vectors)]
                    self._call("writing points", lambda: self.client.upsert(self.name, points=points, wait=True),
                               written)
                    written += len(missing)
                if bar is not None:
                    bar.update(len(rows))
        finally:
            if bar is not None:
                bar.close()
        return ExportSummary(written, already, len(self))

    def export_index(self, index, *, batch_size: int = BATCH_SIZE, progress: bool = False) -> ExportSummary:
        """Write every item of a :class:`dmlkit.index.Index` (its ids, paths, labels, fingerprint, threshold)."""
        def vectors_of(rows: np.ndarray) -> np.ndarray:
            return np.asarray(index.faiss_index.reconstruct_batch(index.ids[rows]), dtype=np.float32)

        return self.export(index.ids, index.paths, index.labels, vectors_of, dim=index.dim,
                           fingerprint=index.fingerprint, run_dir=index.run_dir, threshold=index.threshold,
                           threshold_fmr=index.threshold_fmr, batch_size=batch_size, progress=progress)

    def export_images(self, embedder, paths: Sequence[str], labels: Sequence[str | None], *,
                      batch_size: int = BATCH_SIZE, progress: bool = False) -> ExportSummary:
        """Embed and write image files (ids: their positions in ``paths``); only images not yet written are embedded."""
        run_dir = getattr(embedder, "run_dir", None)

        def vectors_of(rows: np.ndarray) -> np.ndarray:
            return embedder.embed([paths[r] for r in rows]).numpy()

        return self.export(np.arange(len(paths)), [str(p) for p in paths], list(labels), vectors_of,
                           dim=embedder.embedding_size, fingerprint=dict(embedder.fingerprint),
                           run_dir=None if run_dir is None else str(run_dir), batch_size=batch_size, progress=progress)

    # ----- querying ---------------------------------------------------------------------------
    def query(self, embedder, images, k: int = 10, *, exact: bool = False):
        """The ``k`` nearest items of each image, embedded by ``embedder`` (the collection's model)."""
        self.check_model(embedder)
        return self.query_embeddings(embedder.embed(images), k, exact=exact)

    def query_embeddings(self, queries, k: int = 10, *, exact: bool = False):
        """Nearest items of ``queries [Q, D]``, best first, as a :class:`dmlkit.index.QueryResult`.

        ``exact`` asks a server for brute-force search (local mode always searches exactly)."""
        from dmlkit.index.gallery import QueryResult, _unit_rows

        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise InvalidParameterError(f"The 'k' parameter of QdrantCollection.query must be an int >= 1. Got {k!r} instead.")
        header = self.require_header()
        q = _unit_rows(queries)
        if q.shape[1] != header["dim"]:
            raise DataError(f"query embeddings have size {q.shape[1]} but {self.describe()} holds size {header['dim']}.")
        models = _qdrant().models
        params = None if self.where.local else models.SearchParams(exact=bool(exact))  # local mode is exact anyway
        requests = [models.QueryRequest(query=row.tolist(), limit=k, with_payload=True, params=params) for row in q]
        answers = self._call("a query", lambda: self.client.query_batch_points(self.name, requests=requests))
        found = [answer.points for answer in answers]
        width = max((len(points) for points in found), default=0)
        ids = np.full((len(q), width), -1, dtype=np.int64)
        scores = np.full((len(q), width), -np.inf, dtype=np.float32)
        paths = [[None] * width for _ in found]
        labels = [[None] * width for _ in found]
        for qi, points in enumerate(found):
            for j, point in enumerate(points):
                payload = point.payload or {}
                ids[qi, j], scores[qi, j] = int(point.id), point.score
                paths[qi][j], labels[qi][j] = payload.get("path"), payload.get("label")
        threshold = header.get("threshold")
        valid = ids >= 0
        match = None if threshold is None else (scores >= threshold) & valid
        distances = np.where(valid, np.maximum(1 - scores, 0), np.inf).astype(np.float32)
        return QueryResult(ids, scores, distances, paths, labels, match)


def _unit(vectors: np.ndarray, dim: int) -> np.ndarray:
    """float32 unit rows ``[n, dim]`` (a DataError for another size)."""
    from dmlkit.index.gallery import _unit_rows

    out = _unit_rows(vectors)
    if out.shape[1] != dim:
        raise DataError(f"embeddings have size {out.shape[1]} but the collection holds size {dim}.")
    return out
