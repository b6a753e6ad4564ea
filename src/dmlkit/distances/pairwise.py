"""Pairwise distances and similarities between two sets of embeddings.

Each class maps ``x [B, D]`` and ``y [R, D]`` to a ``[B, R]`` matrix. ``is_inverted`` is True
for similarities (larger means closer), as in pytorch-metric-learning. As in PML, a distance is
built with ``normalize_embeddings``, ``p``, ``power`` (and ``is_inverted``, ``collect_stats``),
and a subclass may define PML's hooks: ``compute_mat(query, ref)`` on the (maybe normalised)
embeddings, ``pairwise_distance(query, ref)`` row by row, and ``check_shapes(query, ref)``,
which the losses call before anything else (a custom distance may take other than 2-D input).
"""

from __future__ import annotations

import torch
from torch.nn.functional import threshold

from dmlkit.core.devices import to_device
from dmlkit.core.records import init_stats
from dmlkit.core.registry import Registry
from dmlkit.core.validation import BOOL, Interval, validate_params
from dmlkit.distances._closed_form import EPS, MatrixContext
from dmlkit.distances.normalization import l2_normalize
from dmlkit.exceptions import DataError


def _require(distance: BaseDistance, holds: bool, key: str, expected: str) -> None:
    if not holds:
        from dmlkit.exceptions import InvalidParameterError

        raise InvalidParameterError(
            f"The '{key}' parameter of {type(distance).__name__} must be {expected}. Got {getattr(distance, key)!r} instead."
        )


_STATS = ("initial_avg_query_norm", "initial_avg_ref_norm", "final_avg_query_norm", "final_avg_ref_norm")


