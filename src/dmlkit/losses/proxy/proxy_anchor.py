"""Proxy-Anchor loss (Kim et al., CVPR 2020)."""

from __future__ import annotations

import math
from functools import partial
from typing import Callable, Tuple

import torch
import torch.nn.functional as F

from dmlkit.core.validation import Interval, Options
from dmlkit.distances import BaseDistance, CosineSimilarity
from dmlkit.losses.base import LOSSES
from dmlkit.losses.logsumexp import exp_sum_, softmax_with_one
from dmlkit.losses.proxy._base import ProxyLoss
from dmlkit.losses.proxy._math import common_dtype, normalize_rows


def proxy_anchor_terms(
    scaled: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor, offset: float, num_proxies: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. (4) restricted to the given proxies, ``sum_p pos_p / |P+| + sum_p neg_p / num_proxies``, and its
    gradient with respect to ``scaled`` (Eq. (6) times ``alpha``).

    ``scaled = alpha * s``, ``positive``, ``negative`` are ``[U, B]`` (proxy-major); ``offset = alpha * delta``;
    ``|P+|`` counts proxies with a positive. With ``pos_p = log(1 + sum_{i+} e^{offset - z_pi})`` and
    ``neg_p = log(1 + sum_{i-} e^{z_pi + offset})`` (:func:`softmax_with_one`: the stable value and the share
    ``e^{a_pi} / (1 + sum_i e^{a_pi})`` of each term), ``dl/dz_pi = share-_pi / |P| - share+_pi / |P+|``.
    """
    pos_term, pos_share = softmax_with_one(torch.where(positive, offset - scaled, float("-inf")))
    neg_term, neg_share = softmax_with_one(torch.where(negative, scaled + offset, float("-inf")))
    num_with_positives = positive.any(dim=1).sum().clamp_min_(1).to(scaled.dtype)
    loss = pos_term.sum() / num_with_positives + neg_term.sum() / num_proxies
    return loss, neg_share.div_(num_proxies).sub_(pos_share.div_(num_with_positives))


Assign = Callable[[torch.Tensor], Tuple[torch.Tensor, torch.Tensor]]


def proxy_anchor_kernel(
    z: torch.Tensor, need_grad: bool, columns: torch.Tensor | None, assign: Assign, alpha: float, margin: float
) -> tuple[torch.Tensor, torch.Tensor | None, None]:
    """Eq. (4) and its gradient Eq. (6) from ``z = alpha * s [P, B]`` (overwritten with ``dl/dz``).

    Proxies of classes absent from the batch (almost all of them at SOP scale) have every sample
    as a negative, so their term is ``softplus(t_p)``, ``t_p = alpha delta + log sum_i E_pi`` with
    ``E_pi = exp(z_pi - m_p)`` (shift ``m_p = 0`` when ``exp`` cannot overflow, else the row
    max), and ``dl/dz_pi = sigmoid(t_p) E_pi / (|P| sum_i E_pi)`` (Eq. (6) divided by ``alpha``).
    The proxies ``columns [n]`` of classes in the batch (:meth:`ProxyBank.batch_columns`: a proxy may
    repeat, and ``assign`` gives its repeats neither positives nor negatives, so they add exact zeros)
    are computed exactly on an ``[n, B]`` block (:func:`proxy_anchor_terms`);
    ``assign(alpha * s[:, columns])`` gives their ``(positive, negative)`` masks. ``columns=None``: every
    proxy is in the block (the bank is no larger than the batch's candidates), and there is no bulk.
    """
    num_proxies = z.shape[0]
    offset = alpha * margin
    if columns is None:
        positive, negative = assign(z.T)
        loss, grad = proxy_anchor_terms(z, positive.T, negative.T, offset, num_proxies)
        return loss, (grad if need_grad else None), None
    present_z = z.index_select(0, columns)
    positive, negative = assign(present_z.T)
    present, grad_present = proxy_anchor_terms(present_z, positive.T, negative.T, offset, num_proxies)
    exps, sums, lse = exp_sum_(z, 1, alpha)  # |z| <= alpha
    lse = lse.add_(offset)
    bulk = F.softplus(lse).index_fill_(0, columns, 0.0)
    loss = present + bulk.sum() / num_proxies
    if not need_grad:
        return loss, None, None
    coef = torch.sigmoid(lse).div_(sums).div_(num_proxies).index_fill_(0, columns, 0.0)
    # a repeated column's row of grad_present is zero: adding it leaves the first one's values exact
    return loss, exps.mul_(coef[:, None]).index_add_(0, columns, grad_present), None


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

    _repr_keys = (
        "num_classes", "embedding_size", "proxies_per_class", "margin", "alpha", "assignment", "matmul_precision"
    )

    _parameter_constraints = {
        "margin": [Interval(float, 0, math.inf, closed="left")],  # delta = 0 is studied in Fig. 6
        "alpha": [Interval(float, 0, math.inf, closed="neither")],  # finite: alpha = inf makes the loss NaN
        "assignment": [Options(("static", "nearest"))],
    }

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
        matmul_precision: str = "highest",
        *,
        distance: object | None = None,
        reducer: object | None = None,
        embedding_regularizer: object | None = None,
        embedding_reg_weight: float = 1.0,
        weight_regularizer: object | None = None,
        weight_reg_weight: float = 1.0,
    ):
        super().__init__(num_classes, embedding_size, proxies_per_class, proxy_init, seed, matmul_precision,
            distance=distance, reducer=reducer, embedding_regularizer=embedding_regularizer,
            embedding_reg_weight=embedding_reg_weight, weight_regularizer=weight_regularizer,
            weight_reg_weight=weight_reg_weight,
        )
        self.margin = float(margin)
        self.alpha = float(alpha)
        self.assignment = assignment

    def default_distance(self) -> BaseDistance:
        return CosineSimilarity()

    def compute_loss(self, embeddings: torch.Tensor, labels: torch.Tensor, **kwargs) -> torch.Tensor:
        self.reject_kwargs(kwargs)
        embeddings, proxies = common_dtype(embeddings, self.proxies)
        xn = normalize_rows(embeddings)
        columns, first = self.bank.batch_columns(labels)  # static shapes: no host synchronisation

        def assign(present_z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # labels checked just above
            return self.bank.assign(present_z, labels, self.assignment, columns=columns, check=False, first=first)

        kernel = partial(proxy_anchor_kernel, columns=columns, assign=assign, alpha=self.alpha, margin=self.margin)
        return self.fused(xn, proxies, kernel, self.alpha, labels, (columns, first))
