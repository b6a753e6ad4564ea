"""Proxy-Anchor loss (Kim et al., CVPR 2020)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dmlkit._validation import Interval, Options, validate_params
from dmlkit.distances import l2_normalize
from dmlkit.losses.base import LOSSES
from dmlkit.losses.proxy._base import ProxyLoss
from dmlkit.losses.proxy._math import common_dtype, log1p_sum_exp


def proxy_anchor_terms(
    sim: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor, alpha: float, margin: float, num_proxies: int
) -> torch.Tensor:
    """Eq. (4) restricted to the given columns: ``sum_p pos_p / |P+| + sum_p neg_p / num_proxies``.

    ``sim``, ``positive``, ``negative`` are ``[B, U]``; ``|P+|`` counts columns with a positive.
    """
    pos_term = log1p_sum_exp(-alpha * (sim - margin), positive, dim=0)
    neg_term = log1p_sum_exp(alpha * (sim + margin), negative, dim=0)
    num_with_positives = positive.any(dim=0).sum().clamp_min(1)
    return pos_term.sum() / num_with_positives + neg_term.sum() / num_proxies


def _exp_shift_is_safe(alpha: float, dtype: torch.dtype) -> bool:
    """Whether ``exp(alpha (s - 1))`` cannot underflow to 0 for cosines ``s >= -1`` in ``dtype``."""
    return 2.0 * alpha < (80.0 if dtype in (torch.float32, torch.float16, torch.bfloat16) else 700.0)


class _ProxyAnchorFunction(torch.autograd.Function):
    """Eq. (4) on normalised ``xn [B, D]`` and raw ``proxies [P, D]`` with the gradient of Eq. (6).

    Proxies of classes absent from the batch (almost all of them at SOP scale) have every sample
    as a negative, so their term is ``softplus(t_p)``, ``t_p = LSE_i alpha (s_ip + delta)``,
    computed in a few in-place passes over the ``[B, P]`` matrix, with
    ``dl/ds_ip = alpha/|P| sigmoid(t_p) E_ip / S_p`` (``E_ip = exp(alpha (s_ip - m_p))``,
    ``S_p = sum_i E_ip``, shift ``m_p = 1`` — the cosine's upper bound — or the column max when
    ``alpha`` is so large that ``exp`` could underflow). This is Eq. (6) rescaled. The few
    ``columns`` of present classes are computed exactly with autograd on a ``[B, U]`` block.
    The proxy normalisation is part of the function (its backward is written out).
    """

    @staticmethod
    def forward(ctx, xn, proxies, columns, positive, negative, alpha, margin):
        num_proxies = proxies.shape[0]
        inv_norm = 1.0 / torch.linalg.vector_norm(proxies, dim=1).clamp_min(1e-12)
        pn = proxies * inv_norm[:, None]
        scaled = torch.mm(xn * alpha, pn.T)  # alpha * s, [B, P]
        if _exp_shift_is_safe(alpha, scaled.dtype):
            shift = torch.full((num_proxies,), alpha, dtype=scaled.dtype, device=scaled.device)
            exps = scaled.sub_(alpha).exp_()
        else:
            shift = scaled.amax(dim=0)
            exps = scaled.sub_(shift).exp_()
        sums = exps.sum(dim=0)
        lse = shift + alpha * margin + torch.log(sums)
        bulk = F.softplus(lse)
        coef = torch.sigmoid(lse) / sums * (alpha / num_proxies)
        bulk[columns] = 0.0
        with torch.enable_grad():
            sim_present = torch.mm(xn, pn[columns].T).detach().requires_grad_(True)
            present = proxy_anchor_terms(sim_present, positive, negative, alpha, margin, num_proxies)
            (grad_present,) = torch.autograd.grad(present, sim_present)
        ctx.save_for_backward(xn, proxies, pn, inv_norm, exps, coef, columns, grad_present)
        return present.detach() + bulk.sum() / num_proxies

    @staticmethod
    def backward(ctx, grad_output):
        xn, proxies, pn, inv_norm, exps, coef, columns, grad_present = ctx.saved_tensors
        grad_sim = exps * (coef * grad_output)
        grad_sim[:, columns] = grad_present * grad_output
        grad_xn = torch.mm(grad_sim, pn) if ctx.needs_input_grad[0] else None
        grad_proxies = None
        if ctx.needs_input_grad[1]:
            grad_pn = torch.mm(grad_sim.T, xn)
            radial = torch.linalg.vecdot(pn, grad_pn)  # d(p/|p|): (g - pn <pn, g>) / |p|
            grad_proxies = grad_pn.sub_(pn * radial[:, None]).mul_(inv_norm[:, None])
        return grad_xn, grad_proxies, None, None, None, None, None


@LOSSES.register("proxy_anchor")
class ProxyAnchorLoss(ProxyLoss):
    """Each proxy is an anchor against the whole batch: Proxy-Anchor Eq. (4).

    ``loss = 1/|P+| sum_{p in P+} log(1 + sum_{x in X_p+} e^{-alpha (s(x,p) - delta)})
           + 1/|P|  sum_{p in P}  log(1 + sum_{x in X_p-} e^{ alpha (s(x,p) + delta)})``

    with ``s`` the cosine similarity (computed here, so raw embeddings give the paper value),
    ``P`` all proxies and ``P+`` the proxies with at least one positive in the batch (PML
    divides the same way). With ``K = proxies_per_class > 1`` every proxy is its own anchor
    (ASAP Eq. (4.11): the loss sums over all ``K*C`` proxies) and ``assignment`` decides
    ``X_p+``: ``"static"`` = all samples of p's class, ``"nearest"`` = the samples of p's class
    whose most similar class proxy is p. ``X_p-`` is always the samples of other classes.
    All sums are log-sum-exps; proxies of classes absent from the batch take a fused path.
    """

    _repr_keys = ("num_classes", "embedding_size", "proxies_per_class", "margin", "alpha", "assignment")

    def __init__(
        self,
        num_classes: int,
        embedding_size: int,
        margin: float = 0.1,
        alpha: float = 32,
        proxies_per_class: float = 1,
        assignment: str = "static",
        proxy_init: str = "normal",
        seed: int = 0,
    ):
        validate_params(
            "ProxyAnchorLoss",
            {"margin": margin, "alpha": alpha, "assignment": assignment},
            {
                "margin": [Interval(float, 0, None, closed="neither")],
                "alpha": [Interval(float, 0, None, closed="neither")],
                "assignment": [Options(("static", "nearest"))],
            },
        )
        super().__init__(num_classes, embedding_size, proxies_per_class, proxy_init, seed)
        self.margin = float(margin)
        self.alpha = float(alpha)
        self.assignment = assignment

    def compute_loss(self, embeddings: torch.Tensor, labels: torch.Tensor, **kwargs) -> torch.Tensor:
        self.reject_kwargs(kwargs)
        embeddings, proxies = common_dtype(embeddings, self.proxies)
        xn = l2_normalize(embeddings)
        columns = self.bank.present_columns(labels)
        with torch.no_grad():
            sim_present = xn @ l2_normalize(proxies[columns]).T
        positive, negative = self.bank.assign(sim_present, labels, self.assignment, columns=columns)
        return _ProxyAnchorFunction.apply(xn, proxies, columns, positive, negative, self.alpha, self.margin)
