"""Weighted sums of losses, each with its own miner: PML's ``MultipleLosses``.

``MultipleLosses(losses, miners=None, weights=None)`` takes a list or a dict of losses; miners
and weights follow the same form (a list as long as ``losses``, ``None`` for a loss without a
miner; or a dict whose keys are among the losses' keys, all of them for ``weights``). The call
``loss(embeddings, labels, indices_tuple=None)`` returns ``sum_i w_i * loss_i(embeddings,
labels, pairs_i)`` with ``pairs_i`` the output of loss ``i``'s miner, else ``indices_tuple``.
Mismatched forms raise :class:`~dmlkit.exceptions.AssertedParameterError` (an
``AssertionError`` too, as PML asserts).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from dmlkit.exceptions import AssertedParameterError
from dmlkit.mining.selection import PairSelection, TripletSelection


class MultipleLosses(torch.nn.Module):
    """``sum_i weights[i] * losses[i](embeddings, labels, miners[i](embeddings, labels) or indices_tuple)``."""

    def __init__(self, losses, miners=None, weights=None):
        super().__init__()
        self.is_dict = isinstance(losses, Mapping)
        if not self.is_dict and not isinstance(losses, Sequence):
            raise AssertedParameterError(
                f"The 'losses' parameter of MultipleLosses must be a list or a dict of losses. Got {losses!r} instead."
            )
        self.losses = torch.nn.ModuleDict(losses) if self.is_dict else torch.nn.ModuleList(losses)
        keys = list(self.losses.keys()) if self.is_dict else list(range(len(self.losses)))
        self._check_form("miners", miners, keys, every_key=False)
        self._check_form("weights", weights, keys, every_key=True)
        if miners is None:
            self.miners = None
        elif self.is_dict:
            self.miners = torch.nn.ModuleDict({k: _as_module(m) for k, m in miners.items()})
        else:
            self.miners = torch.nn.ModuleList([_as_module(m) for m in miners])
        self.weights = weights if weights is not None else ({k: 1 for k in keys} if self.is_dict else [1] * len(keys))

    def _check_form(self, name: str, value, keys: list, every_key: bool) -> None:
        if value is None:
            return
        if self.is_dict:
            ok = isinstance(value, Mapping) and (sorted(value) == sorted(keys) if every_key else set(value) <= set(keys))
            wanted = "a dict with the keys of 'losses'" + ("" if every_key else " (or some of them)")
        else:
            ok = isinstance(value, (list, tuple)) and len(value) == len(keys)
            wanted = f"a list of {len(keys)} (one per loss)"
        if not ok:
            raise AssertedParameterError(f"The '{name}' parameter of MultipleLosses must be {wanted}. Got {value!r} instead.")

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor | None = None, indices_tuple=None) -> torch.Tensor:
        if self.miners is not None and indices_tuple is not None:
            raise AssertedParameterError("MultipleLosses has its own miners; it takes no indices_tuple.")
        items = self.losses.items() if self.is_dict else enumerate(self.losses)
        total = 0
        for key, loss in items:
            mined = self._mined(key, embeddings, labels, indices_tuple)
            if isinstance(mined, (PairSelection, TripletSelection)):
                value = loss(embeddings, labels, pairs=mined)
            else:
                value = loss(embeddings, labels, mined)
            total = total + value * self.weights[key]
        return total

    def _mined(self, key, embeddings, labels, indices_tuple):
        if self.miners is None:
            return indices_tuple
        miner = self.miners[key] if not self.is_dict else self.miners[key] if key in self.miners else None
        return indices_tuple if miner is None else miner(embeddings, labels)


def _as_module(miner):
    """``miner`` as a module (``None`` kept): a plain callable is wrapped so it can sit in a ``ModuleList``."""
    return miner if miner is None or isinstance(miner, torch.nn.Module) else _Callable(miner)


class _Callable(torch.nn.Module):
    """A plain callable miner kept in a ``ModuleList``."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)
