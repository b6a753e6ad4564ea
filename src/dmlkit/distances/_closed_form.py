"""Shared steps of the distances' closed-form matrices and backward passes.

Each distance with a closed-form gradient (:meth:`BaseDistance.matrix_forward` and
:meth:`BaseDistance.matrix_backward`) writes its own chain rule; the steps several of them share
live here: the product of the two sets (reference-major against a large set), its vector-Jacobian
product, the normalised product of cosine and normalised Euclidean and the backward through
``x / max(|x|, eps)``, and the column-sparse backward against a large reference set.
"""

from __future__ import annotations

from typing import Callable

import torch

from dmlkit.core.cpu_ops import matmul_nt

#: Norm floor of L2 normalisation (as ``l2_normalize``) and squared-distance floor of the roots.
EPS = 1e-12

#: Reference sets at least this large get the column-sparse backward product.
SPARSE_MIN_REFERENCES = 4096

#: Reference sets at least this large are multiplied reference-major (see :func:`cross_product`).
REFERENCE_MAJOR_MIN_REFERENCES = 4096


def reference_major(num_references: int) -> bool:
    """Whether ``[B, R]`` matrices against ``num_references`` references are stored ``[R, B]``."""
    return num_references >= REFERENCE_MAJOR_MIN_REFERENCES


def cross_product(x: torch.Tensor, refs: torch.Tensor) -> torch.Tensor:
    """``x [B, D] @ refs[R, D]^T -> [B, R]``; for a large reference set, the transposed view of ``refs @ x^T``.

    With few anchors and many references (a memory) the GEMM is skinny, and on CPU BLAS it
    runs faster with the large operand as the row side. The result then lives as ``[R, B]``
    in memory (strides ``(1, B)``); elementwise operations keep that layout, so pair masks
    built the same way (:class:`~dmlkit.memory.CrossBatchMemory`) cost no strided access.
    """
    if reference_major(refs.shape[0]):
        return matmul_nt(refs, x).T
    return x @ refs.T


def unnormalise(g_n: torch.Tensor, x_n: torch.Tensor, scale: torch.Tensor, big: torch.Tensor) -> torch.Tensor:
    """Back through ``x_n = x / max(|x|, eps)``: ``(g - x_n <g, x_n>) / |x|`` (``g / eps`` below eps)."""
    radial = (g_n * x_n).sum(1, keepdim=True).mul_(big)
    return torch.addcmul(g_n, x_n, radial, value=-1.0).mul_(scale)


