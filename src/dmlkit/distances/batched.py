"""A distance computed block by block of query rows, each block handed to a callback (PML's
``BatchedDistance``): the ``[N, R]`` matrix of a large set never exists at once."""

from __future__ import annotations

from typing import Callable

import torch


class BatchedDistance(torch.nn.Module):
    """``BatchedDistance(distance, iter_fn, batch_size=32)(query [N, D], ref=None)``.

    Calls ``iter_fn(mat [e - s, R], s, e)`` for consecutive blocks ``query[s:e]`` of
    ``batch_size`` rows against ``ref`` (``query`` itself when None) and returns None.
    Attributes it lacks (``is_inverted``, ``normalize_embeddings``, ``p``, ``power``, ...)
    are the wrapped distance's.
    """

    def __init__(self, distance: torch.nn.Module, iter_fn: Callable | None = None, batch_size: int = 32):
        super().__init__()
        from dmlkit.core.validation import Interval, validate_params

        validate_params(type(self).__name__, {"batch_size": batch_size}, {"batch_size": [Interval(int, 1, None)]})
        self.distance = distance
        self.iter_fn = iter_fn
        self.batch_size = batch_size

    def forward(self, query_emb: torch.Tensor, ref_emb: torch.Tensor | None = None) -> None:
        ref_emb = query_emb if ref_emb is None else ref_emb.to(query_emb.device)
        for start in range(0, query_emb.shape[0], self.batch_size):
            end = start + self.batch_size
            self.iter_fn(self.distance(query_emb[start:end], ref_emb), start, end)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("distance"), name)
