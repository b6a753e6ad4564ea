"""Self-supervised losses: two augmented views of the same inputs, no class labels.

* :class:`SelfSupervisedLoss` (PML's wrapper): a metric loss applied to ``embeddings`` and
  ``ref_emb`` as two views, each row's own view its only positive (labels ``0..B-1``);
  ``symmetric=True`` ranks both views together (SimCLR's 2N-sample batch), ``symmetric=False``
  compares the first view with the second as references.
* :class:`VICRegLoss` (Bardes et al., 2022, Eqs. (1)-(6)): invariance, variance and covariance of
  the two views' embeddings.

Neither is registered for configs: a labelled training run has no second view of each image to
hand them (the trainer feeds ``loss(embeddings, labels)``), so they are library classes, exported
from :mod:`dmlkit.losses`.
"""

from __future__ import annotations

import torch
from torch import nn

from dmlkit.core.devices import as_input_dtype, autocast_off, to_device
from dmlkit.core.validation import InstanceOf, Interval, check_embeddings_labels
from dmlkit.exceptions import DataError, InvalidParameterError
from dmlkit.losses.base import MetricLoss, as_fp32
from dmlkit.losses.pair.base import PairLoss
from dmlkit.losses.reducers import get_reducer

REDUCTIONS = ("mean", "mean_nonzero", "sum", "threshold")

#: PML's list of the losses its wrapper accepts (by class name).
PML_SUPPORTED = [
    "AngularLoss", "CircleLoss", "ContrastiveLoss", "GeneralizedLiftedStructureLoss", "IntraPairVarianceLoss",
    "LiftedStructureLoss", "MultiSimilarityLoss", "NTXentLoss", "SignalToNoiseRatioContrastiveLoss",
    "SupConLoss", "TripletMarginLoss", "NCALoss", "TupletMarginLoss",
]


def _check_views(embeddings: torch.Tensor, ref_emb: torch.Tensor | None, owner: str) -> None:
    check_embeddings_labels(embeddings, None)
    if ref_emb is None:
        raise InvalidParameterError(f"{owner} needs ref_emb: the second view of the same inputs.")
    check_embeddings_labels(ref_emb, None, name="ref_emb")
    if ref_emb.shape != embeddings.shape:
        raise DataError(
            f"embeddings has shape {tuple(embeddings.shape)} but ref_emb has {tuple(ref_emb.shape)}; "
            "ref_emb must be a view of the same inputs, row for row."
        )


class SelfSupervisedLoss(nn.Module):
    """``loss(embeddings [B, D], ref_emb [B, D])``: ``self.loss`` with row ``i`` of each view as class ``i``.

    Accepts PML's supported losses (by class name) and any dmlkit pair loss that takes references.
    """

    def __init__(self, loss: nn.Module, symmetric: bool = True):
        super().__init__()
        self.check_loss_support(loss)
        if not isinstance(symmetric, bool):
            raise InvalidParameterError(
                f"The 'symmetric' parameter of SelfSupervisedLoss must be a bool. Got {symmetric!r} instead."
            )
        self.loss = loss
        self.symmetric = symmetric

    @staticmethod
    def supported_losses() -> list[str]:
        """PML's list of supported loss class names."""
        return list(PML_SUPPORTED)

    @classmethod
    def check_loss_support(cls, loss: object) -> None:
        """Refuse a loss that cannot take the two views as positives (``InvalidParameterError``)."""
        name = loss if isinstance(loss, str) else type(loss).__name__
        if name in PML_SUPPORTED or (isinstance(loss, PairLoss) and loss.supports_references):
            return
        raise InvalidParameterError(
            f"The 'loss' parameter of SelfSupervisedLoss must be one of {PML_SUPPORTED} or a dmlkit pair loss "
            f"that takes references. Got {name} instead."
        )

    def forward(self, embeddings: torch.Tensor, ref_emb: torch.Tensor) -> torch.Tensor:
        _check_views(embeddings, ref_emb, "SelfSupervisedLoss")
        ref_emb = to_device(ref_emb, embeddings.device)
        labels = torch.arange(embeddings.shape[0], device=embeddings.device)
        if self.symmetric:
            return self.loss(torch.cat([embeddings, ref_emb], dim=0), torch.cat([labels, labels], dim=0))
        return self.loss(embeddings=embeddings, labels=labels, ref_emb=ref_emb, ref_labels=labels.clone())


