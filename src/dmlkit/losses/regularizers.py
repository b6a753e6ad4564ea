"""Regularizers added to a loss: on the embeddings, or on a loss's own weights (its proxies).

As in pytorch-metric-learning, a loss takes ``embedding_regularizer=`` / ``embedding_reg_weight=``
and (losses with proxies) ``weight_regularizer=`` / ``weight_reg_weight=``; the total is
``loss + embedding_reg_weight * R_e(embeddings) + weight_reg_weight * R_w(proxies)``. A
regularizer is any callable ``R(x [N, D]) -> scalar``: dmlkit's :class:`LpRegularizer` or a PML
regularizer object (``LpRegularizer``, ``RegularFaceRegularizer``, ``SparseCentersRegularizer``, ...),
which reduces its own terms. The embedding regularizer sees the embeddings as the loss received
them (before any normalisation), the weight regularizer the proxies ``[num_proxies, D]``.
"""

from __future__ import annotations

import torch

from dmlkit._validation import Interval, Options, validate_params
from dmlkit.exceptions import InvalidParameterError


class LpRegularizer(torch.nn.Module):
    """``mean_i ||x_i||_p ** power``: pulls embedding (or weight) norms towards 0 (PML's ``LpRegularizer``)."""

    def __init__(self, p: int = 2, power: int = 1):
        super().__init__()
        validate_params("LpRegularizer", {"p": p, "power": power},
                        {"p": [Options((1, 2))], "power": [Interval(int, 1, None)]})
        self.p = p
        self.power = power

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.linalg.vector_norm(x, ord=self.p, dim=1).pow(self.power).mean()

    def extra_repr(self) -> str:
        return f"p={self.p}, power={self.power}"


def check_regularizer(value: object, key: str, owner: str) -> None:
    """``value`` must be None or callable as ``value(x) -> scalar``."""
    if value is not None and not callable(value):
        raise InvalidParameterError(
            f"The '{key}' parameter of {owner} must be a regularizer called as R(x) -> scalar "
            f"(dmlkit's or pytorch-metric-learning's) or None. Got {value!r} instead."
        )


def check_reg_weight(value: object, key: str, owner: str) -> float:
    """A finite float weight."""
    validate_params(owner, {key: value}, {key: [Interval(float)]})
    return float(value)
