"""Any pair loss against proxies (ASAP Eq. (4.11))."""

from __future__ import annotations

from typing import Callable

import torch

from dmlkit.core.validation import Options
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
    (e.g. ``ContrastiveLoss``, ``CosineContrastiveLoss``, ``MultiSimilarityLoss``,
    ``TripletMarginLoss`` from ``dmlkit.losses.pair``) and applies its own distance and normalisation.

    ``reduction`` says how the pair terms become the loss:

    * ``"mean"``: ASAP Alg. 1 / Eq. (4.11), ``1/(m |rho|) sum_{rho x [m]} l(rho_i, z_j)``: the
      sum of every (sample, proxy) pair term divided by batch size times proxy count. It needs a
      per-pair loss that sums its terms (``pair_loss`` built with ``reduction="sum"``; contrastive
      C1/C2). This is what the ``asap-c1/c2-*`` presets run.
    * ``"pair_loss"`` (default): the wrapped loss's own reduction (e.g. MS's mean over anchors,
      triplet's mean over non-zero triplets; those losses have no single term per pair).
    """

    supports_fractional = False
    _repr_keys = ("num_classes", "embedding_size", "proxies_per_class", "reduction")
    _parameter_constraints = {"reduction": [Options(("pair_loss", "mean"))]}

    def __init__(
        self,
        pair_loss: Callable[..., torch.Tensor],
        num_classes: int,
        embedding_size: int,
        proxies_per_class: int = 1,
        proxy_init: str = "normal",
        seed: int = 0,
        reduction: str = "pair_loss",
    ):
        if not callable(pair_loss):
            raise InvalidParameterError(
                f"The 'pair_loss' parameter of ProxyPairLoss must be a callable loss "
                f"(embeddings, labels, ref_emb=..., ref_labels=...). Got {pair_loss!r} instead."
            )
        if reduction == "mean" and getattr(pair_loss, "reduction", None) != "sum":
            raise InvalidParameterError(
                "ProxyPairLoss(reduction='mean') divides the sum of the pair terms by m |rho| (ASAP Eq. 4.11), "
                "so its 'pair_loss' must sum them (a per-pair loss built with reduction='sum'). "
                f"Got pair_loss with reduction={getattr(pair_loss, 'reduction', None)!r} instead."
            )
        super().__init__(num_classes, embedding_size, proxies_per_class, proxy_init, seed)
        self.pair_loss = pair_loss  # registered as a submodule when it is an nn.Module
        self.reduction = reduction

    def get_logits(self, embeddings: torch.Tensor) -> torch.Tensor:
        """``[B, num_proxies]`` measure of the wrapped pair loss between ``embeddings`` and the proxies."""
        return self.pair_loss.distance(embeddings, self.proxies)

    def compute_loss(self, embeddings: torch.Tensor, labels: torch.Tensor, **kwargs) -> torch.Tensor:
        self.bank.check_labels(labels)
        self.reject_kwargs({k: v for k, v in kwargs.items() if k in ("ref_emb", "ref_labels")})  # the proxies are its references
        embeddings, proxies = common_dtype(embeddings, self.proxies)
        value = self.pair_loss(embeddings, labels, ref_emb=proxies, ref_labels=self.proxy_labels, **kwargs)
        if self.reduction == "mean":  # Eq. (4.11): 1 / (m |rho|)
            value = value / (embeddings.shape[0] * proxies.shape[0])
        return value
