"""Proxy-Anchor loss (Kim et al., CVPR 2020)."""

from __future__ import annotations

import torch

from dmlkit._validation import Interval, Options, validate_params
from dmlkit.losses.base import LOSSES, zero_loss
from dmlkit.losses.proxy._base import ProxyLoss
from dmlkit.losses.proxy._math import common_dtype, cosine_to_proxies, log1p_sum_exp


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
                "margin": [Interval(float, None, None)],
                "alpha": [Interval(float, 0, None, closed="neither")],
                "assignment": [Options(("static", "nearest"))],
            },
        )
        super().__init__(num_classes, embedding_size, proxies_per_class, proxy_init, seed)
        self.margin = float(margin)
        self.alpha = float(alpha)
        self.assignment = assignment

    def compute_loss(self, embeddings: torch.Tensor, labels: torch.Tensor, **kwargs) -> torch.Tensor:
        embeddings, proxies = common_dtype(embeddings, self.proxies)
        sim = cosine_to_proxies(embeddings, proxies)
        positive, negative = self.bank.assign(sim, labels, self.assignment)
        pos_term = log1p_sum_exp(-self.alpha * (sim - self.margin), positive, dim=0)
        neg_term = log1p_sum_exp(self.alpha * (sim + self.margin), negative, dim=0)
        num_with_positives = positive.any(dim=0).sum()
        if int(num_with_positives) == 0:
            return zero_loss(embeddings, proxies)
        return pos_term.sum() / num_with_positives + neg_term.sum() / self.bank.num_proxies
