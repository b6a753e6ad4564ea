"""Numerically stable reductions shared by the proxy losses."""

from __future__ import annotations

import torch


def common_dtype(embeddings: torch.Tensor, proxies: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cast both to their promoted dtype (the cast is differentiable, the Parameter keeps its dtype)."""
    dtype = torch.promote_types(embeddings.dtype, proxies.dtype)
    return embeddings.to(dtype), proxies.to(dtype)


def inverse_row_norms(x: torch.Tensor) -> torch.Tensor:
    """``1 / max(||x_r||, 1e-12)`` for every row ``r`` of ``x [N, D]``."""
    return torch.linalg.vector_norm(x, dim=1).clamp_min(1e-12).reciprocal()


def _largest_entries(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``max |x|`` along ``dim`` (kept), detached; 1 for a zero vector (its gradient stays as ``F.normalize``'s)."""
    top = x.detach().abs().amax(dim=dim, keepdim=True)
    return torch.where(top > 0, top, torch.ones_like(top))


def safe_norms(x: torch.Tensor, dim: int) -> torch.Tensor:
    """L2 norms along ``dim`` that neither overflow nor underflow (each vector scaled by its largest entry
    first, a detached factor: the norm is exact and so is its gradient)."""
    top = _largest_entries(x, dim)
    return torch.linalg.vector_norm(x / top, dim=dim) * top.squeeze(dim)


def unit_vectors(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``x / |x|`` along ``dim`` for any magnitude (0 for a zero vector): scaled by its largest entry
    first, a non-zero vector's norm is then at least 1, so nothing over- or underflows."""
    scaled = x / _largest_entries(x, dim)
    return scaled / torch.linalg.vector_norm(scaled, dim=dim, keepdim=True).clamp_min(1e-12)


class _UnitRows(torch.autograd.Function):
    """:func:`unit_vectors` along rows, with its gradient written out: ``(g - u <u, g>) / max(|x / t|, 1e-12) / t``
    per row (``t`` the row's largest ``|x|``, 1 for a zero row), in a handful of operators instead of autograd's
    two dozen through the scaling, the norm and its clamp."""

    @staticmethod
    def forward(ctx, x):
        top = x.abs().amax(dim=1, keepdim=True)
        top = torch.where(top > 0, top, 1.0)
        scaled = x / top
        norm = torch.linalg.vector_norm(scaled, dim=1, keepdim=True).clamp_min_(1e-12)
        unit = scaled.div_(norm)
        ctx.save_for_backward(unit, norm, top)
        return unit

    @staticmethod
    def backward(ctx, grad_unit):
        unit, norm, top = ctx.saved_tensors
        return torch.addcmul(grad_unit, unit, row_dots(unit, grad_unit)[:, None], value=-1.0).div_(norm).div_(top)


def unit_rows(x: torch.Tensor) -> torch.Tensor:
    """``unit_vectors(x, 1)`` for ``x [N, D]`` (same values) as one autograd node (no double backward)."""
    return _UnitRows.apply(x)


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
