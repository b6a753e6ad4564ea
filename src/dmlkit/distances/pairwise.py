"""Pairwise distances and similarities between two sets of embeddings.

Each class maps ``x [B, D]`` and ``y [R, D]`` to a ``[B, R]`` matrix. ``is_inverted`` is True
for similarities (larger means closer), as in pytorch-metric-learning.
"""

from __future__ import annotations

import torch
from torch.nn.functional import threshold

from dmlkit._registry import Registry
from dmlkit._validation import Options, validate_params
from dmlkit.distances._closed_form import EPS, MatrixContext
from dmlkit.distances.normalization import l2_normalize


class BaseDistance(torch.nn.Module):
    """Interface: ``forward(x, y=None) -> [B, R]``; ``y`` defaults to ``x``.

    ``matrix(x, refs)`` is the same matrix by the fastest route this measure knows (losses call
    it). A measure with a closed-form gradient (``has_closed_form``) also computes the matrix
    without autograd (:meth:`matrix_forward`) and maps ``d(loss)/d(matrix)`` to the embeddings
    (:meth:`matrix_backward`): the pair losses that know ``d(loss)/d(matrix)`` then need no
    autograd graph. Any other measure (a user subclass, a wrapped PML distance) keeps autograd
    through :meth:`pairwise`.
    """

    is_inverted: bool = False

    #: Whether :meth:`matrix_forward` computes a ``[rows, cols]`` block of the same-set matrix
    #: itself; otherwise the losses pass the selected rows and columns as two sets.
    supports_blocks: bool = False

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        return self.pairwise(x, x if y is None else y)

    @property
    def has_closed_form(self) -> bool:
        """Whether :meth:`matrix_forward` / :meth:`matrix_backward` (and the fast :meth:`matrix`) apply.

        Only on the class that defines ``matrix_backward``: a subclass may redefine the measure,
        so it keeps autograd until it writes its own.
        """
        cls = type(self)
        return cls is not BaseDistance and "matrix_backward" in vars(cls)

    @property
    def is_nonnegative(self) -> bool:
        """Whether every value is known to be ``>= 0`` (a hinge at 0 is then the value itself)."""
        return False

    def matrix(self, x: torch.Tensor, refs: torch.Tensor) -> torch.Tensor:
        """``[B, R]`` between ``x [B, D]`` and ``refs [R, D]``, equal to ``self(x, refs)``."""
        return self(x, refs)

    def matrix_forward(
        self,
        x: torch.Tensor,
        refs: torch.Tensor,
        same_set: bool = False,
        rows: torch.Tensor | None = None,
        cols: torch.Tensor | None = None,
    ) -> MatrixContext:
        """The matrix between detached ``x [B, D]`` and ``refs [R, D]`` without autograd, as ``ctx.mat``.

        ``same_set`` means ``refs is x``; ``rows`` and ``cols`` (with ``supports_blocks``) ask
        for the ``[rows, cols]`` block of the same-set matrix. The context keeps what
        :meth:`matrix_backward` reads. Values equal :meth:`matrix`'s up to rounding. Call it under
        ``torch.no_grad()``, and only when ``has_closed_form``.
        """
        raise NotImplementedError(f"{type(self).__name__} has no closed-form gradient; use autograd")

    def matrix_backward(
        self, ctx: MatrixContext, grad: torch.Tensor, need_x: bool = True, need_refs: bool = True
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """``(dx, drefs)``: the gradients of ``sum(grad * ctx.mat)`` w.r.t. ``x`` and ``refs``.

        ``grad [B, R]`` is ``d(loss)/d(matrix)``; ``drefs`` is None for the same set (``dx``
        then sums both roles) and may be None when ``need_refs`` is False (``dx`` likewise).
        """
        raise NotImplementedError(f"{type(self).__name__} has no closed-form gradient; use autograd")

    def pairwise(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    def margin(self, closer: torch.Tensor, farther: torch.Tensor) -> torch.Tensor:
        """How much ``farther`` exceeds ``closer`` in this measure's direction (distance of neg - pos)."""
        return closer - farther if self.is_inverted else farther - closer


class CosineSimilarity(BaseDistance):
    """Cosine similarity ``<x/|x|, y/|y|>``; computes the normalisation itself."""

    is_inverted = True
    supports_blocks = True

    def pairwise(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return l2_normalize(x) @ l2_normalize(y).T

    def matrix(self, x: torch.Tensor, refs: torch.Tensor) -> torch.Tensor:
        if not self.has_closed_form:
            return self(x, refs)
        return normalised_product(x, refs)[0]

    def matrix_forward(self, x, refs, same_set=False, rows=None, cols=None) -> MatrixContext:
        """``x_n r_n^T`` as the product ``x_n r^T`` scaled by ``1 / |r|`` (no normalised copy of ``refs``)."""
        ctx = MatrixContext(x, refs, same_set, rows, cols)
        product = ctx.normalised_product()
        ctx.mat = product if same_set else product.mul_(ctx.r_scale)
        return ctx

    def matrix_backward(self, ctx, grad, need_x=True, need_refs=True):
        """``s = x_n r_n^T`` with ``x_n = x / max(|x|, eps)``: ``dx_n = G r_n``, then
        ``dx = (dx_n - x_n <dx_n, x_n>) / |x|`` (``dx_n / eps`` below ``eps``); ``dr`` likewise."""
        return ctx.normalised_backward(grad, need_x, need_refs, self._grad_of_cosine)

    @staticmethod
    def _grad_of_cosine(grad: torch.Tensor, scale: torch.Tensor | None, mat: torch.Tensor) -> torch.Tensor:
        """``d(loss)/d(cos)`` (times ``scale``): the matrix is the cosine."""
        return grad if scale is None else grad * scale


class DotProductSimilarity(BaseDistance):
    """Plain inner product ``<x, y>`` (no normalisation)."""

    is_inverted = True
    supports_blocks = True

    def pairwise(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x @ y.T

    def matrix_forward(self, x, refs, same_set=False, rows=None, cols=None) -> MatrixContext:
        """``x r^T``, one product."""
        ctx = MatrixContext(x, refs, same_set, rows, cols)
        ctx.mat = ctx.product(x)
        return ctx

    def matrix_backward(self, ctx, grad, need_x=True, need_refs=True):
        """``s = x r^T``: ``dx = G r``, ``dr = G^T x`` (same set: ``dx = (G + G^T) x``)."""
        return ctx.product_backward(grad, need_x, need_refs)


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
    def is_nonnegative(self) -> bool:
        return self.has_closed_form  # a subclass may redefine the measure

    def matrix(self, x: torch.Tensor, refs: torch.Tensor) -> torch.Tensor:
        """Between normalised rows: ``|x_n|^2 + |r_n|^2 - 2 cos`` from the scaled product (no normalised copy of ``refs``)."""
        if not (self.normalize_embeddings and self.has_closed_form):
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

    def matrix_forward(self, x, refs, same_set=False, rows=None, cols=None) -> MatrixContext:
        """``d^2 = |x|^2 + |r|^2 - 2 x r^T`` (one product; between normalised rows from the scaled
        cosine product, the squared norms being 1, or 0 for a zero or overflowing row)."""
        ctx = MatrixContext(x, refs, same_set)
        if self.normalize_embeddings:
            product = ctx.normalised_product()
            x_sq = (ctx.x_norm * ctx.x_scale).nan_to_num_(0.0).square_()
            r_sq = x_sq.T if same_set else (ctx.r_norm * ctx.r_scale).nan_to_num_(0.0).square_()
            if same_set:
                raw = torch.add(x_sq, product, alpha=-2.0)
            else:
                raw = torch.addcmul(x_sq, product, ctx.r_scale, value=-2.0)
            ctx.mat = self._root(raw.add_(r_sq))
            return ctx
        xx = (x * x).sum(1, keepdim=True)
        rr = xx.T if same_set else (refs * refs).sum(1)
        raw = ctx.product(x).mul_(-2.0).add_(xx).add_(rr)
        ctx.nonneg = raw >= 0
        ctx.mat = self._root(raw.clamp_min_(0.0))
        return ctx

    def matrix_backward(self, ctx, grad, need_x=True, need_refs=True):
        """Between normalised rows, ``d(d)/d(cos) = -1/d`` (squared: ``-2``), then as the cosine.

        Otherwise ``G' = G / (2d)`` (squared: ``G``), zero at coincident points as in the
        forward, and ``d|x - r|^2 = 2 (x - r)``: ``dx = 2 (x rowsum(G') - G' r)``,
        ``dr = 2 (r colsum(G') - G'^T x)``.
        """
        if self.normalize_embeddings:
            return ctx.normalised_backward(grad, need_x, need_refs, self._grad_of_cosine)
        x, r = ctx.x, ctx.refs
        g = self._through_root(grad, 1.0, ctx.mat) * ctx.nonneg
        gx, gr = ctx.product_backward(g, need_x, need_refs)
        if ctx.same_set:
            gx = (x * (g.sum(1, keepdim=True) + g.sum(0).unsqueeze(1))).sub_(gx).mul_(2.0)
            return gx, None
        if gx is not None:
            gx = (x * g.sum(1, keepdim=True)).sub_(gx).mul_(2.0)
        if gr is not None:
            gr = (r * g.sum(0).unsqueeze(1)).sub_(gr).mul_(2.0)
        return gx, gr

    def _root(self, sq: torch.Tensor) -> torch.Tensor:
        """The root for ``power=1``, exact zeros below ``EPS`` (always so between normalised rows)."""
        if self.power == 2 and not self.normalize_embeddings:
            return sq
        sq = threshold(sq, EPS, 0.0, inplace=True)
        return sq if self.power == 2 else sq.sqrt_()

    def _through_root(self, grad: torch.Tensor, factor: float | torch.Tensor, mat: torch.Tensor) -> torch.Tensor:
        """``factor`` d(loss)/d(squared distance) from ``grad`` = d(loss)/d(mat); zero at coincident points."""
        if self.power == 2:
            if not self.normalize_embeddings:
                return grad
            return grad * (mat > 0) * factor
        # G / (2 d): d = 0 gives inf or nan, mapped to 0 (the forward's zero subgradient).
        return torch.div(grad, mat).nan_to_num_(0.0, 0.0, 0.0).mul_(factor * 0.5)

    def _grad_of_cosine(self, grad: torch.Tensor, scale: torch.Tensor | None, mat: torch.Tensor) -> torch.Tensor:
        """``d(loss)/d(cos)`` (times ``scale``) between normalised rows: ``d(d^2)/d(cos) = -2``."""
        return self._through_root(grad, -2.0 if scale is None else scale * -2.0, mat)


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


DISTANCES: Registry[BaseDistance] = Registry("distance")
DISTANCES.register("cosine")(CosineSimilarity)
DISTANCES.register("dot")(DotProductSimilarity)
DISTANCES.register("euclidean")(lambda **kw: LpDistance(power=1, **kw))
DISTANCES.register("squared_euclidean")(lambda **kw: LpDistance(power=2, **kw))


def create_distance(name: str, **kwargs) -> BaseDistance:
    """Build a distance by name: ``cosine``, ``dot``, ``euclidean`` or ``squared_euclidean``."""
    return DISTANCES.create(name, **kwargs)


