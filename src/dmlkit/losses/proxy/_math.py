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
    """``x / max(|x|, 1e-12)`` per row with its gradient written out, ``(g - u <u, g>) / max(|x|, 1e-12)``: a handful of
    operators where autograd dispatches two dozen through the norm and its clamp.

    ``guard_range``: each row is first divided by its largest ``|x|`` (1 for a zero row), as :func:`unit_vectors`,
    so that no norm over- or underflows; the gradient is then divided by that factor too.
    """

    @staticmethod
    def forward(ctx, x, guard_range):
        top = None
        if guard_range:
            top = x.abs().amax(dim=1, keepdim=True)
            top = torch.where(top > 0, top, 1.0)
            x = x / top
        norm = torch.linalg.vector_norm(x, dim=1, keepdim=True).clamp_min_(1e-12)
        unit = x / norm
        ctx.save_for_backward(unit, norm, top)
        return unit

    @staticmethod
    def backward(ctx, grad_unit):
        unit, norm, top = ctx.saved_tensors
        grad = torch.addcmul(grad_unit, unit, row_dots(unit, grad_unit)[:, None], value=-1.0).div_(norm)
        return (grad if top is None else grad.div_(top)), None


def unit_rows(x: torch.Tensor) -> torch.Tensor:
    """``unit_vectors(x, 1)`` for ``x [N, D]`` (same values) as one autograd node."""
    return _UnitRows.apply(x, True)


def normalize_rows(x: torch.Tensor) -> torch.Tensor:
    """L2-normalise the rows of ``x [N, D]`` (the values of :func:`dmlkit.distances.l2_normalize`) as one autograd
    node."""
    return _UnitRows.apply(x, False)


def row_dots(a: torch.Tensor, b: torch.Tensor, scratch: torch.Tensor | None = None) -> torch.Tensor:
    """``<a_r, b_r>`` for every row of ``a, b [N, D]`` (product then sum, which beats ``bmm`` on CPU).

    ``scratch`` (same shape and dtype) receives the product instead of a fresh ``[N, D]`` tensor.
    """
    return torch.mul(a, b, out=scratch).sum(dim=1) if scratch is not None else (a * b).sum(dim=1)


def tangent_(grad_unit: torch.Tensor, unit: torch.Tensor, scratch: torch.Tensor | None = None) -> torch.Tensor:
    """In place ``g - u <u, g>`` per row: the gradient through ``u = x / ||x||``, before the ``1/||x||``."""
    return grad_unit.addcmul_(unit, row_dots(unit, grad_unit, scratch)[:, None], value=-1.0)
