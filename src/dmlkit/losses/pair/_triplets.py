"""Triplet machinery shared by TripletMarginLoss and MarginLoss: all-triplet hinge in O(B R)
memory, and per-anchor random triplet sampling from an explicit generator."""

from __future__ import annotations

import torch

from dmlkit.losses.logsumexp import log1p_exp
from dmlkit.losses.pair.terms import CHUNK_ELEMENTS
from dmlkit.losses.reducers import BaseReducer


def all_triplets_sums(
    dis: torch.Tensor,
    positive: torch.Tensor,
    negative: torch.Tensor,
    margin: float,
    *,
    smooth: bool,
    reducer: BaseReducer,
    dis_pn: torch.Tensor | None = None,
    pn_rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(loss, d loss / d dis [B, R], d loss / d dis_pn [U, R] or None)`` of the reduced ``h(d_ap - d_an + margin)``
    over every triplet ``positive[a, p] & negative[a, n]``, no graph.

    ``dis [B, R]`` is oriented so larger means farther; ``h`` is ReLU or softplus (``smooth``). With
    ``dis_pn [U, R]`` (swap), ``d_an`` becomes ``min(d_an, d_pn)`` where ``d_pn = dis_pn[pn_rows[p], n]``. The
    triplets are never materialised: positive pairs are processed in chunks of ``[chunk, R]`` under ``no_grad``;
    the loss is the sum of the terms over ``reducer.divisor(number of triplets, number of non-zero terms)``. The
    caller attaches the gradient (:class:`~dmlkit.losses.pair.terms.Pairwise`, :func:`attach_gradient`).
    """
    num_refs = dis.shape[1]
    anchor_idx, positive_idx = positive.nonzero(as_tuple=True)
    chunk = max(1, CHUNK_ELEMENTS // max(num_refs, 1))
    with torch.no_grad():
        d = dis.detach()
        coeff = torch.zeros_like(d)
        coeff_pn = torch.zeros_like(dis_pn) if dis_pn is not None else None
        total = d.new_zeros(())
        num_all = torch.zeros((), dtype=torch.long, device=d.device)
        num_nonzero = torch.zeros((), dtype=torch.long, device=d.device)
        for start in range(0, anchor_idx.numel(), chunk):
            a = anchor_idx[start : start + chunk]
            p = positive_idx[start : start + chunk]
            neg = negative[a]
            d_an = d[a]
            if dis_pn is not None:
                d_pn = dis_pn.detach()[pn_rows[p]]
                use_pn = d_pn < d_an
                d_an = torch.where(use_pn, d_pn, d_an)
            violation = d[a, p].unsqueeze(1) - d_an + margin
            if smooth:
                term = log1p_exp(violation)
                slope = torch.sigmoid(violation)
            else:
                term = violation.clamp_min(0.0)
                slope = (violation > 0).to(d.dtype)
            term = torch.where(neg, term, 0.0)
            slope = torch.where(neg, slope, 0.0)
            total += term.sum()
            num_all += neg.sum()
            num_nonzero += (term > 0).sum()
            coeff.index_put_((a, p), slope.sum(1), accumulate=True)
            if dis_pn is not None:
                # index_put_ with accumulate: index_add_ is far slower on CPU here.
                coeff.index_put_((a,), -torch.where(use_pn, 0.0, slope), accumulate=True)
                coeff_pn.index_put_((pn_rows[p],), -torch.where(use_pn, slope, 0.0), accumulate=True)
            else:
                coeff.index_put_((a,), -slope, accumulate=True)
        denom = torch.as_tensor(reducer.divisor(num_all, num_nonzero)).clamp_min(1).to(d.dtype)
        return total / denom, coeff.div_(denom), None if coeff_pn is None else coeff_pn.div_(denom)


def all_triplets(positive: torch.Tensor, negative: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every ``(a, p, n)`` with ``positive[a, p] & negative[a, n]`` (materialised: ``O(B R^2)`` memory),
    for reducers that need each triplet's term."""
    return (positive.unsqueeze(2) & negative.unsqueeze(1)).nonzero(as_tuple=True)


def sample_triplets(
    positive: torch.Tensor, negative: torch.Tensor, per_anchor: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``per_anchor`` random ``(a, p, n)`` for each anchor with a positive and a negative.

    Positives and negatives are drawn uniformly and independently, with replacement, from
    the anchor's rows of ``positive [B, R]`` and ``negative [B, R]`` (as PML does), using
    uniforms from ``generator`` only.
    """
    valid = positive.any(1) & negative.any(1)
    anchors = valid.nonzero(as_tuple=True)[0]
    if anchors.numel() == 0:
        empty = torch.empty(0, dtype=torch.long, device=positive.device)
        return empty, empty, empty

    def draw(mask: torch.Tensor) -> torch.Tensor:
        rows = mask[anchors].to(torch.long)
        cumulative = rows.cumsum(1)
        count = cumulative[:, -1:]
        u = torch.rand(anchors.numel(), per_anchor, generator=generator, dtype=torch.float64).to(mask.device)
        rank = (u * count).floor().to(torch.long).clamp_max(count - 1) + 1
        return torch.searchsorted(cumulative, rank)

    p = draw(positive).reshape(-1)
    n = draw(negative).reshape(-1)
    a = anchors.repeat_interleave(per_anchor)
    return a, p, n


class GeneratorStateMixin:
    """Saves the module's ``generator`` state in ``state_dict`` so random sampling resumes exactly."""

    generator: torch.Generator

    def get_extra_state(self) -> dict:
        return {"generator_state": self.generator.get_state()}

    def set_extra_state(self, state: dict) -> None:
        self.generator.set_state(state["generator_state"])
