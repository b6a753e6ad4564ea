"""Proxy losses over the proxy-by-sample similarity matrix with analytic gradients in one sweep.

Every proxy loss here is ``l(z)`` of the scaled cosines ``z = scale * pn xn^T [P, B]`` between
the normalised proxies ``pn = p / ||p||`` and the normalised batch ``xn [B, D]`` (proxy-major:
``z[p, i]``; this ``[P, B]`` product is the fastest of the three matrix products on CPU BLAS).
A *kernel* turns ``z`` (which it may overwrite) into the loss and, when a gradient is needed,
``G = dl/dz`` (in the same buffer), optionally with a per-sample factor ``r`` so that the
gradient is ``G_pi r_i``. :class:`_FusedProxyLoss` then chains ``G`` through ``z`` and the
proxy normalisation:

* ``dl/dxn = scale * diag(r) G^T pn``;
* ``dl/dp = scale / ||p|| * (M - pn <pn, M>)`` with ``M = G diag(r) xn``.

Both are computed in the forward pass (the ``[P, B]`` matrix and the normalised proxies are
then freed instead of being kept for backward), so ``backward`` only multiplies by the incoming
scalar gradient. Second-order gradients are not supported.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple

import torch
from torch.autograd.function import once_differentiable

from dmlkit.losses.proxy._math import inverse_row_norms, tangent_

#: ``kernel(z [P, B], need_grad) -> (loss, G [P, B] or None, r [B] or None)``.
Kernel = Callable[[torch.Tensor, bool], Tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]]


class Workspace:
    """Scratch buffers reused across calls for the ``[P, B]`` logits and the ``[P, D]`` unit proxies.

    Both are consumed inside one forward, so reusing them is safe; a fresh multi-MB tensor per
    step costs page faults (about a quarter of the logits product at SOP scale on CPU).
    """

    def __init__(self) -> None:
        self._buffers: Dict[str, torch.Tensor] = {}

    def get(self, name: str, shape: Tuple[int, int], like: torch.Tensor) -> torch.Tensor:
        buffer = self._buffers.get(name)
        if buffer is None or buffer.shape != shape or buffer.dtype != like.dtype or buffer.device != like.device:
            buffer = torch.empty(shape, dtype=like.dtype, device=like.device)
            self._buffers[name] = buffer
        return buffer


class _FusedProxyLoss(torch.autograd.Function):
    """``kernel(scale * pn xn^T)`` with the gradients of the module docstring, found in ``forward``."""

    @staticmethod
    def forward(ctx, xn, proxies, kernel, scale, need_xn, need_proxies, workspace):
        inv_norm = inverse_row_norms(proxies)
        if workspace is None:
            unit = proxies * inv_norm[:, None]
            z = torch.mm(unit, (xn * scale).T.contiguous())
        else:
            unit = torch.mul(proxies, inv_norm[:, None], out=workspace.get("unit", tuple(proxies.shape), proxies))
            z = workspace.get("logits", (proxies.shape[0], xn.shape[0]), unit)
            torch.mm(unit, (xn * scale).T.contiguous(), out=z)
        loss, grad_z, row_factor = kernel(z, need_xn or need_proxies)
        grad_xn = grad_proxies = proxy_scale = None
        if need_xn:
            grad_xn = torch.mm(grad_z.T, unit).mul_(scale if row_factor is None else scale * row_factor[:, None])
        if need_proxies:
            weighted = xn if row_factor is None else xn * row_factor[:, None]
            grad_proxies = tangent_(torch.mm(grad_z, weighted), unit)
            proxy_scale = inv_norm * scale
        ctx.save_for_backward(grad_xn, grad_proxies, proxy_scale)
        return loss

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output):
        grad_xn, grad_proxies, proxy_scale = ctx.saved_tensors
        if grad_xn is not None:
            grad_xn = grad_xn * grad_output
        if grad_proxies is not None:
            grad_proxies = grad_proxies * (proxy_scale * grad_output)[:, None]
        return grad_xn, grad_proxies, None, None, None, None, None


def fused_proxy_loss(
    xn: torch.Tensor,
    proxies: torch.Tensor,
    kernel: Kernel,
    scale: float,
    workspace: Optional[Workspace] = None,
) -> torch.Tensor:
    """``kernel`` applied to ``z = scale * normalize(proxies) xn^T [P, B]``, differentiable in ``xn`` and ``proxies``.

    ``xn [B, D]`` must already be normalised (its own normalisation stays in autograd); ``proxies
    [P, D]`` are raw. With ``K`` proxies per class (class-major), ``z.view(C, K, B)`` groups each
    class's proxies, and reductions over ``K`` run along a contiguous batch dimension.
    """
    grad = torch.is_grad_enabled()
    return _FusedProxyLoss.apply(
        xn, proxies, kernel, float(scale), grad and xn.requires_grad, grad and proxies.requires_grad, workspace
    )
