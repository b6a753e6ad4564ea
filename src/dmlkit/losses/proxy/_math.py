"""Numerically stable reductions shared by the proxy losses."""

from __future__ import annotations

import torch

from dmlkit.distances import l2_normalize
from dmlkit.losses._cpu_ops import exp_


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


def exp_is_safe(bound: float, dtype: torch.dtype) -> bool:
    """Whether ``exp(z)`` for ``|z| <= bound`` neither overflows nor underflows in ``dtype`` (sums of
    up to ~1e15 terms included), so a log-sum-exp needs no max shift."""
    return bound <= (300.0 if dtype == torch.float64 else 40.0)


def exp_sum_(z: torch.Tensor, dim: int, bound: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(E, sum E, LSE z)`` along ``dim`` with ``E = exp(z - m)`` written over ``z`` (``|z| <= bound``).

    The shift ``m`` is 0 when :func:`exp_is_safe` (one pass less), else the max along ``dim``.
    """
    if exp_is_safe(bound, z.dtype):
        exps = exp_(z)
        sums = exps.sum(dim=dim)
        return exps, sums, torch.log(sums)
    shift = z.amax(dim=dim, keepdim=True)
    exps = exp_(z.sub_(shift))
    sums = exps.sum(dim=dim)
    return exps, sums, torch.log(sums).add_(shift.squeeze(dim))


def inverse_row_norms(x: torch.Tensor) -> torch.Tensor:
    """``1 / max(||x_r||, 1e-12)`` for every row ``r`` of ``x [N, D]``."""
    return torch.linalg.vector_norm(x, dim=1).clamp_min(1e-12).reciprocal()


def row_dots(a: torch.Tensor, b: torch.Tensor, scratch: torch.Tensor | None = None) -> torch.Tensor:
    """``<a_r, b_r>`` for every row of ``a, b [N, D]`` (product then sum, which beats ``bmm`` on CPU).

    ``scratch`` (same shape and dtype) receives the product instead of a fresh ``[N, D]`` tensor.
    """
    return torch.mul(a, b, out=scratch).sum(dim=1) if scratch is not None else (a * b).sum(dim=1)


def tangent_(grad_unit: torch.Tensor, unit: torch.Tensor, scratch: torch.Tensor | None = None) -> torch.Tensor:
    """In place ``g - u <u, g>`` per row: the gradient through ``u = x / ||x||``, before the ``1/||x||``."""
    return grad_unit.addcmul_(unit, row_dots(unit, grad_unit, scratch)[:, None], value=-1.0)


class _RowNormalize(torch.autograd.Function):
    """``x / max(||x||, 1e-12)`` per row with a written-out backward (fewer passes than autograd's)."""

    @staticmethod
    def forward(ctx, x):
        inv_norm = inverse_row_norms(x)
        unit = x * inv_norm[:, None]
        ctx.save_for_backward(unit, inv_norm)
        return unit

    @staticmethod
    def backward(ctx, grad_unit):
        unit, inv_norm = ctx.saved_tensors
        return tangent_(grad_unit.clone(), unit).mul_(inv_norm[:, None])


def normalize_rows(x: torch.Tensor) -> torch.Tensor:
    """L2-normalise the rows of ``x [N, D]`` (same values as :func:`dmlkit.distances.l2_normalize`)."""
    return _RowNormalize.apply(x)
