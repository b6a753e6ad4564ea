"""Manifold loss (Aziere & Todorovic, "Ensemble Deep Manifold Similarity Learning using Hard
Proxies", CVPR 2019).

The batch and ``K`` proxies form a graph with affinities ``W_ij = exp(max(cos(x_i, x_j), 0) / 0.5)``
(no self-loops); ``S = D^-1/2 W D^-1/2`` and the random walk's closed form
``F = (1 - alpha) (I - alpha S)^-1`` (Eq. (3)) give manifold similarities. With ``c_i`` the
proxy of sample ``i``:

* intrinsic loss (Eq. (5)): ``log(1 + sum_{k != c_i, v_ik >= 0} exp(v_ik))`` with
  ``v_ik = F_{i,k} - F_{i,c_i} + margin`` (``F_{i,k}``: sample-to-proxy entry);
* context loss (Eq. (6)): the same on ``cos(F_i, F_k)``, the cosine between the sample's and
  the proxy's rows of ``F``;
* ``loss = mean intrinsic + lambdaC * mean context`` (Eq. (7)); ``lambdaC=inf`` keeps the
  context loss alone.

Which proxy a sample belongs to: PML takes it as ``indices_tuple`` (a ``[B]`` tensor) and
otherwise draws a random assignment (each proxy at least once when ``B >= K``); dmlkit also
takes it as ``labels`` (the authors' code uses the class labels, one proxy per class) and draws
from a seeded generator saved in ``state_dict``. ``(I - alpha S)`` is symmetric positive
definite, so its inverse comes from a Cholesky factorisation (PML: a general inverse).
Proxies: ``loss.proxies [K, l]`` (a :class:`~dmlkit.proxies.ProxyBank` with one proxy per
meta-class).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from dmlkit.core.validation import Interval, check_embeddings_labels
from dmlkit.distances import BaseDistance, CosineSimilarity
from dmlkit.exceptions import AssertedParameterError, DataError, InvalidParameterError
from dmlkit.losses.base import LOSSES
from dmlkit.losses.logsumexp import log1p_sum_exp
from dmlkit.losses.pair._triplets import GeneratorStateMixin
from dmlkit.losses.proxy._base import ProxyLoss


def _hinged_log_sum(values: torch.Tensor, own: torch.Tensor, margin: float) -> torch.Tensor:
    """``mean_i log(1 + sum_{k != own_i, v_ik >= 0} exp(v_ik))`` with ``v_ik = values_ik - values_{i,own_i} + margin``."""
    rows = torch.arange(values.shape[0], device=values.device)
    gaps = values - values[rows, own].unsqueeze(1) + margin
    keep = gaps >= 0
    keep[rows, own] = False
    return log1p_sum_exp(gaps, keep, dim=1).mean()


@LOSSES.register("manifold")
class ManifoldLoss(GeneratorStateMixin, ProxyLoss):
    """``mean intrinsic + lambdaC * mean context`` on random-walk manifold similarities (Aziere & Todorovic Eqs. (3)-(7))."""

    supports_fractional = False
    requires_labels = False
    _repr_keys = ("l", "K", "lambdaC", "alpha", "margin")
    _parameter_constraints = {
        "l": [Interval(int, 1, None)],
        "K": [Interval(int, 1, None)],
        "lambdaC": [Interval(float, 0, None)],
        "alpha": [Interval(float, 0, 1, closed="neither")],
        "margin": [Interval(float)],
        "seed": [Interval(int, 0, None)],
    }

    def __init__(
        self,
        l: int,  # noqa: E741 - PML's name (the embedding size)
        K: int = 50,
        lambdaC: float = 1.0,
        alpha: float = 0.8,
        margin: float = 5e-4,
        seed: int = 0,
        *,
        distance: object | None = None,
        reducer: object | None = None,
        embedding_regularizer: object | None = None,
        embedding_reg_weight: float = 1.0,
        weight_regularizer: object | None = None,
        weight_reg_weight: float = 1.0,
    ):
        super().__init__(
            K, l, 1, "normal", seed,
            distance=distance, reducer=reducer, embedding_regularizer=embedding_regularizer,
            embedding_reg_weight=embedding_reg_weight, weight_regularizer=weight_regularizer,
            weight_reg_weight=weight_reg_weight,
        )
        self.l, self.K = int(l), int(K)
        self.lambdaC, self.alpha, self.margin = float(lambdaC), float(alpha), float(margin)
        self.generator = torch.Generator().manual_seed(seed)

    def default_distance(self) -> BaseDistance:
        return CosineSimilarity()

    def forward(self, embeddings, labels=None, indices_tuple=None, ref_emb=None, ref_labels=None):
        """``loss(embeddings [B, l], labels=None, indices_tuple=None)``; ``labels`` or ``indices_tuple`` ``[B]``: the proxies."""
        if ref_emb is not None or ref_labels is not None:
            raise InvalidParameterError("ManifoldLoss takes no ref_emb / ref_labels (its graph is the batch and its proxies).")
        if labels is not None and indices_tuple is not None:
            raise InvalidParameterError("ManifoldLoss got both labels and indices_tuple; both name the proxies, pass one.")
        meta = labels if indices_tuple is None else indices_tuple
        check_embeddings_labels(embeddings, meta, labels_name="labels" if indices_tuple is None else "indices_tuple")
        if embeddings.shape[1] != self.l:
            raise AssertedParameterError(f"embeddings has {embeddings.shape[1]} columns but ManifoldLoss has l={self.l}.")
        if meta is not None and meta.numel() and (int(meta.min()) < 0 or int(meta.max()) >= self.K):
            raise DataError(f"ManifoldLoss labels must name one of its K={self.K} proxies (0 .. {self.K - 1}).")
        return super().forward(embeddings, meta)

    def _random_meta_classes(self, num: int, device: torch.device) -> torch.Tensor:
        """Each proxy once (when ``num >= K``), the rest uniform, in random order (PML's rule, seeded)."""
        if num >= self.K:
            rest = torch.randint(0, self.K, (num - self.K,), generator=self.generator)
            meta = torch.cat([torch.arange(self.K), rest])[torch.randperm(num, generator=self.generator)]
        else:
            meta = torch.randperm(self.K, generator=self.generator)[:num]
        return meta.to(device)

    def compute_loss(self, embeddings: torch.Tensor, labels: torch.Tensor | None, **kwargs) -> torch.Tensor:
        self.reject_kwargs(kwargs)
        num = embeddings.shape[0]
        own = self._random_meta_classes(num, embeddings.device) if labels is None else labels.to(embeddings.device)
        nodes = torch.cat([embeddings, self.proxies.to(embeddings.dtype)])
        affinity = torch.exp(self.distance(nodes, nodes).clamp_min(0.0) / 0.5)
        affinity = affinity * (1.0 - torch.eye(nodes.shape[0], dtype=affinity.dtype, device=affinity.device))
        scale = affinity.sum(1).rsqrt()
        system = torch.eye(nodes.shape[0], dtype=affinity.dtype, device=affinity.device)
        system = system - self.alpha * (scale[:, None] * affinity * scale[None, :])
        factor, info = torch.linalg.cholesky_ex(system)
        inverse = torch.cholesky_inverse(factor) if int(info) == 0 else torch.linalg.inv(system)
        manifold = (1.0 - self.alpha) * inverse  # F, Eq. (3)
        rows = F.normalize(manifold, dim=1, eps=1e-8)
        context = _hinged_log_sum(rows[:num] @ rows[num:].T, own, self.margin)  # cos(F_i, F_k)
        if math.isinf(self.lambdaC):
            return context
        intrinsic = _hinged_log_sum(manifold[:num, num:], own, self.margin)
        return intrinsic + self.lambdaC * context
