"""Margin-softmax cross-entropy over many classes, one chunk of classes at a time.

The loss of ArcFace, sub-centre ArcFace, CosFace and the cosine normalised softmax. For a unit
embedding ``x_i`` and class weights ``w_jk`` (columns of PML's ``W [D, C*K]``, ``K`` sub-centres per class), the
cosine to class ``j`` is ``c_ij = max_k <x_i, w_jk / |w_jk|>`` (Sub-center ArcFace Eq. (1); plain
cosine when ``K = 1``) and

    ``l_i = log sum_j exp(z_ij) - z_iy``,  ``z_ij = s c_ij`` (``j != y_i``),  ``z_iy = s psi(c_iy)``

with ``psi`` the target margin (:class:`TargetMargin`: CosFace Eq. (4) ``c - m``, ArcFace Eq. (3)
``cos(theta + m)``, none). :func:`chunked_margin_softmax` never holds more than ``[B, chunk * K]``
logits: the forward keeps an online log-sum-exp (running max and rescaled sum per sample), the
backward recomputes each chunk's cosines and applies ``dl/dz_ij = softmax_ij - [j = y_i]``, then
the chain rule through both normalisations. :func:`dense_margin_softmax` is the same loss with every
logit at once through autograd: the plain twin the chunked one is tested against.

``columns`` (partial FC, An et al. 2021): only these classes (sorted, including every label of the
batch) enter the softmax; the others get a zero gradient.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dmlkit.losses.logsumexp import exp_sum_

MARGIN_KINDS = ("none", "additive_cosine", "additive_angular")
#: Smallest ``sin(theta)`` in ArcFace's derivative ``cos m + sin m cos(theta) / sin(theta)`` (a unit
#: embedding exactly on its class weight would otherwise get an infinite gradient).
SIN_EPS = 1e-6


@dataclass(frozen=True)
class TargetMargin:
    """The target logit's margin ``psi(c)`` and its derivative.

    * ``"none"``: ``psi(c) = c``;
    * ``"additive_cosine"`` (CosFace Eq. (4)): ``c - m``;
    * ``"additive_angular"`` (ArcFace Eq. (3)): ``cos(theta + m)`` with ``theta = acos(c)``
      (``c`` clamped to [-1, 1], zero gradient outside as PML's clamp); with ``monotonic`` (PML and
      the official code) ``c - m sin m`` once ``theta > pi - m``, where ``cos(theta + m)`` would rise
      again.
    """

    kind: str = "none"
    margin: float = 0.0
    monotonic: bool = True

    @property
    def constant_slope(self) -> bool:
        """Whether ``psi'(c) = 1`` everywhere (no margin, or CosFace's additive cosine)."""
        return self.kind != "additive_angular"

    def __call__(self, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(psi(c), psi'(c))`` elementwise."""
        if self.kind == "none":
            return c, torch.ones_like(c)
        if self.kind == "additive_cosine":
            return c - self.margin, torch.ones_like(c)
        m = self.margin
        inside = ((c >= -1) & (c <= 1)).to(c.dtype)
        cc = c.clamp(-1.0, 1.0)
        sin = (1.0 - cc * cc).clamp_min(0.0).sqrt()
        psi = cc * math.cos(m) - sin * math.sin(m)
        dpsi = (math.cos(m) + math.sin(m) * cc / sin.clamp_min(SIN_EPS)) * inside
        if self.monotonic:
            beyond = cc < -math.cos(m)  # theta > pi - m
            psi = torch.where(beyond, cc - m * math.sin(m), psi)
            dpsi = torch.where(beyond, inside, dpsi)
        return psi, dpsi


def _class_columns(weight: torch.Tensor, columns: torch.Tensor | None, start: int, stop: int, k: int) -> torch.Tensor:
    """Columns ``[D, n * K]`` of classes ``start .. stop-1`` of the iteration (of ``columns`` if given)."""
    if columns is None:
        return weight[:, start * k: stop * k]
    return weight.index_select(1, _column_index(columns[start:stop], k))


def _column_index(classes: torch.Tensor, k: int) -> torch.Tensor:
    return (classes[:, None] * k + torch.arange(k, device=classes.device)[None, :]).flatten()


