"""pytorch-metric-learning's ``InferenceModel`` and ``MatchFinder`` (``utils.inference``): a user's trunk (and
embedder) put behind a k-NN index and a match threshold, with PML's methods and results.

``InferenceModel(trunk).train_knn(gallery)`` embeds a tensor, a list of tensors or a Dataset of
``(input, label)`` items and indexes them; ``get_nearest_neighbors(queries, k)`` returns ``(distances,
indices)``; ``get_matches`` and ``is_match`` compare embeddings against ``MatchFinder``'s threshold. A trained
dmlkit run is better served by :class:`dmlkit.inference.RunEmbedder` and :class:`dmlkit.index.Index`, which
prepare images as the run did and keep ids, paths and labels; this class is for code written against PML.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from dmlkit.core.validation import Interval, validate_params
from dmlkit.distances import CosineSimilarity
from dmlkit.exceptions import DataError, InvalidParameterError
from dmlkit.index.knn_funcs import FaissKNN


class MatchFinder:
    """Pairs closer than ``threshold`` under ``distance`` (at least ``threshold`` for a similarity, whose
    ``is_inverted`` is True): PML's ``MatchFinder``."""

    def __init__(self, distance: torch.nn.Module, threshold: float | None = None):
        if not callable(distance):
            raise InvalidParameterError(f"MatchFinder 'distance' must be a distance module. Got {distance!r}.")
        self.distance = distance
        self.threshold = threshold

    def _threshold(self, threshold: float | None) -> float:
        value = self.threshold if threshold is None else threshold
        if value is None:
            raise InvalidParameterError("MatchFinder needs a threshold: pass threshold= here or to MatchFinder(...).")
        return value

    def _matches(self, values: torch.Tensor, threshold: float) -> torch.Tensor:
        return values >= threshold if self.distance.is_inverted else values <= threshold

    def operate_on_emb(self, input_func, query_emb: torch.Tensor, ref_emb: torch.Tensor | None = None, *args,
                       **kwargs):
        """``input_func(query_emb, ref_emb, *args, **kwargs)``, the queries serving as references when None."""
        return input_func(query_emb, query_emb if ref_emb is None else ref_emb, *args, **kwargs)

    def get_matching_pairs(self, query_emb: torch.Tensor, ref_emb: torch.Tensor | None = None,
                           threshold: float | None = None, return_tuples: bool = False):
        """``[Nq, Nr]`` bool numpy matrix of matching pairs, or the ``(query, reference)`` index tuples."""
        threshold = self._threshold(threshold)
        with torch.no_grad():
            return self.operate_on_emb(self._matching_pairs, query_emb, ref_emb, threshold, return_tuples)

    def _matching_pairs(self, query_emb, ref_emb, threshold, return_tuples):
        matches = self._matches(self.distance(query_emb, ref_emb), threshold).cpu().numpy()
        return list(zip(*np.where(matches))) if return_tuples else matches

    def is_match(self, x: torch.Tensor, y: torch.Tensor, threshold: float | None = None):
        """Whether each row of ``x`` matches the same row of ``y``: a bool for one pair, else a numpy array."""
        threshold = self._threshold(threshold)
        with torch.no_grad():
            matched = self._matches(self.distance.pairwise_distance(x, y), threshold)
        return matched.item() if matched.numel() == 1 else matched.cpu().numpy()


