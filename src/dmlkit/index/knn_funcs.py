"""pytorch-metric-learning's k-NN and k-means callables (``utils.inference``): ``FaissKNN``, ``CustomKNN``,
``FaissKMeans``.

Each is what PML's :class:`~dmlkit.evaluation.AccuracyCalculator` takes as ``knn_func`` or
``kmeans_func`` and :class:`~dmlkit.inference.InferenceModel` searches with, with PML's arguments and
results: ``knn_func(query [Nq, D], k, reference [Nr, D], ref_includes_query) -> (distances [Nq, k], indices
[Nq, k])`` on the query's device. With ``ref_includes_query`` the queries are the first rows of
``reference``: ``k + 1`` neighbours are found and each query's own row is dropped (the last one when the
query is not among them, as PML does). ``FaissKNN`` reports faiss's values (squared L2 for the default
``IndexFlatL2``); ``CustomKNN`` a dmlkit distance's, largest first for a similarity.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from dmlkit.core.validation import NONE, Interval, validate_params
from dmlkit.evaluation.knn import drop_own_neighbours
from dmlkit.exceptions import DataError, InvalidParameterError

_LOG = logging.getLogger(__name__)


def _without_own_rows(distances: torch.Tensor, indices: torch.Tensor,
                      ref_includes_query: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``k + 1`` neighbours to ``k`` when the queries are the first rows of the reference (PML's rule)."""
    if not ref_includes_query:
        return distances, indices
    indices, distances = drop_own_neighbours(indices, torch.arange(len(indices), device=indices.device), distances)
    return distances, indices


def _float32_rows(x: object, name: str) -> np.ndarray:
    """``[N, D]`` C-contiguous float32 on the CPU, as faiss reads them."""
    t = torch.as_tensor(x).detach()
    if t.dim() != 2:
        raise DataError(f"{name} must be embeddings of shape [N, D]. Got shape {tuple(t.shape)}.")
    return np.ascontiguousarray(t.cpu().float().numpy())


