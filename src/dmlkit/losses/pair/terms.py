"""Pair terms: the matrix oriented as larger-is-farther, weighted sums, and the analytic-gradient nodes.

At typical batch sizes a pair loss costs per-operation overhead, not arithmetic: autograd
records every elementwise step of the distance and the loss and replays each backwards. Losses
that know ``G = d(loss)/d(matrix)`` instead compute the matrix (:class:`Pairwise`), their value
and ``G`` without autograd, and one autograd node maps ``G`` to the embeddings with the
distance's own chain rule (:meth:`~dmlkit.distances.BaseDistance.matrix_backward`), or to the
matrix itself (:func:`attach_gradient`, one multiplication in backward).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from dmlkit.distances import BaseDistance
from dmlkit.exceptions import InvalidParameterError
from dmlkit.losses.pair.batch import PairBatch

#: Largest number of elements one chunk of a [chunk, R] working tensor may hold.
CHUNK_ELEMENTS = 1 << 22


def dissimilarity(mat: torch.Tensor, distance: BaseDistance) -> torch.Tensor:
    """The matrix oriented so that larger means farther: ``-S`` for similarities, ``D`` for distances."""
    return -mat if distance.is_inverted else mat


def oriented(value: float | torch.Tensor, distance: BaseDistance) -> float | torch.Tensor:
    """A threshold given in the distance's own units, oriented like :func:`dissimilarity`."""
    return -value if distance.is_inverted else value


