"""The run's device and process group: ``train.device`` resolved (under torchrun this rank's GPU), the group joined."""

from __future__ import annotations

import torch

from dmlkit.config.schema import RunConfig
from dmlkit.core.cpu_ops import cpu_bf16_native
from dmlkit.engine import distributed
from dmlkit.exceptions import ConfigError


def device_and_processes(cfg: RunConfig) -> tuple[torch.device, distributed.DistInfo]:
    """The run's device (under torchrun this rank's GPU) and its process group, joined; ``train.num_threads`` set."""
    device = resolve_device(cfg.train.device, local_rank=distributed.torchrun_local_rank())
    dist = distributed.init_distributed(backend="nccl" if device.type == "cuda" else "gloo")
    if cfg.train.num_threads:
        torch.set_num_threads(cfg.train.num_threads)
    return device, dist


def resolve_device(spec: str, *, local_rank: int | None = None) -> torch.device:
    """The device ``train.device`` names: ``auto`` is CUDA when available, else the CPU.

    ``local_rank`` (a torchrun worker's ``LOCAL_RANK``; None in a single process) makes ``cuda``
    mean ``cuda:LOCAL_RANK``: every rank trains on its own GPU. Asking for CUDA where
    ``torch.cuda.is_available()`` is False, or for a GPU index that is not there, is a ConfigError.
    """
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    if spec == "cpu":
        return torch.device("cpu")
    if not (spec == "cuda" or spec.startswith("cuda:") and spec[5:].isdigit()):
        raise ConfigError(f"train.device must be one of 'auto', 'cpu', 'cuda', 'cuda:N' (N a GPU index). Got {spec!r}.")
    if not torch.cuda.is_available():
        raise ConfigError(
            f"train.device={spec!r} asks for a GPU, but torch.cuda.is_available() is False here (no visible "
            "CUDA device, or a CPU-only PyTorch build). Use train.device=cpu, or auto to take a GPU only when there is one."
        )
    index = int(spec[5:]) if spec != "cuda" else None
    if local_rank is not None:
        if index is not None and index != local_rank:
            raise ConfigError(
                f"train.device={spec!r}: under torchrun every rank trains on cuda:LOCAL_RANK (this is rank "
                f"{local_rank} on its machine); set train.device=cuda (or auto) and pick GPUs with CUDA_VISIBLE_DEVICES."
            )
        index = local_rank
    count = torch.cuda.device_count()
    if index is None:
        index = torch.cuda.current_device()
    if index >= count:
        raise ConfigError(
            f"train.device asks for cuda:{index}, but only {count} CUDA device(s) are visible (cuda:0 ... cuda:{count - 1})."
        )
    return torch.device("cuda", index)


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` computes bf16 natively (a GPU with bf16; a CPU with AVX512-BF16 or AMX via oneDNN)."""
    if device.type == "cuda":  # Ampere or newer; older cards only emulate bf16 (slower than fp32)
        with torch.cuda.device(device):
            return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    if device.type == "cpu":
        return cpu_bf16_native()
    return False


__all__ = ["device_and_processes", "native_bf16", "resolve_device"]