class BaseDistance(torch.nn.Module):
    """Interface: ``forward(x, y=None) -> [B, R]``; ``y`` defaults to ``x``.

    ``forward`` checks the shapes (:meth:`check_shapes`), records the statistics (with
    ``collect_stats``: ``initial_avg_query_norm``, ``initial_avg_ref_norm``,
    ``final_avg_query_norm``, ``final_avg_ref_norm``, the mean norms before and after the
    normalisation) and computes :meth:`pairwise`, which by default is PML's recipe: the
    embeddings normalised (``normalize_embeddings``, ``p``-norm), :meth:`compute_mat`, then the
    ``power``. dmlkit's own measures override :meth:`pairwise`.

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

    def __init__(
        self,
        normalize_embeddings: bool = True,
        p: float = 2,
        power: float = 1,
        is_inverted: bool | None = None,
        collect_stats: bool | None = None,
    ):
        super().__init__()
        owner = type(self).__name__
        validate_params(
            owner,
            {"normalize_embeddings": normalize_embeddings, "p": p, "power": power},
            {
                "normalize_embeddings": [BOOL],
                "p": [Interval(float, 0, None, closed="neither")],
                "power": [Interval(float, 0, None, closed="neither")],
            },
        )
        self.normalize_embeddings = bool(normalize_embeddings)
        self.p = p
        self.power = power
        if is_inverted is not None:
            self.is_inverted = bool(is_inverted)
        init_stats(self, collect_stats, _STATS)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        self.check_shapes(x, y)
        ref = x if y is None else to_device(y, x.device)  # PML's set_ref_emb keeps it; any device is taken here
        if getattr(self, "collect_stats", False):
            self.record_stats(x, ref)
        return self.pairwise(x, ref)

    # -- PML's hooks ----------------------------------------------------------------------------
    def check_shapes(self, query_emb: torch.Tensor, ref_emb: torch.Tensor | None) -> None:
        """Embeddings must be 2-D ``[B, D]`` (a ``ValueError``); a subclass may accept others."""
        for name, t in (("embeddings", query_emb), ("ref_emb", ref_emb)):
            if t is not None and t.dim() != 2:
                raise DataError(f"{name} must be 2-D [B, D] (batch_size, embedding_size). Got shape {tuple(t.shape)}.")

    def compute_mat(self, query_emb: torch.Tensor, ref_emb: torch.Tensor) -> torch.Tensor:  # pragma: no cover
        """``[B, R]`` between the (maybe normalised) embeddings, before the ``power`` (PML's hook)."""
        raise NotImplementedError

    def pairwise_distance(self, query_emb: torch.Tensor, ref_emb: torch.Tensor) -> torch.Tensor:  # pragma: no cover
        """``[N]`` between row ``i`` of each set (PML's hook)."""
        raise NotImplementedError

    def pairwise(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The ``[B, R]`` matrix: maybe-normalise, :meth:`compute_mat`, then the ``power``."""
        query = self.maybe_normalize(x)
        ref = query if y is x else self.maybe_normalize(y)
        mat = self.compute_mat(query, ref)
        power = getattr(self, "power", 1)
        return mat if power == 1 else mat**power

    def normalize(self, embeddings: torch.Tensor, dim: int = 1, **kwargs) -> torch.Tensor:
        """``x / max(|x|_p, eps)`` (``l2_normalize`` for ``p = 2``)."""
        p = getattr(self, "p", 2)
        if p == 2 and dim in (1, -1) and embeddings.dim() == 2 and not kwargs:
            return l2_normalize(embeddings)
        return torch.nn.functional.normalize(embeddings, p=p, dim=dim, **kwargs)

    def maybe_normalize(self, embeddings: torch.Tensor, dim: int = 1, **kwargs) -> torch.Tensor:
        return self.normalize(embeddings, dim=dim, **kwargs) if getattr(self, "normalize_embeddings", False) else embeddings

    def get_norm(self, embeddings: torch.Tensor, dim: int = 1, **kwargs) -> torch.Tensor:
        return torch.linalg.vector_norm(embeddings, ord=getattr(self, "p", 2), dim=dim, **kwargs)

    def smallest_dist(self, *args, **kwargs):
        """``min`` for a distance, ``max`` for a similarity (as ``torch.min``/``torch.max``)."""
        return torch.max(*args, **kwargs) if self.is_inverted else torch.min(*args, **kwargs)

    def largest_dist(self, *args, **kwargs):
        return torch.min(*args, **kwargs) if self.is_inverted else torch.max(*args, **kwargs)

    def record_stats(self, x: torch.Tensor, ref: torch.Tensor) -> None:
        """The mean norms of both sets before and after the normalisation."""
        with torch.no_grad():
            values = (x, ref, self.maybe_normalize(x), self.maybe_normalize(ref))
            for name, t in zip(_STATS, values):
                setattr(self, name, self.get_norm(t).mean().item())

    # -- dmlkit's fast routes -------------------------------------------------------------------
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

    def margin(self, x: torch.Tensor | float, y: torch.Tensor | float) -> torch.Tensor:
        """How much farther ``x`` is than ``y`` in this measure's direction (PML's ``margin``):
        ``x - y`` for a distance, ``y - x`` for a similarity. ``margin(d_an, d_ap)`` is how far the
        negative lies beyond the positive."""
        return y - x if self.is_inverted else x - y


def _own_recipe(distance: BaseDistance, cls: type) -> bool:
    """Whether ``distance`` keeps ``cls``'s own matrix (a subclass overriding PML's ``compute_mat``
    gets PML's recipe through it instead)."""
    return getattr(type(distance), "compute_mat") is getattr(cls, "compute_mat")


class CosineSimilarity(BaseDistance):
    """Cosine similarity ``<x/|x|, y/|y|>`` (PML's ``CosineSimilarity``: ``normalize_embeddings`` is always True)."""

    is_inverted = True
    supports_blocks = True

    def __init__(self, **kwargs):
        super().__init__(normalize_embeddings=True, **kwargs)
        _require(self, self.is_inverted, "is_inverted", "True")

    @property
    def has_closed_form(self) -> bool:
        return BaseDistance.has_closed_form.fget(self) and self.p == 2 and self.power == 1

    def compute_mat(self, query_emb: torch.Tensor, ref_emb: torch.Tensor) -> torch.Tensor:
        return query_emb @ ref_emb.T

    def pairwise_distance(self, query_emb: torch.Tensor, ref_emb: torch.Tensor) -> torch.Tensor:
        return (query_emb * ref_emb).sum(1)

    def pairwise(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if not (self.p == 2 and self.power == 1 and _own_recipe(self, CosineSimilarity)):
            return super().pairwise(x, y)
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
    """Inner product ``<x, y>``, between normalised embeddings unless ``normalize_embeddings=False``
    (PML's ``DotProductSimilarity``; its default, True, makes it the cosine)."""

    is_inverted = True
    supports_blocks = True

    def __init__(self, **kwargs):
        super().__init__(is_inverted=True, **kwargs)

    @property
    def has_closed_form(self) -> bool:
        plain = not self.normalize_embeddings and self.power == 1
        return BaseDistance.has_closed_form.fget(self) and plain

    def compute_mat(self, query_emb: torch.Tensor, ref_emb: torch.Tensor) -> torch.Tensor:
        return query_emb @ ref_emb.T

    def pairwise_distance(self, query_emb: torch.Tensor, ref_emb: torch.Tensor) -> torch.Tensor:
        return (query_emb * ref_emb).sum(1)

    def matrix_forward(self, x, refs, same_set=False, rows=None, cols=None) -> MatrixContext:
        """``x r^T``, one product."""
        ctx = MatrixContext(x, refs, same_set, rows, cols)
        ctx.mat = ctx.product(x)
        return ctx

    def matrix_backward(self, ctx, grad, need_x=True, need_refs=True):
        """``s = x r^T``: ``dx = G r``, ``dr = G^T x`` (same set: ``dx = (G + G^T) x``)."""
        return ctx.product_backward(grad, need_x, need_refs)


class LpDistance(BaseDistance):
    """``||x - y||_p ** power`` between the embeddings, L_p-normalised by default (PML's ``LpDistance``).

    Any ``p > 0`` (``float("inf")`` included) and ``power > 0``. The Euclidean distance
    (``p=2``) and its square (``power=2``) are computed as ``|x|^2 + |y|^2 - 2<x, y>`` (one
    matrix product, with a closed-form gradient); the square root has a zero subgradient at
    coincident points instead of NaN. Other settings use ``torch.cdist`` and autograd.
    """

    def __init__(
        self,
        p: float = 2,
        power: float = 1,
        normalize_embeddings: bool = True,
        is_inverted: bool = False,
        collect_stats: bool | None = None,
    ):
        super().__init__(normalize_embeddings, p, power, is_inverted, collect_stats)
        _require(self, not self.is_inverted, "is_inverted", "False")

    @property
    def has_closed_form(self) -> bool:
        euclidean = self.p == 2 and self.power in (1, 2)
        return BaseDistance.has_closed_form.fget(self) and euclidean

    def compute_mat(self, query_emb: torch.Tensor, ref_emb: torch.Tensor) -> torch.Tensor:
        if query_emb.dtype in (torch.float16, torch.bfloat16):  # cdist has no half kernel
            return torch.linalg.vector_norm(query_emb.unsqueeze(1) - ref_emb.unsqueeze(0), ord=self.p, dim=2)
        return torch.cdist(query_emb, ref_emb, p=self.p)

    def pairwise_distance(self, query_emb: torch.Tensor, ref_emb: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.pairwise_distance(query_emb, ref_emb, p=self.p)

    def pairwise(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if not (self.p == 2 and self.power in (1, 2) and _own_recipe(self, LpDistance)):
            return super().pairwise(x, y)
        if x.dtype in (torch.float16, torch.bfloat16):
            # |x|^2 + |y|^2 - 2<x, y> cancels in half precision (0.044 between a float16 row and itself): float32,
            # rounded once to the input's dtype, within a unit in the last place of PML's row-by-row differences
            return self.pairwise(x.float(), y.float()).to(x.dtype)
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

    This is how a pytorch-metric-learning distance dmlkit does not convert (a user's own PML
    ``BaseDistance`` subclass, for example) plugs into dmlkit's losses; its own ``check_shapes``
    is honoured.
    """

    def __init__(self, distance: object):
        super().__init__(normalize_embeddings=bool(getattr(distance, "normalize_embeddings", False)))
        self.wrapped = distance
        self.is_inverted = bool(getattr(distance, "is_inverted", False))

    def check_shapes(self, query_emb: torch.Tensor, ref_emb: torch.Tensor | None) -> None:
        own = getattr(self.wrapped, "check_shapes", None)
        if own is None:
            return super().check_shapes(query_emb, ref_emb)
        own(query_emb, ref_emb)

    def pairwise(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.wrapped(x, y)

    def extra_repr(self) -> str:
        return f"wrapped={self.wrapped!r}"


DISTANCES: Registry[BaseDistance] = Registry("distance")
DISTANCES.register("cosine")(CosineSimilarity)
# The registry names keep their meaning: "dot" and the Euclidean names are between raw embeddings
# unless normalize_embeddings=True is given.
DISTANCES.register("dot")(lambda **kw: DotProductSimilarity(**{"normalize_embeddings": False, **kw}))
DISTANCES.register("euclidean")(lambda **kw: LpDistance(**{"power": 1, "normalize_embeddings": False, **kw}))
DISTANCES.register("squared_euclidean")(lambda **kw: LpDistance(**{"power": 2, "normalize_embeddings": False, **kw}))


def create_distance(name: str, **kwargs) -> BaseDistance:
    """Build a distance by name: ``cosine``, ``dot``, ``euclidean`` or ``squared_euclidean``."""
    return DISTANCES.create(name, **kwargs)


