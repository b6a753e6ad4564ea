"""Any pair loss against proxies (ASAP Eq. (4.11))."""

from __future__ import annotations

from typing import Callable

import torch

from dmlkit.exceptions import InvalidParameterError
from dmlkit.losses.base import LOSSES
from dmlkit.losses.proxy._base import ProxyLoss
from dmlkit.losses.proxy._math import common_dtype


@LOSSES.register("proxy_pair")
class ProxyPairLoss(ProxyLoss):
    """A pair loss between the batch and all ``K*C`` proxies, each proxy labelled by its class.

    ASAP Eq. (4.11): ``1/C sum_i E_z[l(rho_i, z)]`` — the batch samples are the anchors and the
    proxies the reference set, so ``pair_loss(embeddings, labels, ref_emb=proxies,
    ref_labels=proxy_labels)`` is called; ``pair_loss`` is any loss with that keyword interface
    (e.g. ``ContrastiveLoss``, ``MultiSimilarityLoss``, ``TripletMarginLoss`` from
    ``dmlkit.losses.pair``) and applies its own distance, normalisation and reduction.
    """

    supports_fractional = False
    _repr_keys = ("num_classes", "embedding_size", "proxies_per_class")

    def __init__(
        self,
        pair_loss: Callable[..., torch.Tensor],
        num_classes: int,
        embedding_size: int,
        proxies_per_class: int = 1,
        proxy_init: str = "normal",
        seed: int = 0,
    ):
        if not callable(pair_loss):
            raise InvalidParameterError(
                f"The 'pair_loss' parameter of ProxyPairLoss must be a callable loss "
                f"(embeddings, labels, ref_emb=..., ref_labels=...). Got {pair_loss!r} instead."
            )
        super().__init__(num_classes, embedding_size, proxies_per_class, proxy_init, seed)
        self.pair_loss = pair_loss  # registered as a submodule when it is an nn.Module

    def get_logits(self, embeddings: torch.Tensor) -> torch.Tensor:
        """``[B, num_proxies]`` measure of the wrapped pair loss between ``embeddings`` and the proxies."""
        return self.pair_loss.distance(embeddings, self.proxies)

    def compute_loss(self, embeddings: torch.Tensor, labels: torch.Tensor, **kwargs) -> torch.Tensor:
        self.bank.check_labels(labels)
        embeddings, proxies = common_dtype(embeddings, self.proxies)
        return self.pair_loss(embeddings, labels, ref_emb=proxies, ref_labels=self.proxy_labels, **kwargs)
