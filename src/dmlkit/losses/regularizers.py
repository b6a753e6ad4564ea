"""Regularizers added to a loss: on the embeddings, or on a loss's own weights (its proxies).

As in pytorch-metric-learning, a loss takes ``embedding_regularizer=`` / ``embedding_reg_weight=``
and (losses with proxies) ``weight_regularizer=`` / ``weight_reg_weight=``; the total is
``loss + embedding_reg_weight * R_e(embeddings) + weight_reg_weight * R_w(proxies)``. A
regularizer is any callable ``R(x [N, D]) -> scalar``: dmlkit's classes below or a PML
regularizer object. The embedding regularizer sees the embeddings as the loss received them
(before any normalisation), the weight regularizer the proxies ``[num_proxies, D]`` (PML: a
classification loss's ``W.t()``, one row per class).

dmlkit's regularizers follow PML's call: :meth:`BaseRegularizer.compute_loss` returns a loss dict
(one term per row, or per pair of centres) and the regularizer's ``reducer`` (default
:class:`~dmlkit.losses.reducers.MeanReducer`) reduces it; ``distance`` is the measure it uses.
"""

from __future__ import annotations

import torch

from dmlkit.core.records import init_stats
from dmlkit.core.validation import Interval, validate_params
from dmlkit.distances import BaseDistance, CosineSimilarity, LpDistance
from dmlkit.exceptions import InvalidParameterError
from dmlkit.losses.reducers import DivisorReducer, MeanReducer


def _element_terms(losses: torch.Tensor, x: torch.Tensor) -> dict:
    """PML's loss dict for one term per row of ``x``."""
    rows = torch.arange(losses.shape[0], device=x.device)
    return {"loss": {"losses": losses, "indices": rows, "reduction_type": "element"}}


class BaseRegularizer(torch.nn.Module):
    """``R(x [N, D]) -> scalar``: ``reducer(compute_loss(x), x, arange(N))`` (PML's ``BaseRegularizer``).

    ``distance`` and ``reducer`` default to :meth:`get_default_distance` and
    :meth:`get_default_reducer`; a subclass defines :meth:`compute_loss`.
    """

    #: Statistics recorded with ``collect_stats`` (PML's names).
    stats: tuple[str, ...] = ()

    def __init__(self, distance: object | None = None, reducer: object | None = None,
                 collect_stats: bool | None = None):
        super().__init__()
        self.distance = self.get_default_distance() if distance is None else distance
        self.reducer = self.get_default_reducer() if reducer is None else reducer
        init_stats(self, collect_stats, self.stats)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = torch.arange(x.shape[0], device=x.device)
        return self.reducer(self.compute_loss(x), x, rows)

    def compute_loss(self, x: torch.Tensor) -> dict:  # pragma: no cover - interface
        """PML's loss dict of the terms for ``x [N, D]``."""
        raise NotImplementedError

    def get_default_distance(self) -> BaseDistance:
        return LpDistance()

    def get_default_reducer(self) -> torch.nn.Module:
        return MeanReducer()

    def require_distance(self, kind: type, **settings) -> None:
        """The ``distance`` must be a ``kind`` (dmlkit's or PML's class of that name) with ``settings``."""
        distance = self.distance
        same_kind = isinstance(distance, kind) or type(distance).__name__ == kind.__name__
        if not same_kind or any(getattr(distance, k, None) != v for k, v in settings.items()):
            wanted = ", ".join(f"{k}={v!r}" for k, v in settings.items())
            raise InvalidParameterError(
                f"The 'distance' parameter of {type(self).__name__} must be a {kind.__name__}({wanted}). "
                f"Got {distance!r} instead."
            )


class LpRegularizer(BaseRegularizer):
    """``mean_i ||x_i||_p ** power``: pulls embedding (or weight) norms towards 0 (PML's ``LpRegularizer``)."""

    def __init__(self, p: float = 2, power: float = 1, **kwargs):
        super().__init__(**kwargs)
        validate_params(type(self).__name__, {"p": p, "power": power},
                        {"p": [Interval(float, 0, None, closed="neither")],
                         "power": [Interval(float, 0, None, closed="neither")]})
        self.p = p
        self.power = power

    def compute_loss(self, x: torch.Tensor) -> dict:
        norms = torch.linalg.vector_norm(x, ord=self.p, dim=1)
        return _element_terms(norms if self.power == 1 else norms**self.power, x)

    def extra_repr(self) -> str:
        return f"p={self.p}, power={self.power}"