class FaissKNN:
    """Exact (or any faiss index's) k-NN: PML's ``FaissKNN``.

    ``index_init_fn(dim)`` builds the index (default ``faiss.IndexFlatL2``). ``reset_before``: a call
    builds a fresh index and adds ``reference`` to it; otherwise it searches the index that :meth:`train`
    and :meth:`add` filled (plus ``reference`` when given). ``reset_after``: the index is dropped after the
    call. ``gpus``: the GPU ids a faiss GPU build searches on (CUDA queries use every GPU by default).
    """

    def __init__(self, reset_before: bool = True, reset_after: bool = True,
                 index_init_fn: Callable[[int], object] | None = None, gpus: Sequence[int] | None = None):
        if gpus is not None:
            if not isinstance(gpus, (list, tuple)):
                raise TypeError(f"FaissKNN 'gpus' must be a list or tuple of GPU ids. Got {type(gpus).__name__}.")
            if len(gpus) < 1:
                raise ValueError("FaissKNN 'gpus' must name at least one GPU.")
        if index_init_fn is not None and not callable(index_init_fn):
            raise InvalidParameterError(f"FaissKNN 'index_init_fn' must be callable (dim -> faiss index). "
                                        f"Got {index_init_fn!r}.")
        self.reset_before = bool(reset_before)
        self.reset_after = bool(reset_after)
        self.index_init_fn = index_init_fn
        self.gpus = gpus
        self.index = None

    def _new_index(self, dim: int):
        import faiss

        return (self.index_init_fn or faiss.IndexFlatL2)(dim)

    def __call__(self, query: torch.Tensor, k: int, reference: torch.Tensor | None = None,
                 ref_includes_query: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        validate_params("FaissKNN", {"k": k}, {"k": [Interval(int, 1, None)]})
        query_t = torch.as_tensor(query)
        q = _float32_rows(query_t, "query")
        k = k + int(ref_includes_query)
        if self.reset_before:
            self.index = self._new_index(q.shape[1])
        if self.index is None:
            raise DataError("FaissKNN has no index to search: call train(embeddings) first, or pass reference "
                            "(with reset_before=True).")
        if reference is not None:
            self.index.add(_float32_rows(reference, "reference"))
        if k > self.index.ntotal:
            raise DataError(f"FaissKNN cannot return k={k} neighbours from an index of {self.index.ntotal} vectors.")
        distances, indices = self._search(q, k, query_t.is_cuda)
        if self.reset_after:
            self.reset()
        device = query_t.device
        return _without_own_rows(torch.from_numpy(distances).to(device), torch.from_numpy(indices).to(device),
                             ref_includes_query)

    def _search(self, q: np.ndarray, k: int, is_cuda: bool) -> tuple[np.ndarray, np.ndarray]:
        """Search on the GPUs when the query is on one (or ``gpus`` names some) and faiss can; else on the CPU."""
        import faiss

        gpus_there = getattr(faiss, "get_num_gpus", lambda: 0)() > 0
        if (is_cuda or self.gpus is not None) and gpus_there and k <= 2048:  # faiss GPU's largest k
            try:
                gpu_index = (faiss.index_cpu_to_all_gpus(self.index) if self.gpus is None
                             else faiss.index_cpu_to_gpus_list(self.index, gpus=list(self.gpus)))
                return gpu_index.search(q, k)
            except (AttributeError, RuntimeError) as err:  # an index type without a GPU version
                _LOG.warning("FaissKNN searches on the CPU: the index did not move to the GPU (%s)", err)
        return self.index.search(q, k)

    def train(self, embeddings: torch.Tensor) -> None:
        """A fresh index holding ``embeddings [N, D]`` (trained first when the index type needs it)."""
        x = _float32_rows(embeddings, "embeddings")
        self.index = self._new_index(x.shape[1])
        if not self.index.is_trained:
            self.index.train(x)
        self.index.add(x)

    def add(self, embeddings: torch.Tensor) -> None:
        """Append ``embeddings [N, D]`` to the index (their ids continue from the last)."""
        if self.index is None:
            raise DataError("FaissKNN.add needs an index: call train(embeddings) first.")
        self.index.add(_float32_rows(embeddings, "embeddings"))

    def save(self, filename: str | Path) -> None:
        """Write the index to ``filename`` atomically (faiss's own format)."""
        import faiss

        from dmlkit.engine.checkpoint_files import atomic_write_bytes

        if self.index is None:
            raise DataError("FaissKNN.save has no index to write: call train(embeddings) first.")
        atomic_write_bytes(filename, faiss.serialize_index(self.index).tobytes())

    def load(self, filename: str | Path) -> None:
        """Read an index that :meth:`save` (or ``faiss.write_index``) wrote."""
        import faiss

        path = Path(filename)
        if not path.is_file():
            raise FileNotFoundError(f"FaissKNN.load: no index file at {path}.")
        try:
            self.index = faiss.deserialize_index(np.frombuffer(path.read_bytes(), dtype=np.uint8))
        except RuntimeError as err:
            raise DataError(f"FaissKNN.load: {path} is not a faiss index ({str(err).splitlines()[0]}).") from None

    def reset(self) -> None:
        """Drop the index."""
        self.index = None


class CustomKNN:
    """Exact k-NN under a dmlkit (or PML-style) distance: PML's ``CustomKNN``.

    ``distance(query, reference) -> [Nq, Nr]``; the ``k`` smallest values are the neighbours, the largest
    for a similarity (``distance.is_inverted``). With ``batch_size`` the matrix is built ``batch_size``
    query rows at a time (memory ``batch_size x Nr``).
    """

    def __init__(self, distance: torch.nn.Module, batch_size: int | None = None):
        if not callable(distance):
            raise InvalidParameterError(f"CustomKNN 'distance' must be a distance module. Got {distance!r}.")
        validate_params("CustomKNN", {"batch_size": batch_size}, {"batch_size": [NONE, Interval(int, 0, None)]})
        self.distance = distance
        self.batch_size = batch_size or None  # PML reads 0 as "not batched"

    def __call__(self, query: torch.Tensor, k: int, reference: torch.Tensor,
                 ref_includes_query: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        validate_params("CustomKNN", {"k": k}, {"k": [Interval(int, 1, None)]})
        k = k + int(ref_includes_query)
        if k > len(reference):
            raise DataError(f"CustomKNN cannot return k={k} neighbours from {len(reference)} references.")
        largest = bool(getattr(self.distance, "is_inverted", False))
        step = self.batch_size or max(len(query), 1)
        parts = [torch.topk(self.distance(query[s : s + step], reference), k, dim=1, largest=largest)
                 for s in range(0, len(query), step)]  # blocks of query rows, not single queries
        distances = torch.cat([p.values for p in parts]) if parts else query.new_zeros(0, k)
        indices = torch.cat([p.indices for p in parts]) if parts else torch.zeros(0, k, dtype=torch.long, device=query.device)
        return _without_own_rows(distances, indices, ref_includes_query)


class FaissKMeans:
    """faiss k-means cluster ids: PML's ``FaissKMeans``. ``kwargs`` go to ``faiss.Kmeans`` (``niter``,
    ``seed``, ``nredo``, ...); ``kmeans(x [N, D], nmb_clusters) -> [N]`` int64 on ``x``'s device."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs

    def __call__(self, x: torch.Tensor, nmb_clusters: int) -> torch.Tensor:
        from dmlkit.evaluation.clustering import faiss_kmeans

        validate_params("FaissKMeans", {"nmb_clusters": nmb_clusters}, {"nmb_clusters": [Interval(int, 1, None)]})
        x_t = torch.as_tensor(x)
        return faiss_kmeans(_float32_rows(x_t, "x"), nmb_clusters, name="nmb_clusters", **self.kwargs).to(x_t.device)

__all__ = ["CustomKNN", "FaissKMeans", "FaissKNN"]