def _chunk_cosines(xn: torch.Tensor, block: torch.Tensor, k: int):
    """``(c [B, n], unit columns [D, n K], 1/|column| [n K], per-sub-centre cosines [B, K, n] or None,
    the unit columns as multiplied: sub-centre-major [D, K n] when K > 1)``.

    With sub-centres the product runs on the columns reordered sub-centre-major, so the max over
    ``K`` is over a leading dimension of ``[B, K, n]`` (contiguous rows), not a length-K inner one.
    """
    inv = torch.linalg.vector_norm(block, dim=0).clamp_min(1e-12).reciprocal_()
    unit = block * inv
    if k == 1:
        return xn @ unit, unit, inv, None, unit
    by_sub_centre = unit.view(unit.shape[0], -1, k).transpose(1, 2).reshape(unit.shape[0], -1)
    per_sub_centre = (xn @ by_sub_centre).view(xn.shape[0], k, -1)
    return per_sub_centre.amax(dim=1), unit, inv, per_sub_centre, by_sub_centre


class _ChunkedMarginSoftmax(torch.autograd.Function):
    """Per-sample margin-softmax cross-entropy ``[B]``; see the module docstring.

    When every class fits one chunk the forward keeps that chunk's exponentials and unit columns for the
    backward (``[B, C*K]``, what autograd would keep) instead of recomputing them: one matrix product and
    about a dozen kernels fewer per call, with the same values up to rounding.
    """

    @staticmethod
    def forward(ctx, xn, weight, labels, columns, k, scale, margin, chunk):
        batch = xn.shape[0]
        num = weight.shape[1] // k if columns is None else columns.numel()
        pos = labels if columns is None else torch.searchsorted(columns, labels)
        ctx.kept = None
        with torch.no_grad():
            if num <= chunk:
                lse, psi, dpsi = _one_chunk_forward(ctx, xn, weight, pos, columns, k, scale, margin, num)
            else:
                lse, psi, dpsi = _chunked_forward(xn, weight, pos, columns, k, scale, margin, chunk, num, batch)
            loss = torch.sub(lse, psi, alpha=scale)
        ctx.save_for_backward(xn, weight, pos, lse, psi, dpsi, columns)
        ctx.k, ctx.scale, ctx.chunk, ctx.num, ctx.constant_slope = k, scale, chunk, num, margin.constant_slope
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        xn, weight, pos, lse, psi_target, dpsi_target, columns = ctx.saved_tensors
        k, scale, chunk = ctx.k, ctx.scale, ctx.chunk
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if ctx.kept is not None:  # the one chunk, as the forward left it (read only: a retained graph reuses it)
            exps, sums, unit, inv, share, product = ctx.kept
            dc = _expand_sub_centres(_logit_gradient(exps.div(sums[:, None]), grad_loss, pos[:, None], None,
                                                     dpsi_target, scale, ctx.constant_slope), share)
            grad_unit = _chunk_weight_gradient(xn, dc, unit, inv, share is not None, k) if need_w else None
            if need_w and columns is not None:
                grad_unit = torch.zeros_like(weight).index_copy_(1, _column_index(columns, k), grad_unit)
            return dc @ product.T if need_x else None, grad_unit, None, None, None, None, None, None
        grad_x = torch.zeros_like(xn) if need_x else None
        grad_w = torch.zeros_like(weight) if need_w else None
        for start in range(0, ctx.num, chunk):
            stop = min(start + chunk, ctx.num)
            inside, local = _targets_in(pos, start, stop, ctx.num)
            cos, unit, inv, per_sub_centre, product = _chunk_cosines(
                xn, _class_columns(weight, columns, start, stop, k), k)
            share = _sub_centre_share(per_sub_centre, cos)
            z = cos.mul_(scale)
            z.scatter_(1, local, _where(inside, psi_target * scale, z.gather(1, local)[:, 0])[:, None])
            softmax = z.sub_(lse[:, None]).exp_()
            dc = _expand_sub_centres(_logit_gradient(softmax, grad_loss, local, inside, dpsi_target, scale, False), share)
            if need_x:
                grad_x.addmm_(dc, product.T)
            if need_w:
                grad_unit = _chunk_weight_gradient(xn, dc, unit, inv, share is not None, k)
                if columns is None:
                    grad_w[:, start * k: stop * k] = grad_unit
                else:
                    grad_w.index_copy_(1, _column_index(columns[start:stop], k), grad_unit)
        return grad_x, grad_w, None, None, None, None, None, None


