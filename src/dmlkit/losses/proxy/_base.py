"""Base class of the proxy losses: a :class:`MetricLoss` that owns a :class:`ProxyBank`."""

from __future__ import annotations

import torch

from dmlkit._validation import Options, validate_params
from dmlkit.exceptions import InvalidParameterError
from dmlkit.losses.base import MetricLoss
from dmlkit.losses.proxy._fused import MATMUL_PRECISIONS, Kernel, Workspace, fused_proxy_loss
from dmlkit.proxies import ProxyBank


class ProxyLoss(MetricLoss):
    """A metric loss with learnable proxies ``loss.proxies [num_proxies, embedding_size]`` (class-major).

    The proxies live in ``self.bank`` (a :class:`ProxyBank`); ``proxies``, ``proxy_labels`` and
    ``init_proxies_from`` are shortcuts to it. Put ``loss.proxies`` in its own optimiser
    parameter group (proxy losses usually want a larger learning rate).

    ``matmul_precision`` (losses with a fused kernel): ``"highest"`` (default) keeps every
    product in fp32; ``"medium"`` runs the three proxy-by-batch products in bfloat16 with fp32
    accumulation of the loss, 1.3-1.8x faster at SOP scale with 4 proxies per class on this
    project's AVX512-BF16 CPU (see :mod:`dmlkit.losses.proxy._fused` for the error it brings).
    """

    #: Whether a fractional ``proxies_per_class < 1`` makes sense for this loss.
    supports_fractional: bool = True

    def __init__(
        self,
        num_classes: int,
        embedding_size: int,
        proxies_per_class: float = 1,
        proxy_init: str = "normal",
        seed: int = 0,
        matmul_precision: str = "highest",
    ):
        super().__init__()
        owner = type(self).__name__
        validate_params(
            owner, {"matmul_precision": matmul_precision}, {"matmul_precision": [Options(MATMUL_PRECISIONS)]}
        )
        self.matmul_precision = matmul_precision
        self.bank = ProxyBank(num_classes, embedding_size, proxies_per_class, proxy_init, seed, owner=owner)
        self._workspace = Workspace()
        if self.bank.is_fractional and not self.supports_fractional:
            raise InvalidParameterError(
                f"The 'proxies_per_class' parameter of {owner} must be an int >= 1. "
                f"Got {proxies_per_class!r} instead."
            )

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
        """Check that ``embeddings [B, D]`` match the proxies' ``D``, then :meth:`MetricLoss.forward`."""
        if isinstance(embeddings, torch.Tensor) and embeddings.dim() == 2 and embeddings.shape[1] != self.embedding_size:
            from dmlkit.exceptions import DataError

            raise DataError(
                f"embeddings has {embeddings.shape[1]} columns but {type(self).__name__} has "
                f"embedding_size={self.embedding_size} (proxies are [{self.proxies.shape[0]}, {self.embedding_size}])."
            )
        return super().forward(embeddings, labels, **kwargs)

    @property
    def proxies(self) -> torch.nn.Parameter:
        """The learnable proxies ``[num_proxies, embedding_size]``; class ``c`` owns rows ``c*K .. c*K+K-1``."""
        return self.bank.proxies

    @property
    def proxy_labels(self) -> torch.Tensor:
        """Class of each proxy ``[num_proxies]`` (proxy ids when fractional)."""
        return self.bank.proxy_labels

    @property
    def num_classes(self) -> int:
        return self.bank.num_classes

    @property
    def embedding_size(self) -> int:
        return self.bank.embedding_size

    @property
    def proxies_per_class(self) -> float:
        return self.bank.proxies_per_class

    def init_proxies_from(self, embeddings: torch.Tensor, labels: torch.Tensor, seed: int | None = None) -> torch.Tensor:
        """Initialise each class's proxies from random sample embeddings of that class (see :meth:`ProxyBank.init_from`)."""
        return self.bank.init_from(embeddings, labels, seed=seed)

    def fused(
        self,
        xn: torch.Tensor,
        proxies: torch.Tensor,
        kernel: Kernel,
        scale: float,
        labels: torch.Tensor,
        columns: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """:func:`fused_proxy_loss` with this loss's scratch buffers and ``matmul_precision`` (in
        ``"medium"``, the proxies of ``labels``' classes stay fp32; ``columns`` = those proxies'
        rows when the caller already has them)."""
        exact = None
        if self.matmul_precision == "medium":
            exact = self.bank.present_columns(labels) if columns is None else columns
        return fused_proxy_loss(xn, proxies, kernel, scale, self._workspace, self.matmul_precision, exact)

    def reject_kwargs(self, kwargs: dict) -> None:
        """Raise on keyword arguments this loss does not use (miner pairs, ref_emb, ...), never ignore them."""
        if kwargs:
            raise InvalidParameterError(
                f"{type(self).__name__} got unsupported keyword argument(s) {sorted(kwargs)}; proxy losses "
                "compare the batch with their proxies and take no pairs, weights or reference set."
            )
