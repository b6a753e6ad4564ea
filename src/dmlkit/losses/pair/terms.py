"""Pair terms: the matrix oriented as larger-is-farther, weighted sums, and the analytic-gradient node.

Losses that know ``d(loss)/d(matrix)`` compute their value without autograd and attach the
gradient with :func:`attach_gradient` (one multiplication in backward).
"""

from __future__ import annotations

import torch

from dmlkit.distances import BaseDistance

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
