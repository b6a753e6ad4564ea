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

**Product precision.** With ``matmul_precision="highest"`` (the default) everything is fp32 (or
fp64). ``"medium"`` runs the three ``[P, D] x [D, B]``-sized products in bfloat16, as
``torch.set_float32_matmul_precision("medium")`` allows for fp32 products: the unit proxies,
the scaled batch and ``G`` are rounded to bf16 (8 significant bits) and the products' outputs
too, except for the proxies of the classes in the batch (all positives; at most ``B*K`` rows),
whose logits and gradients are redone in fp32. The kernel (log-sum-exps, the loss, ``G``) and
the proxy-normalisation gradient run in fp32 on the upcast logits. The negatives' logits then
carry an absolute error of about ``scale * 2^-8``; at SOP scale the loss moves by ~1e-5
relative and the gradients by 0.01-0.3%, as under bf16 autocast. Rules that pick a proxy by
``argmax`` over all proxies (Proxy-NCA ``assignment="dynamic"``) may pick differently on near
ties. It pays where bf16 products are native (CPUs with AVX512-BF16 or AMX, recent GPUs).
"""

from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple

import torch
from torch.autograd.function import once_differentiable

from dmlkit.core.cpu_ops import matmul_nt
from dmlkit.losses.proxy._math import inverse_row_norms, tangent_

_LOW = torch.bfloat16

#: ``kernel(z [P, B], need_grad) -> (loss, G [P, B] or None, r [B] or None)``.
Kernel = Callable[[torch.Tensor, bool], Tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]]

#: Valid ``matmul_precision`` values, named after ``torch.set_float32_matmul_precision``'s levels.
MATMUL_PRECISIONS = ("highest", "medium")


class Workspace:
    """Scratch buffers reused across calls: the ``[P, D]`` unit proxies and tangent product, and
    (``"medium"``) the bf16 operands and the ``[P, B]`` logits.

    All are consumed inside one forward, so reusing them is safe; a fresh multi-MB tensor per
    step costs page faults (about a quarter of the logits product at SOP scale on CPU).
    """

    def __init__(self) -> None:
        self._buffers: Dict[str, torch.Tensor] = {}

    def get(
        self, name: str, shape: Tuple[int, int], like: torch.Tensor, dtype: Optional[torch.dtype] = None
    ) -> torch.Tensor:
        """The buffer ``name`` with ``shape`` on ``like``'s device, in ``dtype`` (default ``like``'s)."""
        dtype = like.dtype if dtype is None else dtype
        buffer = self._buffers.get(name)
        if buffer is None or buffer.shape != shape or buffer.dtype != dtype or buffer.device != like.device:
            buffer = torch.empty(shape, dtype=dtype, device=like.device)
            self._buffers[name] = buffer
        return buffer


class _FusedProxyLoss(torch.autograd.Function):
    """``kernel(scale * pn xn^T)`` with the gradients of the module docstring, found in ``forward``."""

    @staticmethod
    def forward(ctx, xn, proxies, kernel, scale, need_xn, need_proxies, workspace, exact_rows, exact_first):
        workspace = Workspace() if workspace is None else workspace
        inv_norm = inverse_row_norms(proxies)
        shape = (proxies.shape[0], xn.shape[0])
        unit = torch.mul(proxies, inv_norm[:, None], out=workspace.get("unit", tuple(proxies.shape), proxies))
        scaled = xn * scale
        if exact_rows is None:
            unit_low = unit
            z = matmul_nt(unit, scaled)
        else:
            # bf16 operands and products, then the rows ``exact_rows`` redone in fp32; the kernel and
            # all elementwise work in fp32 (same-dtype ops and plain casts: mixed-dtype ones are slow)
            unit_low = workspace.get("unit_low", tuple(proxies.shape), proxies, _LOW).copy_(unit)
            low = workspace.get("logits_low", shape, proxies, _LOW)
            torch.mm(unit_low, scaled.to(_LOW).T, out=low)
            z = workspace.get("logits", shape, proxies).copy_(low)
            exact_unit = unit.index_select(0, exact_rows)
            z.index_copy_(0, exact_rows, torch.mm(exact_unit, scaled.T))
        loss, grad_z, row_factor = kernel(z, need_xn or need_proxies)
        grad_xn = grad_proxies = None
        if grad_z is not None and exact_rows is not None:
            exact_grad = grad_z.index_select(0, exact_rows)
            if exact_first is not None:  # a repeated row counts once: its copies add zeros below
                exact_grad.mul_(exact_first[:, None])
            grad_z = low.copy_(grad_z).index_fill_(0, exact_rows, 0.0)
        if need_xn:
            grad_xn = torch.mm(grad_z.T, unit_low).to(xn.dtype)
            if exact_rows is not None:
                grad_xn.addmm_(exact_grad.T, exact_unit)
            grad_xn.mul_(scale if row_factor is None else scale * row_factor[:, None])
        if need_proxies:
            weighted = xn if row_factor is None else xn * row_factor[:, None]
            grad_unit = matmul_nt(grad_z, weighted.T.to(grad_z.dtype)).to(proxies.dtype)
            if exact_rows is not None:
                grad_unit.index_fill_(0, exact_rows, 0.0).index_add_(0, exact_rows, torch.mm(exact_grad, weighted))
            grad_proxies = tangent_(grad_unit, unit, workspace.get("product", tuple(proxies.shape), unit))
            grad_proxies.mul_((inv_norm * scale)[:, None])
        ctx.save_for_backward(grad_xn, grad_proxies)
        return loss

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output):
        grad_xn, grad_proxies = ctx.saved_tensors
        if grad_xn is not None:
            grad_xn = grad_xn * grad_output
        if grad_proxies is not None:
            grad_proxies = grad_proxies * grad_output
        return grad_xn, grad_proxies, None, None, None, None, None, None, None


def fused_proxy_loss(
    xn: torch.Tensor,
    proxies: torch.Tensor,
    kernel: Kernel,
    scale: float,
    workspace: Optional[Workspace] = None,
    matmul_precision: str = "highest",
    exact_rows: Optional[torch.Tensor] = None,
    exact_first: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``kernel`` applied to ``z = scale * normalize(proxies) xn^T [P, B]``, differentiable in ``xn`` and ``proxies``.

    ``xn [B, D]`` must already be normalised (its own normalisation stays in autograd); ``proxies
    [P, D]`` are raw. With ``K`` proxies per class (class-major), ``z.view(C, K, B)`` groups each
    class's proxies, and reductions over ``K`` run along a contiguous batch dimension.
    ``matmul_precision="medium"`` runs the products in bf16 (see the module docstring) except
    for the proxies ``exact_rows`` (those of the batch's classes: every positive), which stay
    fp32; it applies to fp32 inputs only (fp64 stays exact). ``exact_rows`` may repeat a row (a block of
    :meth:`ProxyBank.batch_columns`, whose size does not depend on the labels' values) when ``exact_first``
    marks the first of each repeat.
    """
    if matmul_precision not in MATMUL_PRECISIONS:
        raise ValueError(f"matmul_precision must be one of {MATMUL_PRECISIONS}, got {matmul_precision!r}.")
    grad = torch.is_grad_enabled()
    if matmul_precision == "medium" and proxies.dtype == torch.float32:
        exact_rows = proxies.new_empty(0, dtype=torch.long) if exact_rows is None else exact_rows
    else:
        exact_rows = exact_first = None
    apply = _FusedProxyLoss.apply
    if torch.compiler.is_compiling():  # a compiled step (train.step_capture) runs this few-kernel loss eagerly:
        apply = torch.compiler.disable(apply)  # its forward writes the gradients, which tracing does not take
    return apply(
        xn, proxies, kernel, float(scale), grad and xn.requires_grad, grad and proxies.requires_grad, workspace,
        exact_rows, exact_first,
    )