def _one_chunk_forward(ctx, xn, weight, pos, columns, k, scale, margin, num):
    """``(lse, psi, psi')`` ``[B]`` when all ``num`` classes fit one chunk: one product, one log-sum-exp
    (no max shift where ``exp`` cannot overflow: ``|z| <= s (1 + |m|)``); ``exp(z - shift)``, its row sums and
    the unit columns stay in ``ctx.kept`` for the backward (its softmax is then one division)."""
    block = weight if columns is None else _class_columns(weight, columns, 0, num, k)
    cos, unit, inv, per_sub_centre, product = _chunk_cosines(xn, block, k)
    local = pos[:, None]
    picked = cos.gather(1, local)[:, 0]
    psi, dpsi = margin(picked)
    share = _sub_centre_share(per_sub_centre, cos)
    z = cos.mul_(scale)
    if margin.kind != "none":  # with no margin the target logit is already s c_iy
        z.scatter_(1, local, (psi * scale)[:, None])
    exps, sums, lse = exp_sum_(z, 1, scale * (1.0 + abs(margin.margin)))
    ctx.kept = (exps, sums, unit, inv, share, product)
    return lse, psi, dpsi


def _chunked_forward(xn, weight, pos, columns, k, scale, margin, chunk, num, batch):
    """``(lse, psi, psi')`` ``[B]`` with an online log-sum-exp over chunks of ``chunk`` classes."""
    running_max = xn.new_full((batch,), float("-inf"))
    total = xn.new_zeros(batch)
    psi = dpsi = xn.new_zeros(batch)  # psi(c_iy) and psi'(c_iy), filled in the chunk holding y_i
    for start in range(0, num, chunk):
        stop = min(start + chunk, num)
        cos, _, _, _, _ = _chunk_cosines(xn, _class_columns(weight, columns, start, stop, k), k)
        inside, local = _targets_in(pos, start, stop, num)
        picked = cos.gather(1, local)[:, 0]
        chunk_psi, chunk_dpsi = margin(picked)
        psi, dpsi = _where(inside, chunk_psi, psi), _where(inside, chunk_dpsi, dpsi)
        z = cos.mul_(scale)
        z.scatter_(1, local, _where(inside, psi * scale, picked * scale)[:, None])
        new_max = torch.maximum(running_max, z.amax(dim=1))
        total = total.mul_(torch.exp(running_max - new_max)).add_(z.sub_(new_max[:, None]).exp_().sum(dim=1))
        running_max = new_max
    return running_max + torch.log(total), psi, dpsi


def _logit_gradient(softmax, grad_loss, local, inside, dpsi_target, scale, constant_slope):
    """``dl/dc [B, n]`` of a chunk: ``dl/dz = softmax - onehot`` (times the incoming gradient), ``dz/dc = s``
    and ``s psi'`` on the target (``constant_slope``: ``psi' = 1``)."""
    dc = softmax.mul_(grad_loss[:, None])
    if inside is None:  # every target in this chunk: subtract the one-hot in place, then psi' on the targets
        dc = dc.scatter_add_(1, local, grad_loss.neg()[:, None]).mul_(scale)
        return dc if constant_slope else dc.scatter_(1, local, dc.gather(1, local) * dpsi_target[:, None])
    on_target = (dc.gather(1, local)[:, 0] - grad_loss).mul_(scale).mul_(dpsi_target)
    dc.mul_(scale)
    return dc.scatter_(1, local, _where(inside, on_target, dc.gather(1, local)[:, 0])[:, None])


def _expand_sub_centres(dc: torch.Tensor, share: torch.Tensor | None) -> torch.Tensor:
    """``dl/dc [B, n]`` spread over the sub-centres (``[B, K n]``, sub-centre-major) by ``share``; as is when K = 1."""
    return dc if share is None else (share * dc[:, None, :]).view(dc.shape[0], -1)