def weighted_sum(terms: torch.Tensor, mask: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``sum(weight * term)`` over the selected pairs, no normalisation (DRO weights rule)."""
    return torch.where(mask, weight * terms, terms.new_zeros(())).sum()


def in_input_precision(
    mat: torch.Tensor,
    distance: BaseDistance,
    batch: PairBatch,
    rows: torch.Tensor | None = None,
    cols: torch.Tensor | None = None,
) -> torch.Tensor:
    """``mat`` with the values PML's distance gives for float16 embeddings; ``mat`` itself otherwise.

    PML computes its matrix in the embeddings' dtype (each of the normalisation and the product
    rounded there) and its float16 tests compare against formulas evaluated that way; where a loss
    amplifies the matrix (Circle's ``gamma`` of 256) the rounding decides the result's last bit. The
    matrix (the ``[rows, cols]`` block of the same-set matrix when given) is then recomputed in the
    input dtype and taken to ``mat``'s dtype; the loss built on it still accumulates in float32, and
    the gradient is ``mat``'s (float32). Where the float16 value is not finite (a row whose norm
    underflows to 0 there, so PML's value is NaN) the float32 value stays.
    """
    if not batch.float16_input:
        return mat
    with torch.no_grad():
        low = batch.input_dtype
        x = batch.embeddings.to(low)
        if rows is not None:
            rounded = distance(x.index_select(0, rows), x.index_select(0, cols))
        else:
            rounded = distance(x, x if batch.same_set else batch.references.to(low))
        rounded = rounded.to(mat.dtype)
        rounded = torch.where(torch.isfinite(rounded), rounded, mat.detach())
    return mat + (rounded - mat).detach() if mat.requires_grad else rounded


def rounded_to_input(terms: torch.Tensor, batch: PairBatch) -> torch.Tensor:
    """Per-element ``terms`` (float32) rounded to float16 for float16 embeddings, as PML's per-element losses
    are before its reducer averages them; ``terms`` itself otherwise."""
    return terms.to(batch.input_dtype).to(terms.dtype) if batch.float16_input else terms


class _AttachGradient(torch.autograd.Function):
    """Identity on ``value``; routes ``grad * coefficient`` to ``tensor`` in backward."""

    @staticmethod
    def forward(ctx, value, tensor, coefficient):  # noqa: D102 - autograd protocol
        ctx.save_for_backward(coefficient)
        return value.clone()

    @staticmethod
    def backward(ctx, grad):  # noqa: D102 - autograd protocol
        (coefficient,) = ctx.saved_tensors
        return grad, grad * coefficient, None


def attach_gradient(value: torch.Tensor, *tensor_and_coefficient: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """A scalar equal to ``value`` whose gradient w.r.t. each tensor is its ``coefficient``.

    Used by losses that compute their value and the analytic derivative w.r.t. the distance
    matrix under ``no_grad`` (chunk by chunk for all-triplet losses, so memory stays
    ``O(B R)`` instead of ``O(B R^2)``); the backward pass is one multiplication.
    """
    out = value.detach()
    for tensor, coefficient in tensor_and_coefficient:
        out = _AttachGradient.apply(out, tensor, coefficient.detach())
    return out


class Pairwise:
    """``distance(x [B, D], refs [R, D]) -> mat [B, R]`` (no autograd) and the node of its gradient.

    ``same_set`` means ``refs is x`` (one gradient, both roles summed); ``rows`` and ``cols``
    ask for the ``[rows, cols]`` block of the same-set matrix. A distance with a closed-form
    gradient computes ``mat`` and later its backward itself; any other (a user subclass, a
    wrapped PML distance) is computed on the autograd graph and the coefficient is attached to
    it. :meth:`attach` returns a scalar equal to ``value`` whose gradient w.r.t. ``x`` and
    ``refs`` is that of ``sum(coefficient * mat)``.
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
        self.distance = distance
        closed_form = distance.has_closed_form
        if rows is not None and not (closed_form and distance.supports_blocks):
            x, refs, same_set, rows, cols = x.index_select(0, rows), x.index_select(0, cols), False, None, None
        self.x, self.refs, self.same_set = x, refs, same_set
        self.graph = self.context = None
        if not closed_form:  # autograd through the distance itself
            self.graph = distance(x, x if same_set else refs)
            self.mat = self.graph.detach()
            return
        with torch.no_grad():
            xd = x.detach()
            self.context = distance.matrix_forward(xd, xd if same_set else refs.detach(), same_set, rows, cols)
        self.mat = self.context.mat

    def attach(self, value: torch.Tensor, coefficient: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        """``value`` (no graph) as a scalar whose gradient is that of ``sum(scale * coefficient * mat)``."""
        if self.graph is not None:  # autograd graph of the measure: route the coefficient to it
            return attach_gradient(value, (self.graph, coefficient if scale is None else coefficient * scale))
        refs = None if self.same_set else self.refs
        return _AttachPairwise.apply(value, self, self.x, refs, coefficient, scale)


class _AttachPairwise(torch.autograd.Function):
    """Identity on the loss value; backward maps ``grad * coefficient`` through the distance."""

    @staticmethod
    def forward(ctx, value, pairwise, x, refs, coefficient, scale):  # noqa: D102 - autograd protocol
        ctx.pairwise, ctx.coefficient, ctx.scale = pairwise, coefficient, scale
        return value.clone()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):  # noqa: D102 - autograd protocol
        if ctx.scale is not None:
            grad = grad * ctx.scale
        pairwise = ctx.pairwise
        gx, gr = pairwise.distance.matrix_backward(
            pairwise.context, ctx.coefficient, ctx.needs_input_grad[2], ctx.needs_input_grad[3]
        )
        gx = None if gx is None or not ctx.needs_input_grad[2] else gx * grad
        gr = None if gr is None or not ctx.needs_input_grad[3] else gr * grad
        return None, None, gx, gr, None, None


def require_orientation(distance: BaseDistance, owner: str, similarity: bool, what: str) -> None:
    """Refuse a measure of the wrong direction for a loss whose equation fixes it (``what`` describes it)."""
    if distance.is_inverted != similarity:
        raise InvalidParameterError(f"The 'distance' parameter of {owner} must be {what}. Got {distance!r} instead.")


def count_divisor(reducer: object, num_selected: int | torch.Tensor, num_nonzero: torch.Tensor) -> int | torch.Tensor:
    """``reducer.divisor(num_selected, num_nonzero)``, at least 1 (no terms: a loss of 0, not NaN), in the counts'
    type: a count kept as a tensor is never read by the host (no synchronisation on a card)."""
    divisor = reducer.divisor(num_selected, num_nonzero)
    return divisor.clamp_min(1) if isinstance(divisor, torch.Tensor) else max(divisor, 1)


def reduces_from_counts(reducer: object) -> bool:
    """Whether ``reducer`` divides the sum of the terms by a count (``reducer.divisor``), so a loss
    with a closed-form gradient need not hand it the terms."""
    flag = getattr(reducer, "reduces_from_counts", None)
    if flag is not None:
        return bool(flag)
    try:
        reducer.divisor(1, 1)
    except (TypeError, AttributeError):
        return False
    return True
