"""Numerically stable reductions shared by the proxy losses."""

from __future__ import annotations

import torch

from dmlkit.distances import l2_normalize


def log1p_sum_exp(z: torch.Tensor, mask: torch.Tensor | None, dim: int) -> torch.Tensor:
    """``log(1 + sum_{mask} exp(z))`` along ``dim``, stable for any ``z`` (= Softplus(LSE), Proxy-Anchor Eq. (5)).

    Entries outside ``mask`` contribute nothing (an empty set gives exactly 0 with zero gradient).
    """
    if mask is not None:
        z = z.masked_fill(~mask, float("-inf"))
    shift = z.detach().amax(dim=dim, keepdim=True).clamp_min(0.0)
    total = torch.exp(z - shift).sum(dim=dim) + torch.exp(-shift).squeeze(dim)
    return shift.squeeze(dim) + torch.log(total)


def masked_logsumexp(z: torch.Tensor, mask: torch.Tensor, dim: int) -> torch.Tensor:
    """``log sum_{mask} exp(z)`` along ``dim``; ``-inf`` where the mask is empty (gradient 0 there)."""
    z = z.masked_fill(~mask, float("-inf"))
    shift = z.detach().amax(dim=dim, keepdim=True)
    shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
    return shift.squeeze(dim) + torch.log(torch.exp(z - shift).sum(dim=dim))


def cosine_to_proxies(embeddings: torch.Tensor, proxies: torch.Tensor) -> torch.Tensor:
    """``[B, P]`` cosine similarities between raw ``embeddings [B, D]`` and ``proxies [P, D]``."""
    return l2_normalize(embeddings) @ normalize_rows(proxies).T


def common_dtype(embeddings: torch.Tensor, proxies: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cast both to their promoted dtype (the cast is differentiable, the Parameter keeps its dtype)."""
    dtype = torch.promote_types(embeddings.dtype, proxies.dtype)
    return embeddings.to(dtype), proxies.to(dtype)


class _RowNormalize(torch.autograd.Function):
    """``x / max(||x||, 1e-12)`` per row with a written-out backward (fewer passes than autograd's)."""

    @staticmethod
    def forward(ctx, x):
        inv_norm = 1.0 / torch.linalg.vector_norm(x, dim=1).clamp_min(1e-12)
        unit = x * inv_norm[:, None]
        ctx.save_for_backward(unit, inv_norm)
        return unit

    @staticmethod
    def backward(ctx, grad_unit):
        unit, inv_norm = ctx.saved_tensors
        radial = torch.linalg.vecdot(unit, grad_unit)
        return (grad_unit - unit * radial[:, None]) * inv_norm[:, None]


def normalize_rows(x: torch.Tensor) -> torch.Tensor:
    """L2-normalise the rows of ``x [N, D]`` (same values as :func:`dmlkit.distances.l2_normalize`)."""
    return _RowNormalize.apply(x)