def _chunk_weight_gradient(xn, dc, unit, inv, sub_centres, k):
    """``dl/dw [D, n K]`` of a chunk's class-major columns from ``dl/dc [B, n K]`` (sub-centre-major when
    ``sub_centres``), through ``unit = w / |w|``: ``(g - unit <unit, g>) / |w|``."""
    grad_unit = xn.T @ dc
    if sub_centres:  # back to class-major columns
        grad_unit = grad_unit.view(grad_unit.shape[0], k, -1).transpose(1, 2).reshape(grad_unit.shape[0], -1)
    return grad_unit.addcmul_(unit, (unit * grad_unit).sum(dim=0, keepdim=True), value=-1.0).mul_(inv)


def _sub_centre_share(per_sub_centre: torch.Tensor | None, cos: torch.Tensor) -> torch.Tensor | None:
    """``[B, K, n]``: the nearest sub-centre takes the gradient (ties share it, as ``amax``'s); None when K = 1."""
    if per_sub_centre is None:
        return None
    share = (per_sub_centre == cos[:, None, :]).to(cos.dtype)
    return share.div_(share.sum(dim=1, keepdim=True))


def _targets_in(pos: torch.Tensor, start: int, stop: int, num: int) -> tuple[torch.Tensor | None, torch.Tensor]:
    """``inside [B]``: whether sample ``i``'s class lies in the chunk ``[start, stop)`` (None: the chunk holds
    all ``num`` classes, so every sample's); ``local [B, 1]``: that class's column in the chunk (clamped
    into it for the others, whose entry the caller leaves as it is).

    Dense masks rather than the row list (``nonzero``) keep the chunk loop free of host synchronisations.
    """
    if start == 0 and stop == num:
        return None, pos[:, None]
    inside = (pos >= start) & (pos < stop)
    return inside, (pos - start).clamp_(0, stop - start - 1)[:, None]


def _where(inside: torch.Tensor | None, value: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """``value`` where ``inside`` (everywhere when it is None), else ``other``."""
    return value if inside is None else torch.where(inside, value, other)


def chunked_margin_softmax(
    xn: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    margin: TargetMargin,
    scale: float,
    proxies_per_class: int = 1,
    chunk_size: int = 1024,
    columns: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-sample loss ``[B]`` of unit embeddings ``xn [B, D]`` against the class weights ``weight [D, C*K]``
    (PML's ``W``: class ``c`` owns columns ``c*K .. c*K+K-1``, un-normalised), ``chunk_size`` classes at a
    time; ``columns [U]`` restricts the softmax (partial FC)."""
    return _ChunkedMarginSoftmax.apply(xn, weight, labels, columns, proxies_per_class, float(scale), margin,
                                       int(chunk_size))


def dense_margin_softmax(
    xn: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    margin: TargetMargin,
    scale: float,
    proxies_per_class: int = 1,
    columns: torch.Tensor | None = None,
) -> torch.Tensor:
    """The same per-sample loss with all ``[B, C]`` logits at once, through autograd (the reference twin)."""
    k = proxies_per_class
    unit = weight / torch.linalg.vector_norm(weight, dim=0, keepdim=True).clamp_min(1e-12)
    cos = (xn @ unit).view(xn.shape[0], -1, k).amax(dim=2)
    pos = labels
    if columns is not None:
        cos, pos = cos[:, columns], torch.searchsorted(columns, labels)
    target = cos.gather(1, pos[:, None])
    psi = _TargetLogit.apply(target, margin)
    logits = torch.scatter(cos, 1, pos[:, None], psi) * scale
    return torch.nn.functional.cross_entropy(logits, pos, reduction="none")


class _TargetLogit(torch.autograd.Function):
    """``psi(c)`` with :class:`TargetMargin`'s derivative (so both twins share the margin's gradient)."""

    @staticmethod
    def forward(ctx, c, margin):
        psi, dpsi = margin(c)
        ctx.save_for_backward(dpsi)
        return psi

    @staticmethod
    def backward(ctx, grad):
        (dpsi,) = ctx.saved_tensors
        return grad * dpsi, None
