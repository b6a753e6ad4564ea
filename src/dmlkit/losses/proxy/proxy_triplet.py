"""Proxy-Triplet loss (Movshovitz-Attias et al., ICCV 2017, Sec. 3.3 and Prop. 4.2)."""

from __future__ import annotations

import torch

from dmlkit.core.validation import Interval, Options
from dmlkit.distances import BaseDistance, LpDistance, l2_normalize, squared_euclidean
from dmlkit.losses.base import LOSSES, zero_loss
from dmlkit.losses.proxy._base import ProxyLoss
from dmlkit.losses.proxy._math import common_dtype, normalize_rows
from dmlkit.proxies import dynamic_triplets


@LOSSES.register("proxy_triplet")
class ProxyTripletLoss(ProxyLoss):
    """Margin triplets ``(x, p(y), p(z))`` over all negative proxies: Proxy-NCA Eq. (3) with proxies.

    ``l(x, z) = [d(x, p(y)) + margin - d(x, p(z))]_+`` with ``d`` the squared Euclidean distance
    between L2-normalised embeddings and proxies (Sec. 3.1, 4). ``p(y)`` is the sample's positive
    proxy (``assignment`` as in :class:`ProxyNCALoss`; with several positive proxies, the
    nearest one, Eq. (5)); every negative proxy gives one triplet. ``"dynamic"``: one term per
    sample triplet ``(x_a, y)`` and proxy ``p(z)`` nearest to a negative of ``a``, with ``p(y)``
    the proxy nearest to ``y`` (:func:`dmlkit.proxies.dynamic_triplets`). ``reduction="mean_nonzero"``
    (default, as PML's triplet reducer) averages over triplets with a positive loss, ``"mean"``
    over all triplets, ``"sum"`` adds them (see :mod:`dmlkit.losses.reducers`).
    """

    reductions = ("mean_nonzero", "mean", "sum", "threshold")
    _repr_keys = ("num_classes", "embedding_size", "proxies_per_class", "margin", "assignment", "reduction")

    _parameter_constraints = {"margin": [Interval(float, 0, None)], "assignment": [Options(("static", "nearest", "dynamic"))]}

    def __init__(
        self,
        num_classes: int,
        embedding_size: int,
        margin: float = 0.1,
        proxies_per_class: float = 1,
        assignment: str = "static",
        reduction: str | object = "mean_nonzero",
        proxy_init: str = "normal",
        seed: int = 0,
    ):
        super().__init__(num_classes, embedding_size, proxies_per_class, proxy_init, seed, reducer=reduction)
        self.margin = float(margin)
        self.assignment = assignment
        self.reduction = self.reducer.name

    def default_distance(self) -> BaseDistance:
        return LpDistance(power=2, normalize_embeddings=True)

    def compute_loss(self, embeddings: torch.Tensor, labels: torch.Tensor, **kwargs) -> torch.Tensor:
        self.reject_kwargs(kwargs)
        embeddings, proxies = common_dtype(embeddings, self.proxies)
        dist = squared_euclidean(l2_normalize(embeddings), normalize_rows(proxies))
        if self.assignment == "dynamic":
            self.bank.check_labels(labels)
            triplets = dynamic_triplets(-dist, labels)
            if triplets.anchors.numel() == 0:
                return zero_loss(embeddings, proxies)
            positive_dist = dist[triplets.anchors, triplets.positive_proxies][:, None]  # d(x_a, p(y)) [T, 1]
            dist, negative = dist[triplets.anchors], triplets.negative_proxies[triplets.anchors]  # [T, P]
        else:
            positive, negative = self.bank.assign(-dist, labels, self.assignment)
            positive_dist = dist.masked_fill(~positive, float("inf")).amin(dim=1, keepdim=True)
        terms = torch.relu(positive_dist + self.margin - dist).masked_fill(~negative, 0.0)
        return self.reducer(terms, negative)
