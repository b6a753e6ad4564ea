"""Pairwise measures with an analytic backward, for losses that know d(loss)/d(matrix).

At typical batch sizes a pair loss costs per-operation overhead, not arithmetic: autograd
records every elementwise step of the distance and the loss and replays each backwards. The
losses built on :class:`Pairwise` instead compute the ``[B, R]`` matrix, the loss value and
the coefficient ``G = d(loss) / d(matrix)`` without autograd, and one autograd node maps
``G`` to the embeddings with the chain rule of the measure:

* dot product ``s = x r^T``: ``dx = G r``, ``dr = G^T x``;
* cosine ``s = x_n r_n^T`` with ``x_n = x / max(|x|, eps)``: ``dx_n = G r_n`` then
  ``dx = (dx_n - x_n <dx_n, x_n>) / |x|`` (``dx_n / eps`` below ``eps``);
* Euclidean between normalised rows, ``d^2 = |x_n|^2 + |r_n|^2 - 2 s``: ``d(d)/d(s) = -1/d``
  (squared: ``-2``), zero at coincident points as in the forward's threshold;
* Euclidean ``d^2 = |x|^2 + |r|^2 - 2 x r^T``: ``dx = 2 (x rowsum(G') - G' r)`` with
  ``G' = G / (2d)`` (squared: ``G``).

Any other distance (a user subclass) keeps autograd: its matrix is computed on the graph
and ``G`` is attached to it. Values equal those of ``distance.matrix``.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable
from torch.nn.functional import threshold

from dmlkit._cpu_ops import matmul_nt
from dmlkit.distances import BaseDistance
from dmlkit.losses.pair.terms import attach_gradient

#: Norm floor of L2 normalisation (as ``l2_normalize``) and squared-distance floor of the roots.
EPS = 1e-12


class Pairwise:
    """``distance(x [B, D], refs [R, D]) -> mat [B, R]`` (no autograd) and its vector-Jacobian product.

    ``same_set`` means ``refs is x`` (one gradient, both roles summed). :meth:`attach` returns
    a scalar equal to ``value`` whose gradient w.r.t. ``x`` and ``refs`` is that of
    ``sum(coefficient * mat)``.
    """

    def __init__(
        self,
        distance: BaseDistance,
        x: torch.Tensor,
        refs: torch.Tensor,
        same_set: bool,
        rows: torch.Tensor | None = None,
        cols: torch.Tensor | None = None,
    ):
        self.kind = distance.analytic_form
        self.rows = self.cols = None
        if rows is not None:  # the [rows, cols] block of the batch matrix (same set)
            if self.kind in ("cosine", "dot"):
                self.rows, self.cols = rows, cols
            else:
                x, refs, same_set = x.index_select(0, rows), x.index_select(0, cols), False
        self.x, self.refs, self.same_set = x, refs, same_set
        self.power = getattr(distance, "power", 1)
        self.graph = None
        if self.kind is None:  # unknown measure: autograd through the distance itself
            self.graph = distance(x, x if same_set else refs)
            self.mat = self.graph.detach()
            return
        with torch.no_grad():
            xd = x.detach()
            self._forward(xd, xd if same_set else refs.detach())

    def _forward(self, x: torch.Tensor, r: torch.Tensor) -> None:
        self.xd, self.rd = x, r
        if self.kind == "dot":
            self.mat = self._block(x)
            return
        if self.kind == "lp":
            xx = (x * x).sum(1, keepdim=True)
            rr = xx.T if self.same_set else (r * r).sum(1)
            raw = (x @ x.T if self.same_set else cross_product(x, r)).mul_(-2.0).add_(xx).add_(rr)
            self.nonneg = raw >= 0
            self.mat = self._root(raw.clamp_min_(0.0))
            return
        # cosine / normalised Euclidean: scale the product instead of normalising a large r.
        x_norm = torch.linalg.vector_norm(x, dim=1, keepdim=True)
        self.x_big = x_norm > EPS
        self.x_scale = x_norm.clamp_min(EPS).reciprocal_()
        self.xn = x * self.x_scale
        if self.rows is not None:
            self.mat = self._block(self.xn)
            return
        if self.same_set:
            r_norm, self.r_scale = x_norm.T, self.x_scale.T
        else:
            r_norm = torch.linalg.vector_norm(r, dim=1, keepdim=True).T
            self.r_scale = r_norm.clamp_min(EPS).reciprocal_()
        self.r_norm = r_norm
        product = self.xn @ self.xn.T if self.same_set else cross_product(self.xn, r)
        if self.kind == "cosine":
            self.mat = product if self.same_set else product.mul_(self.r_scale)
            return
        # |x_n|^2 + |r_n|^2 - 2 cos; the squared norms are 1 (0 for a zero or overflowing row).
        x_sq = (x_norm * self.x_scale).nan_to_num_(0.0).square_()
        r_sq = x_sq.T if self.same_set else (r_norm * self.r_scale).nan_to_num_(0.0).square_()
        if self.same_set:
            raw = torch.add(x_sq, product, alpha=-2.0)
        else:
            raw = torch.addcmul(x_sq, product, self.r_scale, value=-2.0)
        self.mat = self._root(raw.add_(r_sq))

    def _block(self, x: torch.Tensor) -> torch.Tensor:
        """``x x^T``, or its ``[rows, cols]`` block."""
        if self.rows is None:
            return x @ x.T if self.same_set else cross_product(x, self.rd)
        self.row_x, self.col_x = x.index_select(0, self.rows), x.index_select(0, self.cols)
        return self.row_x @ self.col_x.T

    def _root(self, sq: torch.Tensor) -> torch.Tensor:
        """The root for ``power=1``, exact zeros below ``EPS`` (always so between normalised rows)."""
        if self.power == 2 and self.kind == "lp":
            return sq
        sq = threshold(sq, EPS, 0.0, inplace=True)
        return sq if self.power == 2 else sq.sqrt_()

    # -- backward ---------------------------------------------------------------------------
    def _through_root(
        self, coefficient: torch.Tensor, factor: float | torch.Tensor = 1.0, mat: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``factor`` d(loss)/d(squared distance) from d(loss)/d(mat); zero at coincident points.

        ``mat`` is the matrix (or the columns of it) that ``coefficient`` belongs to.
        """
        mat = self.mat if mat is None else mat
        if self.power == 2:
            if self.kind == "lp":
                return coefficient
            return coefficient * (mat > 0) * factor
        # G / (2 d): d = 0 gives inf or nan, mapped to 0 (the forward's zero subgradient).
        return torch.div(coefficient, mat).nan_to_num_(0.0, 0.0, 0.0).mul_(factor * 0.5)

    def grads(self, coefficient: torch.Tensor, need_x: bool, need_refs: bool):
        """Gradients ``(dx, drefs)`` of ``sum(coefficient * mat)`` (``drefs`` is None for the same set)."""
        x, r = self.xd, self.rd
        if self.rows is not None:
            g = torch.zeros_like(x)
            g.index_add_(0, self.rows, coefficient @ self.col_x).index_add_(0, self.cols, coefficient.T @ self.row_x)
            return (g if self.kind == "dot" else self._unnormalise(g, self.xn, self.x_scale, self.x_big)), None
        if self.kind == "dot":
            return self._linear(coefficient, x, r, need_x, need_refs)
        if self.kind == "lp":
            g = self._through_root(coefficient) * self.nonneg
            gx, gr = self._linear(g, x, r, need_x, need_refs)
            # d|x - r|^2 = 2 (x - r): gx = 2 (x rowsum(g) - g r), gr = 2 (r colsum(g) - g^T x).
            if self.same_set:
                gx = (x * (g.sum(1, keepdim=True) + g.sum(0).unsqueeze(1))).sub_(gx).mul_(2.0)
                return gx, None
            if gx is not None:
                gx = (x * g.sum(1, keepdim=True)).sub_(gx).mul_(2.0)
            if gr is not None:
                gr = (r * g.sum(0).unsqueeze(1)).sub_(gr).mul_(2.0)
            return gx, gr
        if self.same_set:
            # d(d)/d(cos) = -2 d(d)/d(d^2)
            g = coefficient if self.kind == "cosine" else self._through_root(coefficient, -2.0)
            gxn = (g + g.T) @ self.xn
            return self._unnormalise(gxn, self.xn, self.x_scale, self.x_big), None
        gx = gr = None
        if need_x and not need_refs:  # e.g. a memory: only the columns with a gradient
            mat, r_scale = self.mat, self.r_scale
            used = _used_columns(coefficient)
            if used is not None:
                coefficient, mat = _columns(coefficient, used), _columns(mat, used)
                r, r_scale = r.index_select(0, used), r_scale.index_select(1, used)
            # 1/|r| (and d(d)/d(cos) = -2 d(d)/d(d^2)) folded into one pass.
            if self.kind == "cosine":
                g = coefficient * r_scale
            else:
                g = self._through_root(coefficient, r_scale * -2.0, mat)
            return self._unnormalise(g @ r, self.xn, self.x_scale, self.x_big), None
        g = coefficient if self.kind == "cosine" else self._through_root(coefficient, -2.0)
        if need_x:
            gx = self._unnormalise((g * self.r_scale) @ r, self.xn, self.x_scale, self.x_big)
        if need_refs:
            rn = r * self.r_scale.T
            gr = self._unnormalise(g.T @ self.xn, rn, self.r_scale.T, self.r_norm.T > EPS)
        return gx, gr

    def _linear(self, g, x, r, need_x, need_refs):
        """Gradients of ``sum(g * (x r^T))``."""
        if self.same_set:
            return (g + g.T) @ x, None
        return (g @ r if need_x else None), (g.T @ x if need_refs else None)

    @staticmethod
    def _unnormalise(g_n: torch.Tensor, x_n: torch.Tensor, scale: torch.Tensor, big: torch.Tensor) -> torch.Tensor:
        """Back through ``x_n = x / max(|x|, eps)``: ``(g - x_n <g, x_n>) / |x|`` (``g / eps`` below eps)."""
        radial = (g_n * x_n).sum(1, keepdim=True).mul_(big)
        return torch.addcmul(g_n, x_n, radial, value=-1.0).mul_(scale)

    def attach(self, value: torch.Tensor, coefficient: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        """``value`` (no graph) as a scalar whose gradient is that of ``sum(scale * coefficient * mat)``."""
        if self.graph is not None:  # autograd graph of an unknown measure: route the coefficient to it
            return attach_gradient(value, (self.graph, coefficient if scale is None else coefficient * scale))
        refs = None if self.same_set else self.refs
        return _Attach.apply(value, self, self.x, refs, coefficient, scale)


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


def _used_columns(g: torch.Tensor) -> torch.Tensor | None:
    """Indices of the columns of ``g [B, R]`` that are not all zero, when few enough to gather.

    With a large memory most references usually carry no gradient (inactive hinges), and the
    dense backward would pass over all ``[B, R]`` entries and read all of the memory; the
    gathered product is the same. None: use every column.
    """
    if g.shape[1] < SPARSE_MIN_REFERENCES:
        return None
    used = (g.amax(0).ne(0) | g.amin(0).ne(0)).nonzero().squeeze(1)  # no |g| copy of [B, R]
    return None if used.numel() * 4 > g.shape[1] else used


def _columns(mat: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``mat[:, index]``, gathered as rows when ``mat`` is stored reference-major (no full copy)."""
    if mat.stride(0) == 1 and mat.stride(1) != 1:
        return mat.T.index_select(0, index).T
    return mat.index_select(1, index)


class _Attach(torch.autograd.Function):
    """Identity on the loss value; backward maps ``grad * coefficient`` through the measure."""

    @staticmethod
    def forward(ctx, value, pairwise, x, refs, coefficient, scale):  # noqa: D102 - autograd protocol
        ctx.pairwise, ctx.coefficient, ctx.scale = pairwise, coefficient, scale
        return value.clone()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):  # noqa: D102 - autograd protocol
        if ctx.scale is not None:
            grad = grad * ctx.scale
        gx, gr = ctx.pairwise.grads(ctx.coefficient, ctx.needs_input_grad[2], ctx.needs_input_grad[3])
        gx = None if gx is None or not ctx.needs_input_grad[2] else gx * grad
        gr = None if gr is None or not ctx.needs_input_grad[3] else gr * grad
        return None, None, gx, gr, None, None


