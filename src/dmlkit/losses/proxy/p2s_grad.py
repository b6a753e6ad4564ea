"""P2SGrad (Zhang et al., "P2SGrad: Refined Gradients for Optimizing Deep Face Models", CVPR 2019)."""

from __future__ import annotations

import torch

from dmlkit.core.validation import BOOL
from dmlkit.distances import BaseDistance, CosineSimilarity
from dmlkit.exceptions import InvalidParameterError
from dmlkit.losses.base import LOSSES
from dmlkit.losses.proxy._classification import ClassificationLoss
from dmlkit.losses.proxy._math import unit_vectors


@LOSSES.register("p2sgrad")
class P2SGradLoss(ClassificationLoss):
    """Squared error between cosines and one-hot targets, whose gradient is P2SGrad Eq. (11).

    PML's form (default): class weights kept at unit norm by a projection before every call
    (``W``'s columns renormalised in place), ``cos_ij = <x_i / |x_i|, W_j>`` clamped to [-1, 1], and
    ``loss = mean_{i,j} (cos_ij - [j = y_i])^2`` (``nn.MSELoss`` over the ``[B, C]`` matrix): its
    gradient for ``x`` is Eq. (11)'s direction, for ``W_j`` it is ``x_i / |x_i|`` without the
    tangent projection, and both carry ``2 / (B C)``. ``paper_gradient=True`` is Eq. (11) itself:
    ``cos`` through normalised weights in the graph and ``loss = mean_i 1/2 sum_j (cos_ij - [j = y_i])^2``,
    whose gradient is ``sum_j (cos_ij - [j = y_i]) grad cos_ij`` per sample.

    PML's constructor ``P2SGradLoss(descriptors_dim, num_classes)``; ``embedding_size=`` is accepted
    for ``descriptors_dim`` (configs pass it). The weights are ``loss.weight [D, C]`` (PML's name).
    """

    _repr_keys = ("descriptors_dim", "num_classes", "paper_gradient")
    _parameter_constraints = {"paper_gradient": [BOOL]}

    def __init__(
        self,
        descriptors_dim: int | None = None,
        num_classes: int | None = None,
        paper_gradient: bool = False,
        seed: int = 0,
        *,
        embedding_size: int | None = None,
        reducer: object | None = None,
        embedding_regularizer: object | None = None,
        embedding_reg_weight: float = 1.0,
        weight_regularizer: object | None = None,
        weight_reg_weight: float = 1.0,
    ):
        if (descriptors_dim is None) == (embedding_size is None) or num_classes is None:
            raise InvalidParameterError(
                "P2SGradLoss needs num_classes and one of descriptors_dim (PML's name) or embedding_size. "
                f"Got descriptors_dim={descriptors_dim!r}, embedding_size={embedding_size!r}, "
                f"num_classes={num_classes!r}."
            )
        size = descriptors_dim if embedding_size is None else embedding_size
        super().__init__(num_classes, size, 1, "uniform", seed, reducer=reducer,
                         embedding_regularizer=embedding_regularizer, embedding_reg_weight=embedding_reg_weight,
                         weight_regularizer=weight_regularizer, weight_reg_weight=weight_reg_weight)
        self.paper_gradient = paper_gradient
        with torch.no_grad():  # the paper's code: uniform in [-1, 1], then unit columns
            self.W.uniform_(-1.0, 1.0, generator=torch.Generator().manual_seed(self.bank.seed))
            self.project_weights_()

    @property
    def descriptors_dim(self) -> int:
        return self.embedding_size

    @property
    def weight(self) -> torch.nn.Parameter:
        """PML's name for the class weights ``[descriptors_dim, num_classes]`` (the parameter itself)."""
        return self.W

    def __setattr__(self, name: str, value: object) -> None:
        super().__setattr__("W" if name == "weight" and "bank" in self.__dict__.get("_modules", {}) else name, value)

    def default_distance(self) -> BaseDistance:
        return CosineSimilarity()

    @torch.no_grad()
    def project_weights_(self) -> None:
        """Scale each column of ``W`` to unit norm in place (PML's ``renorm(2, 1, 1e-5) * 1e5``)."""
        self.W.copy_(self.W.renorm(2, 1, 1e-5).mul_(1e5))

    def forward(self, embeddings, labels=None, indices_tuple=None, ref_emb=None, ref_labels=None):
        if indices_tuple is not None:
            raise InvalidParameterError("P2SGradLoss takes no indices_tuple (as PML's): every sample counts once.")
        return super().forward(embeddings, labels, None, ref_emb, ref_labels)

    def per_sample_loss(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if not self.paper_gradient:
            self.project_weights_()
        weights = self.weights_as(embeddings)
        embeddings = embeddings.to(weights.dtype)
        if self.paper_gradient:
            cos = self.distance(embeddings, weights)
        else:
            unit = unit_vectors(embeddings, 1)
            cos = (unit @ weights.T).clamp_(-1.0, 1.0)
        # sum_j (cos_ij - [j = y_i])^2 = sum_j cos_ij^2 - 2 cos_iy + 1 (no one-hot matrix)
        squared = cos.square().sum(dim=1) - 2.0 * cos.gather(1, labels[:, None])[:, 0] + 1.0
        return squared / 2 if self.paper_gradient else squared / self.num_classes