class MatrixContext:
    """A distance matrix computed without autograd (``mat``) and what its backward reads.

    ``x [B, D]`` and ``refs [R, D]`` are detached; ``same_set`` means ``refs is x`` (one
    gradient, both roles summed). ``rows`` and ``cols`` (same set only, for a distance with
    ``supports_blocks``) make ``mat`` the ``[rows, cols]`` block of the ``[B, B]`` matrix. Each
    distance stores here the further tensors its :meth:`~BaseDistance.matrix_backward` needs.
    """

    def __init__(
        self,
        x: torch.Tensor,
        refs: torch.Tensor,
        same_set: bool,
        rows: torch.Tensor | None = None,
        cols: torch.Tensor | None = None,
    ):
        self.x, self.refs, self.same_set, self.rows, self.cols = x, refs, same_set, rows, cols
        self.mat: torch.Tensor | None = None

    # -- the product of the two sets --------------------------------------------------------
    def product(self, a: torch.Tensor) -> torch.Tensor:
        """``a a^T`` (same set), ``a refs^T``, or the ``[rows, cols]`` block of ``a a^T``."""
        if self.rows is None:
            return a @ a.T if self.same_set else cross_product(a, self.refs)
        self.row_a, self.col_a = a.index_select(0, self.rows), a.index_select(0, self.cols)
        return self.row_a @ self.col_a.T

    def product_backward(self, g: torch.Tensor, need_x: bool, need_refs: bool):
        """Gradients ``(dx, drefs)`` of ``sum(g * (x refs^T))``: ``dx = g refs``, ``drefs = g^T x``.

        Same set: ``dx = (g + g^T) x``; a block sends ``g col_x`` to its rows and ``g^T row_x``
        to its columns.
        """
        x = self.x
        if self.rows is not None:
            g_x = torch.zeros_like(x)
            g_x.index_add_(0, self.rows, g @ self.col_a).index_add_(0, self.cols, g.T @ self.row_a)
            return g_x, None
        if self.same_set:
            return (g + g.T) @ x, None
        return (g @ self.refs if need_x else None), (g.T @ x if need_refs else None)

    # -- the normalised product (cosine, Euclidean between normalised rows) ------------------
    def normalised_product(self) -> torch.Tensor:
        """``x_n refs^T`` with ``x_n = x / max(|x|, eps)`` (the same-set ``x_n x_n^T``, or its block).

        Against another set the product is left to be scaled by ``r_scale = 1 / max(|r|, eps)``
        instead of normalising ``refs`` (possibly a large memory) row by row.
        """
        x = self.x
        self.x_norm = torch.linalg.vector_norm(x, dim=1, keepdim=True)
        self.x_big = self.x_norm > EPS
        self.x_scale = self.x_norm.clamp_min(EPS).reciprocal_()
        self.xn = x * self.x_scale
        if self.rows is not None:
            return self.product(self.xn)
        if self.same_set:
            self.r_norm, self.r_scale = self.x_norm.T, self.x_scale.T
            return self.xn @ self.xn.T
        self.r_norm = torch.linalg.vector_norm(self.refs, dim=1, keepdim=True).T
        self.r_scale = self.r_norm.clamp_min(EPS).reciprocal_()
        return cross_product(self.xn, self.refs)

    def normalised_backward(
        self,
        grad: torch.Tensor,
        need_x: bool,
        need_refs: bool,
        to_cosine: Callable[[torch.Tensor, torch.Tensor | None, torch.Tensor], torch.Tensor],
    ):
        """Gradients ``(dx, drefs)`` of ``sum(grad * mat)`` for a function of the cosine matrix.

        ``to_cosine(grad, scale, mat)`` is the measure's ``d(loss)/d(cos)`` (times ``scale``
        unless None) from ``grad = d(loss)/d(mat)``. Then ``dx_n = G_cos r_n`` and
        :func:`unnormalise`; ``drefs`` likewise from ``G_cos^T x_n``. Only ``x`` needing a
        gradient against a large set (a memory) gathers the columns that carry one.
        """
        xn, x_scale, x_big = self.xn, self.x_scale, self.x_big
        if self.rows is not None:
            g_xn, _ = self.product_backward(to_cosine(grad, None, self.mat), True, False)
            return unnormalise(g_xn, xn, x_scale, x_big), None
        if self.same_set:
            g = to_cosine(grad, None, self.mat)
            return unnormalise((g + g.T) @ xn, xn, x_scale, x_big), None
        r, r_scale = self.refs, self.r_scale
        if need_x and not need_refs:  # e.g. a memory: only the columns with a gradient
            mat = self.mat
            used = used_columns(grad)
            if used is not None:
                grad, mat = columns(grad, used), columns(mat, used)
                r, r_scale = r.index_select(0, used), r_scale.index_select(1, used)
            # 1/|r| folded into the same pass.
            return unnormalise(to_cosine(grad, r_scale, mat) @ r, xn, x_scale, x_big), None
        g = to_cosine(grad, None, self.mat)
        gx = gr = None
        if need_x:
            gx = unnormalise((g * r_scale) @ r, xn, x_scale, x_big)
        if need_refs:
            rn = r * r_scale.T
            gr = unnormalise(g.T @ xn, rn, r_scale.T, self.r_norm.T > EPS)
        return gx, gr


def used_columns(g: torch.Tensor) -> torch.Tensor | None:
    """Indices of the columns of ``g [B, R]`` that are not all zero, when few enough to gather.

    With a large memory most references usually carry no gradient (inactive hinges), and the
    dense backward would pass over all ``[B, R]`` entries and read all of the memory; the
    gathered product is the same. None: use every column.
    """
    if g.shape[1] < SPARSE_MIN_REFERENCES:
        return None
    used = (g.amax(0).ne(0) | g.amin(0).ne(0)).nonzero().squeeze(1)  # no |g| copy of [B, R]
    return None if used.numel() * 4 > g.shape[1] else used


def columns(mat: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``mat[:, index]``, gathered as rows when ``mat`` is stored reference-major (no full copy)."""
    if mat.stride(0) == 1 and mat.stride(1) != 1:
        return mat.T.index_select(0, index).T
    return mat.index_select(1, index)
