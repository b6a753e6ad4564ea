"""ArcFace (Deng et al., CVPR 2019) and sub-centre ArcFace (Deng et al., ECCV 2020)."""

from __future__ import annotations

import math

import torch

from dmlkit.core.validation import BOOL, Interval
from dmlkit.distances import BaseDistance, CosineSimilarity
from dmlkit.losses.base import LOSSES
from dmlkit.losses.proxy._classification import MarginSoftmaxLoss
from dmlkit.losses.proxy._margin_softmax import TargetMargin


@LOSSES.register("arcface")
class ArcFaceLoss(MarginSoftmaxLoss):
    """Additive angular margin softmax: ArcFace Eq. (3).

    ``l_i = -log( e^{s cos(theta_y + m)} / (e^{s cos(theta_y + m)} + sum_{j != y} e^{s cos theta_j}) )``,
    ``cos theta_j`` the cosine between the embedding and class weight ``W[:, j]``; mean over the batch.
    ``margin`` is in degrees as in PML (``loss.margin`` then holds radians, as PML's); ``scale`` is s.

    ``monotonic=True`` (default; PML and the official code): past ``theta > pi - m`` the target
    logit is ``cos theta - m sin m`` so it keeps falling with the angle; ``False`` is Eq. (3) as
    written. Computed ``chunk_size`` classes at a time with an online log-sum-exp;
    ``sample_rate < 1`` is partial FC (see :class:`MarginSoftmaxLoss`).
    """

    _repr_keys = ("num_classes", "embedding_size", "margin", "scale", "monotonic", "chunk_size", "sample_rate")
    _parameter_constraints = {"margin": [Interval(float)], "monotonic": [BOOL]}

    def __init__(
        self,
        num_classes: int,
        embedding_size: int,
        margin: float = 28.6,
        scale: float = 64,
        monotonic: bool = True,
        chunk_size: int = 1024,
        sample_rate: float = 1.0,
        proxy_init: str = "standard_normal",
        seed: int = 0,
        weight_init_func: object | None = None,
        *,
        sub_centers: int = 1,
        distance: object | None = None,
        reducer: object | None = None,
        embedding_regularizer: object | None = None,
        embedding_reg_weight: float = 1.0,
        weight_regularizer: object | None = None,
        weight_reg_weight: float = 1.0,
    ):
        super().__init__(num_classes, embedding_size, sub_centers, proxy_init, seed,
                         distance=distance, reducer=reducer, embedding_regularizer=embedding_regularizer,
                         embedding_reg_weight=embedding_reg_weight, weight_regularizer=weight_regularizer,
                         weight_reg_weight=weight_reg_weight)
        self.margin = math.radians(float(margin))
        self.monotonic = monotonic
        self._setup_margin_softmax(scale, chunk_size, sample_rate)
        self._init_weights(weight_init_func)

    def default_distance(self) -> BaseDistance:
        return CosineSimilarity()

    def target_margin(self) -> TargetMargin:
        return TargetMargin("additive_angular", self.margin, self.monotonic)


@LOSSES.register("subcenter_arcface")
class SubCenterArcFaceLoss(ArcFaceLoss):
    """ArcFace with ``K = sub_centers`` weights per class: Sub-center ArcFace Eq. (1)-(2).

    ``cos theta_j = max_k cos(x, W_jk)`` (the nearest of class j's sub-centres), then ArcFace's
    loss. The sub-centres are the bank's ``proxies_per_class``: class ``c`` owns ``W[:, c*K:(c+1)*K]``.
    :meth:`get_outliers` is the paper's Sec. 3.2 cleaning step (PML's method).
    """

    _repr_keys = ("num_classes", "embedding_size", "sub_centers", "margin", "scale", "chunk_size", "sample_rate")
    _parameter_constraints = {"sub_centers": [Interval(int, 1, None)]}

    def __init__(
        self,
        num_classes: int,
        embedding_size: int,
        margin: float = 28.6,
        scale: float = 64,
        sub_centers: int = 3,
        monotonic: bool = True,
        chunk_size: int = 1024,
        sample_rate: float = 1.0,
        proxy_init: str = "standard_normal",
        seed: int = 0,
        weight_init_func: object | None = None,
        *,
        distance: object | None = None,
        reducer: object | None = None,
        embedding_regularizer: object | None = None,
        embedding_reg_weight: float = 1.0,
        weight_regularizer: object | None = None,
        weight_reg_weight: float = 1.0,
    ):
        super().__init__(num_classes, embedding_size, margin, scale, monotonic, chunk_size, sample_rate, proxy_init,
                         seed, weight_init_func, sub_centers=sub_centers, distance=distance, reducer=reducer,
                         embedding_regularizer=embedding_regularizer, embedding_reg_weight=embedding_reg_weight,
                         weight_regularizer=weight_regularizer, weight_reg_weight=weight_reg_weight)

    @property
    def sub_centers(self) -> int:
        return int(self.bank.proxies_per_class)

    @torch.no_grad()
    def get_outliers(
        self, embeddings: torch.Tensor, labels: torch.Tensor, threshold: float = 75, return_dominant_centers: bool = True
    ):
        """Samples farther than ``threshold`` degrees from their class's dominant sub-centre (Sec. 3.2).

        The dominant sub-centre of a class is the one nearest to most of the class's samples in
        ``embeddings [B, D]``. Returns ``outliers [n]`` (row indices, by class then row, as PML) and,
        with ``return_dominant_centers``, ``dominant_centers [D, C]`` (zero for absent classes).
        """
        self.bank.check_labels(labels)
        labels = labels.to(embeddings.device)  # PML's contract: labels from anywhere
        self.follow_embeddings_(embeddings)  # and the sub-centres follow the embeddings (PML's cast_types here too)
        k, batch = self.sub_centers, labels.shape[0]
        weights = self.proxies.to(embeddings.dtype)
        own = weights.view(self.num_classes, k, -1)[labels]  # [B, K, D]: each sample's class sub-centres
        cos = torch.einsum("bd,bkd->bk", torch.nn.functional.normalize(embeddings, dim=1),
                           torch.nn.functional.normalize(own, dim=2))
        votes = torch.bincount(labels * k + cos.argmax(dim=1), minlength=self.num_classes * k)
        dominant = votes.view(self.num_classes, k).argmax(dim=1)  # [C] (first of tied counts)
        to_dominant = cos.gather(1, dominant[labels][:, None])[:, 0]
        outlier = to_dominant < math.cos(math.radians(threshold))
        rows = torch.arange(batch, device=labels.device)
        order = torch.argsort(labels[outlier] * batch + rows[outlier])
        outliers = rows[outlier][order]
        if not return_dominant_centers:
            return outliers
        present = torch.zeros(self.num_classes, dtype=torch.bool, device=labels.device)
        present[labels] = True
        class_rows = torch.arange(self.num_classes, device=dominant.device)
        centers = weights.view(self.num_classes, k, -1)[class_rows, dominant]  # [C, D]
        return outliers, (centers * present[:, None]).T
