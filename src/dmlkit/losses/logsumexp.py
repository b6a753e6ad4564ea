"""Log-sum-exp and softmax, stable and masked: the one home of these reductions for every loss.

``masked_logsumexp`` / ``log1p_exp`` (pair losses: lifted structure, binomial deviance, smooth
triplets), ``log1p_sum_exp`` (Proxy-Anchor Eq. 5), ``exp_sum_`` (the fused proxy kernels' in-place
LSE), ``softmax_with_one`` / ``softmax_rows`` (multi-similarity and generalised lifted structure:
the LSE and its softmax in one pass).
"""

from __future__ import annotations

import torch

from dmlkit.core.cpu_ops import exp_


def masked_logsumexp(x: torch.Tensor, mask: torch.Tensor, dim: int = -1, add_one: bool = False) -> torch.Tensor:
    """``log(sum_{mask} exp(x))`` along ``dim`` (``log(1 + ...)`` when ``add_one``).

    Rows with nothing selected give ``-inf`` (``0`` with ``add_one``) and zero, never NaN,
    gradients.
    """
    empty = ~mask.any(dim, keepdim=True)
    x = x.masked_fill(~mask | empty, float("-inf")).masked_fill(empty, 0.0)
    out = torch.logsumexp(x, dim, keepdim=True).masked_fill(empty, float("-inf")).squeeze(dim)
    if add_one:
        # log(1 + e^out) with out = -inf mapped to 0 and a zero gradient there.
        out = log1p_exp(out)
    return out


def log1p_exp(x: torch.Tensor) -> torch.Tensor:
    """``log(1 + exp(x))`` exactly (no threshold), finite gradient at ``x = -inf``."""
    return torch.clamp_min(x, 0.0) + torch.log1p(torch.exp(-x.abs()))


def log1p_sum_exp(z: torch.Tensor, mask: torch.Tensor | None, dim: int) -> torch.Tensor:
    """``log(1 + sum_{mask} exp(z))`` along ``dim``, stable for any ``z`` (= Softplus(LSE), Proxy-Anchor Eq. (5)).

    Entries outside ``mask`` contribute nothing (an empty set gives exactly 0 with zero gradient).
    """
    if mask is not None:
        z = z.masked_fill(~mask, float("-inf"))
    shift = z.detach().amax(dim=dim, keepdim=True).clamp_min(0.0)
    total = torch.exp(z - shift).sum(dim=dim) + torch.exp(-shift).squeeze(dim)
    return shift.squeeze(dim) + torch.log(total)


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


def softmax_with_one(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``log(1 + sum_j exp(z_j))`` per row and its gradient ``exp(z_j - lse)`` (``-inf`` = not selected).

    The implicit ``1`` is a logit 0 (MS Eq. (13)'s ``log(1 + ...)``), so the shift
    ``max(0, max_j z_j)`` is finite and the sum is at least 1: rows with nothing selected give
    0 and a zero gradient. ``logits`` is overwritten.
    """
    shift = logits.amax(1, keepdim=True).clamp_min_(0.0)
    exps = exp_(logits.sub_(shift))
    total = exps.sum(1, keepdim=True).add_(shift.neg().exp_())
    return shift.add_(total.log()).squeeze(1), exps.div_(total)


def softmax_rows(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``log(sum_j exp(z_j))`` per row (``-inf`` for an empty row) and the row softmax (0 there).

    One max, exp and sum (``torch.logsumexp`` plus a softmax would repeat them). ``logits``
    is overwritten.
    """
    shift = logits.amax(1, keepdim=True).nan_to_num_(0.0, None, 0.0)
    exps = exp_(logits.sub_(shift))
    total = exps.sum(1, keepdim=True)
    return shift.add_(total.log()).squeeze(1), exps.mul_(total.reciprocal().nan_to_num_(0.0, 0.0, 0.0))
