"""Multi-process training helpers: process group set-up, gathers with gradients, gradient sync.

Under ``torchrun`` every rank embeds its part of the global batch; :func:`all_gather_with_grad`
and :func:`all_gather_labels` give every rank the whole global batch so pair losses, miners,
DRO weights and cross-batch memory see the same ``[world * b, D]`` embeddings a single process
would. Without torchrun's environment everything here is a no-op (one process, world size 1).

Gradient bookkeeping (why the update equals the single-process one). Let ``L`` be the loss of
the global batch, computed identically on every rank. On rank ``r`` only the local slice of
the gathered embeddings has a graph, so backward reaches the model with
``g_r = sum_{i in r} dL/de_i * de_i/dtheta``; DDP then *averages*: ``(1/W) sum_r g_r = (1/W) dL/dtheta``.
:func:`all_gather_with_grad` therefore multiplies the local slice's incoming gradient by
``W`` (``grad_scale``), which makes DDP's average exactly ``dL/dtheta``. The loss value itself
is *not* scaled: the loss's own parameters (proxies) see every gathered embedding and already
receive the full ``dL/dP`` on every rank, so :func:`allreduce_gradients_` only averages them
(the average of equal values is that value; it also removes any rank-to-rank rounding drift).
Scaling the loss by ``W`` instead would be right for the model but would give the proxies
``W * dL/dP`` after averaging.
"""

from __future__ import annotations

import atexit
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Iterable

import torch
import torch.distributed as dist
from torch import nn

from dmlkit.exceptions import DataError, InvalidParameterError

#: Environment variables torchrun sets for every worker.
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job: global rank, world size, rank on its machine, backend."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    is_main: bool = True
    backend: str | None = None

    @property
    def enabled(self) -> bool:
        """True when more than one process takes part (collectives are real)."""
        return self.world_size > 1

    @property
    def device(self) -> torch.device:
        """The device this rank trains on: ``cuda:local_rank`` under nccl, else the CPU."""
        return torch.device("cuda", self.local_rank) if self.backend == "nccl" else torch.device("cpu")


def _is_active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def dist_info() -> DistInfo:
    """The current process group's :class:`DistInfo` (single process when none is initialised)."""
    if not (dist.is_available() and dist.is_initialized()):
        return DistInfo()
    rank = dist.get_rank()
    return DistInfo(
        rank=rank,
        world_size=dist.get_world_size(),
        local_rank=int(os.environ.get("LOCAL_RANK", rank)),
        is_main=rank == 0,
        backend=str(dist.get_backend()),
    )


def torchrun_local_rank() -> int | None:
    """This process's rank on its machine when it is one of several (torchrun's ``LOCAL_RANK``), else None.

    Read before :func:`init_distributed`, so the device (``cuda:LOCAL_RANK``) and with it the backend
    can be chosen first.
    """
    if dist.is_available() and dist.is_initialized():
        info = dist_info()
        return info.local_rank if info.enabled else None
    if _env_int("WORLD_SIZE", 1) <= 1:
        return None
    return _env_int("LOCAL_RANK", 0)


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise InvalidParameterError(f"The environment variable {name} must be an int. Got {raw!r} instead.") from None


def init_distributed(backend: str | None = None, timeout_seconds: float = 1800.0) -> DistInfo:
    """Join the process group torchrun describes (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_*``).

    ``backend`` defaults to ``nccl`` when CUDA is available and ``gloo`` otherwise. Without
    those variables, or with ``WORLD_SIZE=1``, nothing is initialised and a single-process
    :class:`DistInfo` is returned. Calling it again returns the existing group's info.
    """
    if dist.is_available() and dist.is_initialized():
        return dist_info()
    world_size = _env_int("WORLD_SIZE", 1)
    if world_size <= 1:
        return DistInfo()
    rank, local_rank = _env_int("RANK", 0), _env_int("LOCAL_RANK", 0)
    if not 0 <= rank < world_size:
        raise InvalidParameterError(
            f"RANK is {rank} but WORLD_SIZE is {world_size}; RANK must be in [0, {world_size - 1}]."
        )
    if not dist.is_available():
        raise RuntimeError("WORLD_SIZE > 1 but this PyTorch build has no torch.distributed support.")
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend not in ("gloo", "nccl"):
        raise InvalidParameterError(
            f"The 'backend' parameter of init_distributed must be one of {{'gloo', 'nccl'}}. Got {backend!r} instead."
        )
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    dist.init_process_group(
        backend, init_method="env://", rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_seconds)
    )
    atexit.register(cleanup_distributed)
    return DistInfo(rank, world_size, local_rank, rank == 0, backend)


def cleanup_distributed() -> None:
    """Leave the process group (safe to call when none exists)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def is_main_process() -> bool:
    """True on global rank 0 and in a single process: the rank that evaluates and writes files."""
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def barrier() -> None:
    """Wait until every rank reaches this point (no-op in a single process)."""
    if _is_active():
        dist.barrier()


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """``obj`` as held by rank ``src`` on every rank (picklable objects; no-op in a single process)."""
    if not _is_active():
        return obj
    box = [obj if dist.get_rank() == src else None]
    dist.broadcast_object_list(box, src=src)
    return box[0]


# ----------------------------------------------------------------------------- gathers


class _GatherKeepLocalGrad(torch.autograd.Function):
    """All-gather ``[b, D] -> [W*b, D]``; backward returns ``grad_scale *`` the local slice's gradient."""

    @staticmethod
    def forward(ctx, local: torch.Tensor, grad_scale: float) -> torch.Tensor:
        world, rank = dist.get_world_size(), dist.get_rank()
        parts = [torch.empty_like(local) for _ in range(world)]
        dist.all_gather(parts, local.contiguous())
        parts[rank] = local  # bitwise the same values; keeps the local slice tied to this call's input
        ctx.rank, ctx.rows, ctx.grad_scale = rank, local.shape[0], grad_scale
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        lo = ctx.rank * ctx.rows
        grad_local = grad_output[lo : lo + ctx.rows]
        if ctx.grad_scale != 1.0:
            grad_local = grad_local * ctx.grad_scale
        return grad_local, None


