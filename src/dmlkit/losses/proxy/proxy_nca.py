"""Proxy-NCA (Movshovitz-Attias et al., ICCV 2017) and ProxyNCA++ (Teh et al., ECCV 2020)."""

from __future__ import annotations

from functools import partial

import torch

from dmlkit.core.validation import BOOL, Interval, Options
from dmlkit.distances import BaseDistance, LpDistance, l2_normalize
from dmlkit.losses.base import LOSSES, zero_loss
from dmlkit.losses.logsumexp import exp_sum_
from dmlkit.losses.proxy._base import ProxyLoss
from dmlkit.losses.proxy._math import common_dtype, normalize_rows
from dmlkit.proxies import dynamic_triplets


def proxy_nca_kernel(
    z: torch.Tensor,
    need_grad: bool,
    candidates: torch.Tensor,
    assignment: str,
    exclude_positive: bool,
    bound: float,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Mean over samples of ``LSE_{denominator} z - LSE_{positives} z`` and its gradient (Eq. (4) with proxies).

    Proxy-NCA Eq. (4) with ``Z`` the negative proxies (``exclude_positive=True``), or the
    softmax over positives and negatives (``False``, PML/ProxyNCA++). ``z [P, B]`` are the
    logits of every proxy for every sample (``|z| <= bound``), overwritten; ``candidates [B, Kc]``
    the rows of each sample's class proxies. With ``E_pi = exp(z_pi - m_i)`` over the denominator
    (0 elsewhere; shift ``m_i = 0`` when ``exp`` cannot overflow, else the sample's max),
    ``S_i = sum_p E_pi`` and ``w_pi`` the softmax of the sample's positive logits,
    ``dl/dz_pi = (E_pi - S_i w_pi) / (B S_i)``: returned as ``G = E - S w`` (in place) and the
    per-sample factor ``1 / (B S_i)``.
    """
    candidates = candidates.T  # [Kc, B]
    if assignment == "nearest" and candidates.shape[0] > 1:
        nearest = z.gather(0, candidates).argmax(dim=0, keepdim=True)
        positive_rows = candidates.gather(0, nearest)
        excluded = candidates
    else:
        positive_rows = candidates
        excluded = candidates if exclude_positive else None
    positive = z.gather(0, positive_rows)
    if excluded is not None:
        z.scatter_(0, excluded, float("-inf"))
        if not exclude_positive:  # "nearest": the other class proxies are out, the positive is in
            z.scatter_(0, positive_rows, positive)
    exps, sums, denominator = exp_sum_(z, 0, bound)
    loss = (denominator - torch.logsumexp(positive, dim=0)).mean()
    if not need_grad:
        return loss, None, None
    weights = torch.softmax(positive, dim=0).mul_(sums).neg_()
    return loss, exps.scatter_add_(0, positive_rows, weights), sums.mul(z.shape[1]).reciprocal_()


@LOSSES.register("proxy_nca")
class ProxyNCALoss(ProxyLoss):
    """NCA between each sample and the proxies: Proxy-NCA Eq. (4) with proxies (Alg. 1).

    ``loss_i = -log( exp(-s d(x_i, p(y_i))) / sum_{p in Z} exp(-s d(x_i, p)) )``, mean over the
    batch, with ``d`` the squared Euclidean distance between L2-normalised embeddings and
    proxies (Sec. 3.3/4: both on the unit sphere) and ``s = softmax_scale``.

    * ``exclude_positive=False`` (default, PML's ProxyNCALoss): ``Z`` is all proxies, i.e. a
      softmax cross-entropy; ``True`` is the paper's Eq. (4), ``Z`` = negative proxies only
      (the loss can then go below 0).
    * ``assignment`` (Sec. 4.1): ``"static"`` = the class's proxy; with ``K > 1`` the class's
      ``K`` proxies enter the numerator as a log-sum-exp (soft nearest); ``"nearest"`` = the
      nearest proxy of the class (Eq. (5) within the class; the other class proxies are left
      out of the denominator); ``"dynamic"`` (Sec. 4.1, 6.6, 7): the supervision is the triplets
      ``(x, y, Z)`` of the batch (every ordered same-label pair ``(x, y)``, ``Z`` = the samples
      of other labels) and each triplet's loss is Eq. (4) on ``(x, p(y), p(Z))``, with ``p(.)``
      the proxy nearest to that sample (Eq. (5)) and ``p(Z)`` the set of the negatives' nearest
      proxies (plus ``p(y)`` when ``exclude_positive=False``); mean over triplets (see
      :func:`dmlkit.proxies.dynamic_triplets`). Proxies are not tied to classes; this path
      uses autograd and ignores ``matmul_precision``.
    * ``proxies_per_class`` may be a fraction ``f < 1`` (Sec. 6.5): ``ceil(C f)`` proxies and a
      seeded random pre-assignment of classes to them.
    * ``distance``: ``LpDistance(power=2, normalize_embeddings=True)`` (default, PML's) measures
      between L2-normalised embeddings and proxies; ``LpDistance(power=2, normalize_embeddings=False)``
      (config: ``{name: squared_euclidean, args: {normalize_embeddings: false}}``) is the paper's
      Eq. (4) on raw embeddings and proxies (its appendix: their norms grow "much larger than 1"),
      computed with autograd (``matmul_precision`` does not apply).
    """

    _repr_keys = (
        "num_classes", "embedding_size", "proxies_per_class", "softmax_scale", "assignment", "exclude_positive",
        "matmul_precision",
    )

    _parameter_constraints = {
        "softmax_scale": [Interval(float, 0, None, closed="neither")],
        "assignment": [Options(("static", "nearest", "dynamic"))],
        "exclude_positive": [BOOL],
    }

    def __init__(
        self,
        num_classes: int,
        embedding_size: int,
        softmax_scale: float = 1,
        proxies_per_class: float = 1,
        assignment: str = "static",
        exclude_positive: bool = False,
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
        super().__init__(num_classes, embedding_size, proxies_per_class, proxy_init, seed, matmul_precision,
            distance=distance, reducer=reducer, embedding_regularizer=embedding_regularizer,
            embedding_reg_weight=embedding_reg_weight, weight_regularizer=weight_regularizer,
            weight_reg_weight=weight_reg_weight,
        )
        self.softmax_scale = float(softmax_scale)
        self.assignment = assignment
        self.exclude_positive = exclude_positive

    def default_distance(self) -> BaseDistance:
        return LpDistance(power=2, normalize_embeddings=True)

    def accepted_distances(self) -> tuple[BaseDistance, ...]:
        """Squared Euclidean distance between normalised (default) or raw embeddings and proxies."""
        return (self.default_distance(), LpDistance(power=2, normalize_embeddings=False))

    @property
    def normalizes(self) -> bool:
        """Whether embeddings and proxies are L2-normalised before the distance (False: Eq. (4) on raw vectors)."""
        return bool(self.distance.normalize_embeddings)

    def get_logits(self, embeddings: torch.Tensor) -> torch.Tensor:
        """``[B, num_proxies]`` squared distances ``||x - p||^2`` (normalised unless the distance says raw).

        Computed as PML's ``LpDistance`` computes it, ``torch.cdist(x, p) ** 2`` on
        ``F.normalize``-d rows, so that the values (small distances included, where a float32 result
        carries an absolute rounding error of about ``1e-7``) are PML's own, bit for bit.
        """
        dtype = torch.promote_types(embeddings.dtype, self.proxies.dtype)
        x, p = embeddings.to(dtype), self.proxies.to(dtype)
        if self.normalizes:
            x, p = torch.nn.functional.normalize(x, dim=1), torch.nn.functional.normalize(p, dim=1)
        return torch.cdist(x, p) ** 2

    def compute_loss(self, embeddings: torch.Tensor, labels: torch.Tensor, **kwargs) -> torch.Tensor:
        self.reject_kwargs(kwargs)
        embeddings, proxies = common_dtype(embeddings, self.proxies)
        candidates = self.bank.candidate_columns(labels)
        if self.assignment == "dynamic":
            return self.dynamic_loss(embeddings, proxies, labels)
        if self.exclude_positive and self.bank.num_proxies == candidates.shape[1]:
            return zero_loss(embeddings, proxies)  # no negative proxy at all: Eq. (4) is undefined
        if not self.normalizes:
            return self.raw_loss(self.logits(embeddings, proxies), candidates)
        # -s ||x - p||^2 = 2 s <x, p> - 2 s on the unit sphere; the constant cancels in the ratio
        scale = 2.0 * self.softmax_scale
        kernel = partial(proxy_nca_kernel, candidates=candidates, assignment=self.assignment,
                         exclude_positive=self.exclude_positive, bound=scale)
        return self.fused(normalize_rows(embeddings), proxies, kernel, scale, labels)

    def logits(self, embeddings: torch.Tensor, proxies: torch.Tensor) -> torch.Tensor:
        """``[B, P]`` logits ``-s ||x - p||^2`` up to a per-row constant (differentiable).

        Normalised: ``2 s <x, p>`` (on the unit sphere ``-s ||x - p||^2 = 2 s <x, p> - 2 s``, and the
        constant cancels in Eq. (4)'s ratio). Raw: ``-s (|x|^2 + |p|^2 - 2 <x, p>)``, clamped at 0.
        """
        if self.normalizes:
            return (2.0 * self.softmax_scale) * (l2_normalize(embeddings) @ normalize_rows(proxies).T)
        squared = (embeddings.square().sum(1, keepdim=True) + proxies.square().sum(1)[None, :]
                   - 2.0 * embeddings @ proxies.T).clamp_min(0.0)
        return -self.softmax_scale * squared

    def raw_loss(self, logits: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """Eq. (4) (or its softmax form) from ``logits [B, P]`` with autograd; ``candidates [B, Kc]`` as in the kernel."""
        positive = logits.gather(1, candidates)  # [B, Kc]
        denominator = logits
        nearest = self.assignment == "nearest" and candidates.shape[1] > 1
        if nearest or self.exclude_positive:
            mask = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, candidates, True)
            if nearest:  # the class's other proxies leave the denominator; the nearest one is the positive
                kept = candidates.gather(1, positive.argmax(dim=1, keepdim=True))
                positive = logits.gather(1, kept)
                mask.scatter_(1, kept, self.exclude_positive)
            denominator = logits.masked_fill(mask, float("-inf"))
        return (denominator.logsumexp(dim=1) - positive.logsumexp(dim=1)).mean()

    def dynamic_loss(self, embeddings: torch.Tensor, proxies: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Eq. (4) on the proxy triplets ``(x_a, p(y), p(Z_a))`` of :func:`dynamic_triplets`, mean over triplets."""
        logits = self.logits(embeddings, proxies)  # [B, P]
        triplets = dynamic_triplets(logits, labels)
        if triplets.anchors.numel() == 0:
            return zero_loss(embeddings, proxies)  # no (anchor, positive, negatives) triplet in the batch
        negatives = triplets.negative_proxies
        # rows without negatives form no triplet; zeros keep their (unused) log-sum-exp finite
        masked = logits.masked_fill(~negatives, float("-inf")).masked_fill(~negatives.any(1, keepdim=True), 0.0)
        anchors, positive_rows = triplets.anchors, triplets.positive_proxies
        positive = logits[anchors, positive_rows]  # [T]
        denominator = masked.logsumexp(dim=1)[anchors]  # log sum over p(Z_a)
        if not self.exclude_positive:  # the softmax form also counts p(y) once when p(Z_a) lacks it
            missing = ~negatives[anchors, positive_rows]
            denominator = torch.where(missing, torch.logaddexp(denominator, positive), denominator)
        return (denominator - positive).mean()


@LOSSES.register("proxy_nca_plus_plus")
class ProxyNCAPlusPlusLoss(ProxyNCALoss):
    """ProxyNCA++: Proxy-NCA with a low softmax temperature over all proxies (positive included).

    ``loss_i = -log softmax_p(-d(x_i, p) / T)[p(y_i)]`` with ``d`` the squared Euclidean distance
    between normalised embeddings and normalised proxies (proxy normalisation is built in).
    The paper's other ingredients are not part of the loss: fast-moving proxies are a much
    larger learning rate for ``loss.proxies`` in its own optimiser parameter group, and global
    max pooling / layer norm belong to the model.
    """

    _repr_keys = ("num_classes", "embedding_size", "proxies_per_class", "temperature", "assignment", "matmul_precision")

    _parameter_constraints = {"temperature": [Interval(float, 0, None, closed="neither")]}

    def __init__(
        self,
        num_classes: int,
        embedding_size: int,
        temperature: float = 1 / 9,
        proxies_per_class: float = 1,
        assignment: str = "static",
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
        super().__init__(
            num_classes, embedding_size, 1.0 / temperature, proxies_per_class, assignment, False, proxy_init, seed,
            matmul_precision,
            distance=distance, reducer=reducer, embedding_regularizer=embedding_regularizer,
            embedding_reg_weight=embedding_reg_weight, weight_regularizer=weight_regularizer,
            weight_reg_weight=weight_reg_weight,
        )
        self.temperature = float(temperature)

    def accepted_distances(self) -> tuple[BaseDistance, ...]:
        """ProxyNCA++ normalises embeddings and proxies: only the default measure."""
        return (self.default_distance(),)
