"""Embedding normalisations: L2, ASAP's bounded one, and none."""

from __future__ import annotations

import torch

from dmlkit.exceptions import InvalidParameterError

NORMALIZATIONS = ("l2", "bounded", "none")


def l2_normalize(x: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """Project each row onto the unit sphere: ``x / max(||x||, eps)``."""
    return x / x.norm(dim=-1, keepdim=True).clamp_min(eps)


def bounded_normalize(x: torch.Tensor) -> torch.Tensor:
    """Project each row onto the unit ball: ``x / ||x||`` only where ``||x|| > 1`` (ASAP Sec. 4.4)."""
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1.0)


def normalize(x: torch.Tensor, kind: str) -> torch.Tensor:
    """Apply the normalisation named ``kind`` (one of ``"l2"``, ``"bounded"``, ``"none"``)."""
    if kind == "l2":
        return l2_normalize(x)
    if kind == "bounded":
        return bounded_normalize(x)
    if kind == "none":
        return x
    raise InvalidParameterError(
        f"The 'normalization' parameter must be one of {NORMALIZATIONS}. Got {kind!r} instead."
    )