class InferenceModel:
    """A trunk (and optional embedder) with a k-NN index over its embeddings: PML's ``InferenceModel``.

    ``match_finder`` defaults to cosine similarity at 0.9, ``knn_func`` to a :class:`FaissKNN` that keeps
    its index between calls; ``normalize_embeddings`` L2-normalises each embedding; inputs move to
    ``data_device`` (default: CUDA when available) and, when floating point, to ``dtype``.
    """

    def __init__(self, trunk: torch.nn.Module, embedder: torch.nn.Module | None = None,
                 match_finder: MatchFinder | None = None, normalize_embeddings: bool = True, knn_func=None,
                 data_device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        self.trunk = trunk
        self.embedder = torch.nn.Identity() if embedder is None else embedder
        self.match_finder = MatchFinder(CosineSimilarity(), threshold=0.9) if match_finder is None else match_finder
        self.knn_func = FaissKNN(reset_before=False, reset_after=False) if knn_func is None else knn_func
        self.normalize_embeddings = bool(normalize_embeddings)
        self.data_device = torch.device("cuda" if torch.cuda.is_available() else "cpu") if data_device is None \
            else torch.device(data_device)
        self.dtype = dtype

    def get_embeddings(self, x) -> torch.Tensor:
        """Embeddings ``[N, D]`` of a batch (a tensor, or a list of same-shaped tensors), without gradients."""
        x = self.process_if_list(x)
        if isinstance(x, torch.Tensor):
            x = x.to(self.data_device)
            if self.dtype is not None and x.is_floating_point():
                x = x.to(self.dtype)
        self.trunk.eval()
        self.embedder.eval()
        with torch.no_grad():
            embeddings = self.embedder(self.trunk(x))
        return torch.nn.functional.normalize(embeddings, p=2, dim=1) if self.normalize_embeddings else embeddings

    def get_embeddings_from_tensor_or_dataset(self, inputs, batch_size: int) -> torch.Tensor:
        """Embeddings of a tensor or list (``batch_size`` rows at a time) or a Dataset of ``(input, label)``."""
        validate_params("InferenceModel", {"batch_size": batch_size}, {"batch_size": [Interval(int, 1, None)]})
        inputs = self.process_if_list(inputs)
        if isinstance(inputs, (torch.Tensor, list)):
            batches = (inputs[s : s + batch_size] for s in range(0, len(inputs), batch_size))
        elif isinstance(inputs, Dataset):
            batches = (batch[0] for batch in DataLoader(inputs, batch_size=batch_size))
        else:
            raise TypeError(f"InferenceModel embeds a tensor, a list of tensors or a Dataset of (input, label) "
                            f"items. Got {type(inputs).__name__}.")
        embeddings = [self.get_embeddings(batch) for batch in batches]
        if not embeddings:
            raise DataError("InferenceModel was given no inputs to embed.")
        return torch.cat(embeddings)

    def train_knn(self, inputs, batch_size: int = 64) -> None:
        """Embed ``inputs`` and build the k-NN index on them (``knn_func.train``)."""
        self.call_knn(self.knn_func.train, inputs, batch_size)

    def add_to_knn(self, inputs, batch_size: int = 64) -> None:
        """Embed ``inputs`` and append them to the index (``knn_func.add``)."""
        self.call_knn(self.knn_func.add, inputs, batch_size)

    def call_knn(self, func, inputs, batch_size: int) -> None:
        func(self.get_embeddings_from_tensor_or_dataset(inputs, batch_size))

    def get_nearest_neighbors(self, query, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(distances, indices)`` ``[Nq, k]`` of the indexed inputs nearest to each query."""
        return self.knn_func(self.get_embeddings(query), k)

    def get_matches(self, query, ref=None, threshold: float | None = None, return_tuples: bool = False):
        """Matching pairs among the queries (or between queries and ``ref``), as :class:`MatchFinder` gives them."""
        query_emb = self.get_embeddings(query)
        ref_emb = query_emb if ref is None else self.get_embeddings(ref)
        return self.match_finder.get_matching_pairs(query_emb, ref_emb, threshold, return_tuples)

    def is_match(self, x, y, threshold: float | None = None):
        """Whether each input of ``x`` matches the same input of ``y``."""
        return self.match_finder.is_match(self.get_embeddings(x), self.get_embeddings(y), threshold)

    def save_knn_func(self, filename: str | Path) -> None:
        self.knn_func.save(filename)

    def load_knn_func(self, filename: str | Path) -> None:
        self.knn_func.load(filename)

    @staticmethod
    def process_if_list(x):
        """A list of tensors stacked into one batch; anything else as given."""
        if isinstance(x, list) and x and all(isinstance(item, torch.Tensor) for item in x):
            return torch.stack(x)
        return x


__all__ = ["InferenceModel", "MatchFinder"]