class VICRegLoss(MetricLoss):
    """``lambda s(Z, Z') + mu [v(Z) + v(Z')] / 2 + nu [c(Z) + c(Z')]`` (Bardes et al. Eq. (6)).

    ``s``: mean squared distance between the views (Eq. (5)); ``v``: mean over dimensions of
    ``[1 - sqrt(Var + eps)]_+`` (Eqs. (1)-(2)); ``c``: sum of squared off-diagonal covariances
    over ``D`` (Eqs. (3)-(4)). PML vs paper: PML (and the paper's code) halves the two variance
    terms; ``variance_average=False`` adds them, as Eq. (6) is written.
    """

    _parameter_constraints = {
        "invariance_lambda": [Interval(float, None, None)],
        "variance_mu": [Interval(float, None, None)],
        "covariance_v": [Interval(float, None, None)],
        "eps": [Interval(float, 0, None)],
        "variance_average": [InstanceOf((bool,))],
    }
    requires_labels = False
    _repr_keys = ("invariance_lambda", "variance_mu", "covariance_v", "eps", "variance_average")

    def __init__(
        self, invariance_lambda: float = 25, variance_mu: float = 25, covariance_v: float = 1, eps: float = 1e-4,
        *, variance_average: bool = True, reduction: str = "mean", reducer: object | None = None,
        distance: object | None = None, embedding_regularizer: object | None = None,
    ):
        if distance is not None:
            raise InvalidParameterError("VICRegLoss takes no distance (its terms are variances and covariances).")
        if embedding_regularizer is not None:
            raise InvalidParameterError(
                "VICRegLoss takes no embedding_regularizer (its variance and covariance terms regularize)."
            )
        super().__init__()
        self.invariance_lambda, self.variance_mu = float(invariance_lambda), float(variance_mu)
        self.covariance_v, self.eps = float(covariance_v), float(eps)
        self.variance_average = variance_average
        self.reducer = get_reducer(reduction if reducer is None else reducer, "VICRegLoss", REDUCTIONS)

    def forward(self, embeddings, labels=None, indices_tuple=None, ref_emb=None, ref_labels=None) -> torch.Tensor:
        """PML's call with the second view as ``ref_emb``; labels and indices are refused."""
        if labels is not None or ref_labels is not None:
            raise InvalidParameterError("VICRegLoss takes no labels: the two views of each row are its pair.")
        if indices_tuple is not None:
            raise InvalidParameterError("VICRegLoss takes no indices_tuple.")
        _check_views(embeddings, ref_emb, "VICRegLoss")
        ref_emb = to_device(ref_emb, embeddings.device)
        with autocast_off(embeddings.device.type):
            z, z_ref = as_fp32(embeddings), as_fp32(ref_emb).to(as_fp32(embeddings).dtype)
            invariance = ((z - z_ref) ** 2).mean(1)  # per row
            half = 0.5 if self.variance_average else 1.0
            total = self.invariance_lambda * self.reducer(invariance)
            for view in (z, z_ref):
                variance = (1 - torch.sqrt(view.var(dim=0) + self.eps)).clamp_min(0.0) * half
                total = total + self.variance_mu * self.reducer(variance)
            return as_input_dtype(total + self.covariance_v * (self._covariance(z) + self._covariance(z_ref)), embeddings)

    @staticmethod
    def _covariance(z: torch.Tensor) -> torch.Tensor:
        """``sum_{i != j} C(Z)_ij^2 / D`` (Eqs. (3)-(4))."""
        centred = z - z.mean(0)
        cov = centred.T @ centred / (z.shape[0] - 1)
        return (cov.pow(2).sum() - cov.diagonal().pow(2).sum()) / z.shape[1]
