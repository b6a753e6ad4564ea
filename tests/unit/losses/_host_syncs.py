"""Count the host synchronisations a call would make on a GPU, on any device (the CPU included).

On a CUDA device the host waits for the card whenever a tensor's value decides what Python does
next: a scalar read (``.item()``, ``bool(t)``, ``float(t)``, ``if t.any():``, all of them
``aten._local_scalar_dense``), an output whose size depends on the data (``nonzero``,
``masked_select``, indexing with a boolean mask, ``unique``, ``repeat_interleave`` without its
``output_size``), or a copy to host memory (``.tolist()``, ``.numpy()``, ``.cpu()``). The first two
kinds are seen as ATen operators under a ``TorchDispatchMode``; the third never reaches the
dispatcher on a CPU tensor, so those three methods are wrapped while counting.
:class:`OperatorCounter` counts every operator dispatched (``benchmarks/bench_launches.py`` uses both).
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

#: Operators that read tensor data on the host or size their output from it.
SYNCING_OPS = {
    aten._local_scalar_dense.default,
    aten.nonzero.default,
    aten.masked_select.default,
    aten._unique2.default,
    aten.unique_dim.default,
    aten.unique_consecutive.default,
    aten.repeat_interleave.Tensor,
}

#: Operators that sync only when one of their indices is a boolean mask.
MASK_INDEXED_OPS = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}

HOST_COPY_METHODS = ("tolist", "numpy", "cpu")


def _has_mask_index(args: tuple) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or ())


class HostSyncCounter(TorchDispatchMode):
    """``counts``: ``{operator or Tensor method name: calls}`` of everything that would sync on a GPU."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in SYNCING_OPS:
            if not (func is aten.repeat_interleave.Tensor and (kwargs or {}).get("output_size") is not None):
                self.counts[str(func)] += 1
        elif func in MASK_INDEXED_OPS and _has_mask_index(args):
            self.counts[f"{func} (boolean mask)"] += 1
        return func(*args, **(kwargs or {}))


class OperatorCounter(TorchDispatchMode):
    """``counts``: ``{ATen operator: calls}`` of everything dispatched inside the block (backward included):
    on a GPU each one is a kernel launch or at least a pass through PyTorch's dispatcher."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[str(func)] += 1
        return func(*args, **(kwargs or {}))


@contextmanager
def count_host_syncs() -> Iterator[collections.Counter[str]]:
    """Inside the block, count every host synchronisation; yields the live counter."""
    counter = HostSyncCounter()
    originals = {name: getattr(torch.Tensor, name) for name in HOST_COPY_METHODS}

    def counting(name):
        original = originals[name]

        def method(self, *args, **kwargs):
            counter.counts[f"Tensor.{name}"] += 1
            return original(self, *args, **kwargs)

        return method

    try:
        for name in HOST_COPY_METHODS:
            setattr(torch.Tensor, name, counting(name))
        with counter:
            yield counter.counts
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
