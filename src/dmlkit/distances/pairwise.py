"""Pairwise distances and similarities between two sets of embeddings.

Each class maps ``x [B, D]`` and ``y [R, D]`` to a ``[B, R]`` matrix. ``is_inverted`` is True
for similarities (larger means closer), as in pytorch-metric-learning.
"""

from __future__ import annotations

import torch

from dmlkit._validation import Options, validate_params
from dmlkit.distances.normalization import l2_normalize


class BaseDistance(torch.nn.Module):
    """Interface: ``forward(x, y=None) -> [B, R]``; ``y`` defaults to ``x``.

    ``matrix(x, refs)`` is the same matrix by the fastest route this measure knows (losses call
    it); ``analytic_form`` names the closed-form gradient the pair losses apply for this measure
    (``"cosine"``, ``"dot"``, ``"lp"``, ``"normalised_lp"``) or is None (autograd through
    :meth:`pairwise`, e.g. for a user subclass or a wrapped PML distance).
    """

    is_inverted: bool = False

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        return self.pairwise(x, x if y is None else y)

    @property
    def analytic_form(self) -> str | None:
        return None

    def matrix(self, x: torch.Tensor, refs: torch.Tensor) -> torch.Tensor:
        """``[B, R]`` between ``x [B, D]`` and ``refs [R, D]``, equal to ``self(x, refs)``."""
        return self(x, refs)

    def pairwise(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    def margin(self, closer: torch.Tensor, farther: torch.Tensor) -> torch.Tensor:
        """How much ``farther`` exceeds ``closer`` in this measure's direction (distance of neg - pos)."""
        return closer - farther if self.is_inverted else farther - closer


class CosineSimilarity(BaseDistance):
    """Cosine similarity ``<x/|x|, y/|y|>``; computes the normalisation itself."""

    is_inverted = True

    def pairwise(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return l2_normalize(x) @ l2_normalize(y).T

    @property
    def analytic_form(self) -> str | None:
        return "cosine" if type(self) is CosineSimilarity else None  # a subclass may redefine the measure

    def matrix(self, x: torch.Tensor, refs: torch.Tensor) -> torch.Tensor:
        if self.analytic_form is None:
            return self(x, refs)
        return normalised_product(x, refs)[0]


class DotProductSimilarity(BaseDistance):
    """Plain inner product ``<x, y>`` (no normalisation)."""

    is_inverted = True

    def pairwise(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x @ y.T

    @property
    def analytic_form(self) -> str | None:
        return "dot" if type(self) is DotProductSimilarity else None


class LpDistance(BaseDistance):
    """Euclidean distance ``||x - y||`` (``power=1``) or its square (``power=2``).

    Computed as ``|x|^2 + |y|^2 - 2<x, y>`` (one matrix product); the square root has a
    zero subgradient at coincident points instead of NaN.
    """

    def __init__(self, p: int = 2, power: int = 1, normalize_embeddings: bool = False):
        super().__init__()
        validate_params(
            type(self).__name__,
            {"p": p, "power": power},
            {"p": [Options((2,))], "power": [Options((1, 2))]},
        )
        self.p = p
        self.power = power
        self.normalize_embeddings = normalize_embeddings

    def pairwise(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.normalize_embeddings:
            x, y = l2_normalize(x), l2_normalize(y)
        sq = squared_euclidean(x, y)
        return sq if self.power == 2 else sq.clamp_min(1e-12).sqrt() * (sq > 1e-12)

    @property
    def analytic_form(self) -> str | None:
        if type(self) is not LpDistance:
            return None
        return "normalised_lp" if self.normalize_embeddings else "lp"

    def matrix(self, x: torch.Tensor, refs: torch.Tensor) -> torch.Tensor:
        """Between normalised rows: ``|x_n|^2 + |r_n|^2 - 2 cos`` from the scaled product (no normalised copy of ``refs``)."""
        if self.analytic_form != "normalised_lp":
            return self(x, refs)
        cos, x_norm, x_scale, r_norm, r_scale = normalised_product(x, refs)
        # The squared norms are 1 (0 for a zero row) and carry no gradient; float masks instead of
        # clamps and torch.where, which are slow on CPU. Coincident points get 0 with a zero subgradient.
        with torch.no_grad():  # a row whose norm overflows (inf * 0) maps to the origin, as in l2_normalize
            norms = (x_norm * x_scale).nan_to_num_(0.0).square() + (r_norm * r_scale).nan_to_num_(0.0).square()
        raw = norms - 2.0 * cos
        with torch.no_grad():
            apart = torch.sign((raw - 1e-12).clamp_min(0.0))
        if self.power == 2:
            return raw * apart
        return (raw * apart + (1.0 - apart)).sqrt() * apart


def normalised_product(x: torch.Tensor, refs: torch.Tensor):
    """``(cos [B, R], |x| [B, 1], 1/|x|, |r| [R], 1/|r|)``: ``x_n @ refs^T`` scaled by ``1/|r|``.

    Scaling the product instead of normalising ``refs`` (possibly a large memory) row by row gives
    the values of :func:`l2_normalize` (same eps; zero rows map to the origin).
    """
    x_norm = torch.linalg.vector_norm(x, dim=1, keepdim=True)
    r_norm = torch.linalg.vector_norm(refs, dim=1)
    x_scale = 1.0 / x_norm.clamp_min(1e-12)
    r_scale = 1.0 / r_norm.clamp_min(1e-12)
    return ((x * x_scale) @ refs.T) * r_scale, x_norm, x_scale, r_norm, r_scale


def squared_euclidean(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``[B, R]`` squared Euclidean distances, clamped at 0 against rounding."""
    xx = (x * x).sum(1, keepdim=True)
    yy = (y * y).sum(1)
    return (xx + yy - 2.0 * (x @ y.T)).clamp_min(0.0)


class CallableDistance(BaseDistance):
    """Wraps any object called as ``distance(x, y) -> [B, R]`` with an ``is_inverted`` flag.

    This is how a pytorch-metric-learning distance other than the standard three (for
    example ``SNRDistance`` or a user's own ``BaseDistance`` subclass) plugs into dmlkit's losses.
    """

    def __init__(self, distance: object):
        super().__init__()
        self.wrapped = distance
        self.is_inverted = bool(getattr(distance, "is_inverted", False))

    def pairwise(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.wrapped(x, y)

    def extra_repr(self) -> str:
        return f"wrapped={self.wrapped!r}"


def as_distance(distance: object, owner: str = "distance") -> BaseDistance:
    """A dmlkit distance for ``distance``: dmlkit's own as is, PML's standard ones converted.

    pytorch-metric-learning's ``CosineSimilarity``, ``DotProductSimilarity`` and
    ``LpDistance(p=2)`` become dmlkit's classes with the same settings (so the losses keep their
    fast paths); any other callable with an ``is_inverted`` attribute is wrapped in
    :class:`CallableDistance`.
    """
    from dmlkit.exceptions import InvalidParameterError

    if isinstance(distance, BaseDistance):
        return distance
    kind = type(distance).__name__
    module = type(distance).__module__
    if module.startswith("pytorch_metric_learning"):
        normalize = bool(getattr(distance, "normalize_embeddings", True))
        if kind == "CosineSimilarity":
            return CosineSimilarity()
        if kind == "DotProductSimilarity" and not normalize:
            return DotProductSimilarity()
        if kind == "DotProductSimilarity":
            return CosineSimilarity()
        if kind == "LpDistance" and getattr(distance, "p", 2) == 2 and getattr(distance, "power", 1) in (1, 2):
            return LpDistance(power=int(distance.power), normalize_embeddings=normalize)
    if callable(distance) and hasattr(distance, "is_inverted"):
        return CallableDistance(distance)
    raise InvalidParameterError(
        f"The 'distance' parameter of {owner} must be a dmlkit or pytorch-metric-learning distance "
        f"(called as distance(x, y) -> [B, R], with an is_inverted flag). Got {distance!r} instead."
    )


def create_distance(name: str, **kwargs) -> BaseDistance:
    """Build a distance by name: ``cosine``, ``dot``, ``euclidean`` or ``squared_euclidean``."""
    from dmlkit.distances import DISTANCES

    return DISTANCES.create(name, **kwargs)


