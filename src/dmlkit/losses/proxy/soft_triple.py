"""SoftTriple loss (Qian et al., ICCV 2019)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dmlkit._validation import Interval, validate_params
from dmlkit.losses.base import LOSSES
from dmlkit.losses.proxy._base import ProxyLoss
from dmlkit.losses.proxy._math import common_dtype, cosine_to_proxies


@LOSSES.register("soft_triple")
class SoftTripleLoss(ProxyLoss):
    """Softmax over classes of a soft max-over-centres similarity (SoftTriple, Qian et al. 2019, Sec. 3).

    ``S_{i,c} = sum_k softmax_k(s_{i,c,k} / gamma) s_{i,c,k}`` over the ``K = centers_per_class``
    proxies of class ``c`` (cosine ``s``); ``loss_i = CE(la * (S_i - margin * onehot(y_i)), y_i)``,
    mean over the batch. ``tau > 0`` adds the paper's centre regulariser:
    ``tau * sum_c sum_{k<k'} sqrt(2 + 1e-5 - 2 <w_ck, w_ck'>) / (C K (K-1))`` on normalised
    centres; ``tau=0`` (default) matches PML, which leaves it out.
    """

    supports_fractional = False
    _repr_keys = ("num_classes", "embedding_size", "proxies_per_class", "la", "gamma", "margin", "tau")

    def __init__(
        self,
        num_classes: int,
        embedding_size: int,
        centers_per_class: int = 10,
        la: float = 20,
        gamma: float = 0.1,
        margin: float = 0.01,
        tau: float = 0.0,
        proxy_init: str = "normal",
        seed: int = 0,
    ):
        validate_params(
            "SoftTripleLoss",
            {"centers_per_class": centers_per_class, "la": la, "gamma": gamma, "margin": margin, "tau": tau},
            {
                "centers_per_class": [Interval(int, 1, None)],
                "la": [Interval(float, 0, None, closed="neither")],
                "gamma": [Interval(float, 0, None, closed="neither")],
                "margin": [Interval(float, None, None)],
                "tau": [Interval(float, 0, None)],
            },
        )
        super().__init__(num_classes, embedding_size, centers_per_class, proxy_init, seed)
        self.la = float(la)
        self.gamma = float(gamma)
        self.margin = float(margin)
        self.tau = float(tau)

    @property
    def centers_per_class(self) -> int:
        return int(self.bank.proxies_per_class)

    def class_similarity(self, embeddings: torch.Tensor, proxies: torch.Tensor) -> torch.Tensor:
        """``[B, C]`` relaxed similarity ``S_{i,c}``: softmax(s/gamma)-weighted mean of the class's centre similarities."""
        sim = cosine_to_proxies(embeddings, proxies).view(-1, self.num_classes, self.centers_per_class)
        weights = torch.softmax(sim / self.gamma, dim=2)
        return (weights * sim).sum(dim=2)

    def compute_loss(self, embeddings: torch.Tensor, labels: torch.Tensor, **kwargs) -> torch.Tensor:
        self.reject_kwargs(kwargs)
        self.bank.check_labels(labels)
        embeddings, proxies = common_dtype(embeddings, self.proxies)
        logits = self.la * self.class_similarity(embeddings, proxies)
        rows = torch.arange(labels.numel(), device=labels.device)
        logits = logits.index_put((rows, labels), logits[rows, labels] - self.la * self.margin)
        loss = F.cross_entropy(logits, labels)
        if self.tau > 0 and self.centers_per_class > 1:
            loss = loss + self.tau * self.center_regularizer(proxies)
        return loss

    def center_regularizer(self, proxies: torch.Tensor) -> torch.Tensor:
        """Sum of pairwise distances between each class's normalised centres over ``C K (K-1)`` (SoftTriple regulariser)."""
        centers = F.normalize(proxies, dim=1).view(self.num_classes, self.centers_per_class, -1)
        gram = centers @ centers.transpose(1, 2)
        k = self.centers_per_class
        upper = torch.triu(torch.ones(k, k, dtype=torch.bool, device=gram.device), diagonal=1)
        dist = torch.sqrt((2.0 + 1e-5 - 2.0 * gram[:, upper]).clamp_min(1e-12))
        return dist.sum() / (self.num_classes * k * (k - 1))
