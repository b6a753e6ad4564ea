"""Base class of the proxy losses: a :class:`MetricLoss` that owns a :class:`ProxyBank`."""

from __future__ import annotations

import torch

from dmlkit.core.validation import Options
from dmlkit.distances import BaseDistance, as_distance
from dmlkit.exceptions import DataError, InvalidParameterError
from dmlkit.losses.base import MetricLoss
from dmlkit.losses.proxy._fused import MATMUL_PRECISIONS, Kernel, Workspace, fused_proxy_loss
from dmlkit.losses.reducers import get_reducer
from dmlkit.proxies import ProxyBank


def describe_distance(distance: object) -> str:
    """``LpDistance(power=2, normalize_embeddings=True)``: a distance with the settings that tell measures apart."""
    settings = [f"{key}={vars(distance)[key]!r}" for key in ("power", "normalize_embeddings") if key in vars(distance)]
    return f"{type(distance).__name__}({', '.join(settings)})"


def _same_measure(given: object, expected: object) -> bool:
    return type(given) is type(expected) and all(
        vars(given).get(key) == vars(expected).get(key) for key in ("power", "normalize_embeddings"))


HALF = (torch.float16, torch.bfloat16)

class ProxyLoss(MetricLoss):
    """A metric loss with learnable proxies ``loss.proxies [num_proxies, embedding_size]`` (class-major).

    The proxies live in ``self.bank`` (a :class:`ProxyBank`); ``proxies``, ``proxy_labels`` and
    ``init_proxies_from`` are shortcuts to it. Put ``loss.proxies`` in its own optimiser
    parameter group (proxy losses usually want a larger learning rate).

    ``matmul_precision`` (losses with a fused kernel): ``"highest"`` (default) keeps every
    product in fp32; ``"medium"`` runs the three proxy-by-batch products in bfloat16 with fp32
    accumulation of the loss, faster where bf16 products are native (speed-ups in
    ``docs/results.md``; :mod:`dmlkit.losses.proxy._fused` states the error it brings).
    """

    #: Whether a fractional ``proxies_per_class < 1`` makes sense for this loss.
    supports_fractional: bool = True
    #: Reductions this loss implements (its equation's own averaging; ``reducer=`` may only name it).
    reductions: tuple[str, ...] = ("mean",)
    #: Storage of the bank's leaf parameter (:data:`dmlkit.proxies.LAYOUTS`).
    proxy_layout: str = "class_major"

    _parameter_constraints = {"matmul_precision": [Options(MATMUL_PRECISIONS)]}

    def default_distance(self) -> BaseDistance | None:
        """The measure between embeddings and proxies that this loss's equation uses (None: set elsewhere)."""
        return None

    def __init__(
        self,
        num_classes: int,
        embedding_size: int,
        proxies_per_class: float = 1,
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
        super().__init__()
        owner = type(self).__name__
        self.distance = self._check_distance(distance, owner)
        self.reducer = get_reducer(self.reductions[0] if reducer is None else reducer, owner, self.reductions)
        self.set_regularizers(embedding_regularizer, embedding_reg_weight, weight_regularizer, weight_reg_weight)
        self.matmul_precision = matmul_precision
        self.bank = ProxyBank(num_classes, embedding_size, proxies_per_class, proxy_init, seed, owner=owner,
                              layout=self.proxy_layout)
        self._workspace = Workspace()
        if self.bank.is_fractional and not self.supports_fractional:
            raise InvalidParameterError(
                f"The 'proxies_per_class' parameter of {owner} must be an int >= 1. "
                f"Got {proxies_per_class!r} instead."
            )

    def accepted_distances(self) -> tuple[BaseDistance, ...]:
        """The measures a ``distance=`` argument may name: the equation's own (:meth:`default_distance`)."""
        expected = self.default_distance()
        return () if expected is None else (expected,)

    def _check_distance(self, distance: object | None, owner: str) -> BaseDistance | None:
        """The loss's own measure; a ``distance=`` argument (dmlkit or PML) must be one of :meth:`accepted_distances`."""
        if distance is None:
            return self.default_distance()
        accepted = self.accepted_distances()
        if not accepted:
            raise InvalidParameterError(f"{owner} takes no 'distance' parameter. Got {distance!r}.")
        given = as_distance(distance, owner)
        for measure in accepted:
            if _same_measure(given, measure):
                return measure
        names = " or ".join(describe_distance(m) for m in accepted)
        raise InvalidParameterError(
            f"The 'distance' parameter of {owner} must be {names} (the measure of its equation) or None. "
            f"Got {describe_distance(given)} instead."
        )

    def forward(
        self,
        embeddings: torch.Tensor,
        labels: torch.Tensor | None = None,
        indices_tuple: tuple | None = None,
        **kwargs,
    ) -> torch.Tensor:
        """Check that ``embeddings [B, D]`` match the proxies' ``D``, then :meth:`MetricLoss.forward`."""
        if isinstance(embeddings, torch.Tensor) and embeddings.dim() == 2 and embeddings.shape[1] != self.embedding_size:
            raise DataError(
                f"embeddings has {embeddings.shape[1]} columns but {type(self).__name__} has "
                f"embedding_size={self.embedding_size} (proxies are [{self.proxies.shape[0]}, {self.embedding_size}])."
            )
        return super().forward(embeddings, labels, indices_tuple, **kwargs)

    def own_state(self) -> torch.Tensor:
        """The bank's leaf parameter (``proxies``, or the classification losses' ``W``)."""
        return self.bank.parameter

    def follow_embeddings_(self, embeddings: torch.Tensor) -> None:
        """PML's ``cast_types``: the proxies (and every buffer) move to the embeddings' device, and the proxies
        take a float64, float16 or bfloat16 batch's dtype (and float32 back from half); a float32 batch leaves
        float64 proxies as they are. The same Parameter object throughout, its ``.data`` replaced. The loss
        itself is accumulated in float32 (or float64); dmlkit's trainer hands losses float32 embeddings, so
        its proxies stay float32."""
        super().follow_embeddings_(embeddings)
        dtype = self.bank.parameter.dtype
        if embeddings.dtype != dtype and (embeddings.dtype in (torch.float64, *HALF) or dtype in HALF):
            self.bank.promote_(embeddings.dtype)

    @property
    def proxies(self) -> torch.nn.Parameter:
        """The learnable proxies ``[num_proxies, embedding_size]``; class ``c`` owns rows ``c*K .. c*K+K-1``.

        Assignable as in PML (``loss.proxies = torch.nn.Parameter(class_means)``): the given
        parameter becomes the loss's own (shared, not copied), after a shape check.
        """
        return self.bank.proxies

    def __setattr__(self, name: str, value: object) -> None:
        if name == "proxies" and "bank" in self.__dict__.get("_modules", {}):
            self.set_proxies(value)
        else:
            super().__setattr__(name, value)

    def set_proxies(self, value: object) -> None:
        """Make ``value [num_proxies, embedding_size]`` (a Parameter, or a tensor wrapped in one) the proxies."""
        expected = (self.bank.num_proxies, self.embedding_size)
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != expected or not value.is_floating_point():
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise DataError(
                f"{type(self).__name__}.proxies must be a float tensor of shape {list(expected)} "
                f"(num_proxies x embedding_size). Got {shape} instead."
            )
        self.bank.replace_parameter(value)

    def get_logits(self, embeddings: torch.Tensor) -> torch.Tensor:
        """``[B, num_proxies]`` measure between ``embeddings`` and the proxies (the loss's own ``distance``)."""
        dtype = torch.promote_types(embeddings.dtype, self.proxies.dtype)
        return self.distance(embeddings.to(dtype), self.proxies.to(dtype))

    def regularized_weights(self) -> torch.Tensor:
        """The proxies ``[num_proxies, D]``: what a ``weight_regularizer`` sees."""
        return self.proxies

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
        block: tuple[torch.Tensor | None, torch.Tensor | None] | None = None,
    ) -> torch.Tensor:
        """:func:`fused_proxy_loss` with this loss's scratch buffers and ``matmul_precision`` (in
        ``"medium"``, the proxies of ``labels``' classes stay fp32; ``block`` = their
        :meth:`ProxyBank.batch_columns` when the caller already has it)."""
        precision, exact, first = self.matmul_precision, None, None
        if precision == "medium":
            exact, first = self.bank.batch_columns(labels) if block is None else block
            if exact is None:  # every proxy is a candidate of the batch: all products stay fp32
                precision = "highest"
        return fused_proxy_loss(xn, proxies, kernel, scale, self._workspace, precision, exact, first)

    def reject_kwargs(self, kwargs: dict) -> None:
        """Raise on keyword arguments this loss does not use (miner pairs, ref_emb, ...), never ignore them."""
        if kwargs:
            raise InvalidParameterError(
                f"{type(self).__name__} got unsupported keyword argument(s) {sorted(kwargs)}; proxy losses "
                "compare the batch with their proxies and take no pairs, weights or reference set."
            )
