"""PML's device and dtype contract at the entry points: inputs follow the embeddings, results keep their dtype.

PML moves labels, mined indices and reference labels to the embeddings' device (``c_f.to_device``)
before computing anything, so a user's loop may hand over labels straight from a DataLoader (on the
CPU) while the embeddings live on a GPU. :func:`to_device` is that move for everything a loss, miner,
reducer or wrapper receives: a tensor, a tuple or list of them (PML's ``indices_tuple``), a mapping
(a loss dict) or a dataclass of them (dmlkit's ``PairSelection`` / ``TripletSelection``).
:func:`as_input_dtype` gives a result accumulated in float32 the dtype of the half-precision
embeddings it came from, as PML's losses and PyTorch's own return. :func:`follow_device_` is the other
half of PML's contract: a loss built on the CPU and called with embeddings on a GPU moves its own
parameters and buffers there (PML's ``cast_types``), so that ``loss.W`` is on the card afterwards.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping
from typing import TypeVar

import torch
from torch import nn

T = TypeVar("T")


def _needs_move(x: object, device: torch.device) -> bool:
    if isinstance(x, torch.Tensor):
        return x.device != device
    if x is None or isinstance(x, (str, int, float)):  # the common leaves, answered before the generic checks
        return False
    if isinstance(x, (tuple, list, Mapping)):
        for t in x.values() if isinstance(x, Mapping) else x:  # a loop: no generator per container
            if _needs_move(t, device):
                return True
        return False
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return any(_needs_move(getattr(x, f.name), device) for f in dataclasses.fields(x))
    return False


def _move(x, device: torch.device):
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, (tuple, list)):
        return type(x)(_move(t, device) for t in x)
    if isinstance(x, Mapping):
        return {k: _move(v, device) for k, v in x.items()}
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        changes = {f.name: _move(getattr(x, f.name), device) for f in dataclasses.fields(x)
                   if _needs_move(getattr(x, f.name), device)}
        return dataclasses.replace(x, **changes)
    return x


def to_device(x: T, device: torch.device) -> T:
    """``x`` with every tensor in it on ``device`` (PML's ``c_f.to_device``); ``None``, numbers and
    anything already there come back as given (the same object), so the call costs nothing on one device."""
    return _move(x, device) if _needs_move(x, device) else x


def as_input_dtype(result: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
    """``result`` (accumulated in float32 for half-precision ``embeddings``) in the embeddings' dtype; anything
    but a floating-point tensor (a do-nothing reducer's loss dict) comes back as given."""
    if not isinstance(result, torch.Tensor):
        return result
    if embeddings.is_floating_point() and result.is_floating_point() and result.dtype != embeddings.dtype:
        return result.to(embeddings.dtype)
    return result


def autocast_off(device_type: str) -> contextlib.AbstractContextManager:
    """A block with autocast off on ``device_type`` (losses accumulate in fp32): ``torch.autocast(enabled=False)``
    where autocast is on, else nothing to enter (a disabled autocast costs host time on every call)."""
    if torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type=device_type, enabled=False)
    return contextlib.nullcontext()


def follow_device_(module: nn.Module, device: torch.device, *probes: torch.Tensor) -> None:
    """Move every parameter and buffer of ``module`` to ``device`` when one of ``probes`` (its own state,
    one tensor where all of it lives) is elsewhere: PML's ``cast_types`` (``self.W.data =
    c_f.to_device(self.W.data, device=embeddings.device)``), device part. ``module.to`` keeps each
    Parameter the same object (its ``.data`` replaced), so an optimiser built on the module still holds
    it; on one device the call is a comparison per probe."""
    if any(t.device != device for t in probes):
        module.to(device)


def host_to_device(tensor: torch.Tensor, device: torch.device, pin: bool | None = None) -> torch.Tensor:
    """``tensor`` on ``device``; from host memory through page-locked memory, without blocking, when ``pin``
    (default: for a CUDA ``device``).

    A plain ``.to("cuda")`` of a host tensor waits for the card's queue to drain (a host synchronisation);
    a non-blocking copy from pinned memory is queued like a kernel. The pinned staging buffer is held by
    PyTorch's caching host allocator until the copy is done. Any other move is a plain ``.to``.
    """
    if tensor.device == device:
        return tensor
    if pin is None:
        pin = device.type == "cuda"
    if pin and tensor.device.type == "cpu":
        if not tensor.is_pinned():
            tensor = tensor.pin_memory()
        return tensor.to(device, non_blocking=True)
    return tensor.to(device)