def _check_same_rows(tensor: torch.Tensor, name: str) -> None:
    """Every rank must contribute the same shape (the samplers give equal local batches)."""
    shapes = [None] * dist.get_world_size()
    dist.all_gather_object(shapes, tuple(tensor.shape))
    if len(set(shapes)) != 1:
        listing = ", ".join(f"rank {r}: {list(s)}" for r, s in enumerate(shapes))
        raise DataError(f"{name} must have the same shape on every rank to be gathered. Got {listing}.")


def all_gather_with_grad(
    embeddings: torch.Tensor, *, grad_scale: float | None = None, check_shapes: bool = False
) -> torch.Tensor:
    """Every rank's embeddings ``[b, D]`` stacked by rank: ``[W*b, D]``; only the local slice keeps autograd.

    The other ranks' rows are constants here (their own rank back-propagates them). The local
    slice's gradient is multiplied by ``grad_scale`` (default ``W``), which cancels DDP's
    averaging so the update equals single-process training on the global batch (module
    docstring). Pass ``grad_scale=1.0`` when gradients are summed over ranks instead.
    ``check_shapes=True`` verifies equal shapes first (one extra small collective).
    Single process: returns ``embeddings`` unchanged.
    """
    if not _is_active():
        return embeddings
    if embeddings.dim() < 1:
        raise DataError(f"embeddings must have a batch dimension [b, D]. Got shape {tuple(embeddings.shape)}.")
    if check_shapes:
        _check_same_rows(embeddings, "embeddings")
    scale = float(dist.get_world_size()) if grad_scale is None else float(grad_scale)
    return _GatherKeepLocalGrad.apply(embeddings, scale)


@torch.no_grad()
def all_gather_labels(labels: torch.Tensor, *, check_shapes: bool = False) -> torch.Tensor:
    """Every rank's labels ``[b]`` stacked by rank: ``[W*b]`` (same order as :func:`all_gather_with_grad`)."""
    if not _is_active():
        return labels
    if check_shapes:
        _check_same_rows(labels, "labels")
    parts = [torch.empty_like(labels) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, labels.contiguous())
    return torch.cat(parts)


@torch.no_grad()
def allreduce_gradients_(params: Iterable[torch.Tensor]) -> None:
    """Average ``params``' gradients over ranks in place, in one collective (loss parameters, proxies).

    DDP only synchronises the module it wraps (the model); the loss's parameters are outside it.
    A parameter whose gradient is ``None`` on every rank stays ``None``; one that has a gradient
    on some ranks only gets the average with zeros for the others (same on every rank).
    Single process: no-op.
    """
    params = [p for p in params if p.requires_grad]
    if not _is_active() or not params:
        return
    world = dist.get_world_size()
    ref = next((p.grad for p in params if p.grad is not None), params[0])
    flat = torch.cat(
        [
            (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).to(ref.dtype)
            for p in params
        ]
        + [torch.tensor([float(p.grad is not None) for p in params], dtype=ref.dtype, device=ref.device)]
    )
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    has_grad = flat[-len(params):] > 0
    offset = 0
    for p, present in zip(params, has_grad.tolist()):
        n = p.numel()
        if present:
            averaged = (flat[offset : offset + n] / world).view_as(p).to(p.dtype)
            if p.grad is None:
                p.grad = averaged.clone()
            else:
                p.grad.copy_(averaged)
        offset += n


# ----------------------------------------------------------------------------- model wrapping


def wrap_model(model: nn.Module, info: DistInfo | None = None, *, sync_batchnorm: bool | None = None) -> nn.Module:
    """``model`` inside :class:`~torch.nn.parallel.DistributedDataParallel` (unchanged in a single process).

    ``sync_batchnorm`` (default: on with nccl) converts BatchNorm layers to ``SyncBatchNorm``
    so their batch statistics cover the global batch; PyTorch's SyncBatchNorm needs GPUs, so
    on CPU (gloo) every rank normalises with its local batch's statistics.
    """
    info = info or dist_info()
    if not info.enabled:
        return model
    if sync_batchnorm is None:
        sync_batchnorm = info.backend == "nccl"
    if sync_batchnorm:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    if info.backend == "nccl":
        model = model.to(info.device)
        return nn.parallel.DistributedDataParallel(model, device_ids=[info.local_rank], output_device=info.local_rank)
    return nn.parallel.DistributedDataParallel(model)


def unwrap_model(model: nn.Module) -> nn.Module:
    """The module inside a DDP (or ``torch.compile``) wrapper; ``model`` itself otherwise."""
    while True:
        inner = getattr(model, "module", None)
        if not isinstance(inner, nn.Module):
            inner = getattr(model, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            return model
        model = inner


__all__ = [
    "DistInfo",
    "TORCHRUN_ENV",
    "all_gather_labels",
    "all_gather_with_grad",
    "allreduce_gradients_",
    "barrier",
    "broadcast_object",
    "cleanup_distributed",
    "dist_info",
    "init_distributed",
    "is_main_process",
    "torchrun_local_rank",
    "unwrap_model",
    "wrap_model",
]