class CenterInvariantRegularizer(BaseRegularizer):
    """``(|w_i|^2 - mean_j |w_j|^2)^2 / 4`` per class weight: equal weight norms.

    Center-invariant loss of Wu et al., "Deep Face Recognition with Center Invariant Loss"
    (ACM MM Workshops 2017), Eq. (3). ``distance`` must be ``LpDistance(power=1,
    normalize_embeddings=False)`` (it measures the norms).
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.require_distance(LpDistance, power=1, normalize_embeddings=False)

    def get_default_distance(self) -> BaseDistance:
        return LpDistance(power=1, normalize_embeddings=False)

    def compute_loss(self, weights: torch.Tensor) -> dict:
        squared_norms = self.distance.get_norm(weights) ** 2
        return _element_terms((squared_norms - squared_norms.mean()) ** 2 / 4, weights)


class RegularFaceRegularizer(BaseRegularizer):
    """``max_{j != i} cos(w_i, w_j)`` per class weight: pushes each class from its nearest one.

    RegularFace, Zhao et al. (CVPR 2019), Eq. (4) (exclusive regularization); the nearest class is
    chosen without gradient, as in PML. ``distance`` must be a similarity (default cosine).
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        if not self.distance.is_inverted:
            raise InvalidParameterError(
                f"The 'distance' parameter of RegularFaceRegularizer must be a similarity (is_inverted). "
                f"Got {self.distance!r} instead."
            )

    def get_default_distance(self) -> BaseDistance:
        return CosineSimilarity()

    def compute_loss(self, weights: torch.Tensor) -> dict:
        cos = self.distance(weights)
        with torch.no_grad():
            others = cos.detach().clone()
            others.fill_diagonal_(float("-inf"))
            nearest = others.argmax(1)
        rows = torch.arange(weights.shape[0], device=weights.device)
        return _element_terms(cos[rows, nearest], weights)


class SparseCentersRegularizer(BaseRegularizer):
    """``sqrt(2 - 2 cos(w_a, w_b))`` summed over each class's pairs of centres, divided by twice their number.

    The sparse-centres term of SoftTriple (Qian et al., ICCV 2019, Eq. (12)-(13), ``R(w)``):
    the ``centers_per_class`` centres of a class are the consecutive rows ``[c K, (c + 1) K)``.
    ``distance`` must be cosine; the reducer defaults to
    :class:`~dmlkit.losses.reducers.DivisorReducer` (the divisor travels with the terms).
    """

    stats = ("same_class_center_sim", "diff_class_center_sim")

    def __init__(self, num_classes: int, centers_per_class: int, **kwargs):
        super().__init__(**kwargs)
        validate_params(type(self).__name__, {"num_classes": num_classes, "centers_per_class": centers_per_class},
                        {"num_classes": [Interval(int, 1, None)], "centers_per_class": [Interval(int, 2, None)]})
        self.require_distance(CosineSimilarity)
        self.num_classes = num_classes
        self.centers_per_class = centers_per_class
        total = num_classes * centers_per_class
        block = torch.arange(total) // centers_per_class
        same_class = block.unsqueeze(1) == block.unsqueeze(0)
        self.same_class_mask = same_class & torch.ones(total, total, dtype=torch.bool).triu(1)
        self.diff_class_mask = ~same_class

    def get_default_distance(self) -> BaseDistance:
        return CosineSimilarity()

    def get_default_reducer(self) -> torch.nn.Module:
        return DivisorReducer()

    def compute_loss(self, weights: torch.Tensor) -> dict:
        cos = self.distance(weights)
        same = self.same_class_mask.to(cos.device)
        tiny = torch.finfo(weights.dtype).tiny
        terms = torch.sqrt(2.0 + tiny - torch.clamp(2.0 * cos[same], max=2.0))
        if self.collect_stats:
            with torch.no_grad():
                self.same_class_center_sim = cos[same].mean().item()
                self.diff_class_center_sim = cos[self.diff_class_mask.to(cos.device)].mean().item()
        rows = torch.arange(terms.shape[0], device=weights.device)
        return {"loss": {"losses": terms, "indices": rows, "reduction_type": "element", "divisor": 2 * int(same.sum())}}

    def extra_repr(self) -> str:
        return f"num_classes={self.num_classes}, centers_per_class={self.centers_per_class}"


class ZeroMeanRegularizer(BaseRegularizer):
    """``|sum_d x_id|`` per row: pulls each row's components to sum (and average) to zero (PML's ``ZeroMeanRegularizer``)."""

    def compute_loss(self, x: torch.Tensor) -> dict:
        return _element_terms(x.sum(1).abs(), x)


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


__all__ = [
    "BaseRegularizer",
    "CenterInvariantRegularizer",
    "LpRegularizer",
    "RegularFaceRegularizer",
    "SparseCentersRegularizer",
    "ZeroMeanRegularizer",
    "check_reg_weight",
    "check_regularizer",
]
