"""Instance loss (Zheng et al., "Dual-Path Convolutional Image-Text Embeddings with Instance Loss",
ACM TOMM 2020), in PML's batch form.

The paper's Eq. (1) is a softmax classifier over instance classes. PML (and the authors'
re-identification code it is tested against) uses the batch as the classifier: the logits of
sample ``i`` are ``gamma * cos(x_i, x_j)`` over the batch ``j`` and the target is the index of
``i``'s label among the batch's sorted unique labels; cross-entropy, mean over samples. dmlkit
computes exactly that (PML's behaviour) and needs labels, as PML does; no reference set.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from dmlkit._validation import Interval
from dmlkit.distances import BaseDistance, CosineSimilarity, l2_normalize
from dmlkit.distances._closed_form import EPS, unnormalise
from dmlkit.exceptions import InvalidParameterError
from dmlkit.losses.base import LOSSES
from dmlkit.losses.logsumexp import softmax_rows
from dmlkit.losses.pair._fixed_distance import require_distance
from dmlkit.losses.pair.base import PairLoss
from dmlkit.losses.pair.batch import PairBatch


@LOSSES.register("instance")
class InstanceLoss(PairLoss):
    """``CE(gamma * cos(x_i, X), rank of y_i among the batch's labels)`` per sample (Zheng et al. Eq. (1), batch form)."""

    reductions = ("mean", "sum", "mean_nonzero")
    supports_references = False
    _repr_keys = ("gamma", "reduction")
    _parameter_constraints = {"gamma": [Interval(float, 0, None, closed="neither")]}

    def __init__(
        self,
        gamma: float = 64,
        *,
        distance: BaseDistance | None = None,
        miner: object | None = None,
        reduction: str = "mean",
        reducer: object | None = None,
        embedding_regularizer: object | None = None,
        embedding_reg_weight: float = 1.0,
    ):
        super().__init__(
            distance=distance, miner=miner, reduction=reduction, reducer=reducer,
            embedding_regularizer=embedding_regularizer, embedding_reg_weight=embedding_reg_weight,
        )
        require_distance("InstanceLoss", self.distance, CosineSimilarity)
        self.gamma = float(gamma)

    def default_distance(self) -> BaseDistance:
        return CosineSimilarity()

    def compute_pair_loss(self, batch: PairBatch) -> torch.Tensor:
        if batch.selection is not None or batch.labels is None or batch.labels.dim() != 1:
            raise InvalidParameterError(
                "InstanceLoss needs class-id labels [B] and takes no mined pairs (indices_tuple / pairs)."
            )
        target = torch.unique(batch.labels, return_inverse=True)[1]
        terms, coefficient = _cross_entropy_terms(batch.embeddings, target, self.gamma)
        divisor = self.reducer.divisor(target.new_tensor(target.numel()), (terms > 0).sum()).to(terms.dtype).clamp_min(1.0)
        return _BatchCosineCrossEntropy.apply(terms.sum() / divisor, batch.embeddings, coefficient.mul_(self.gamma / divisor))


def _cross_entropy_terms(x: torch.Tensor, target: torch.Tensor, gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row ``CE(gamma * cos(x_i, X), target_i)`` ``[B]`` and ``d(sum CE)/d(logits) = softmax - one-hot`` ``[B, B]``."""
    with torch.no_grad():
        unit = l2_normalize(x.detach())
        logits = (unit @ unit.T).mul_(gamma)
        rows = torch.arange(target.numel(), device=target.device)
        picked = logits[rows, target]
        lse, soft = softmax_rows(logits)
        soft[rows, target] -= 1.0
    return lse - picked, soft


class _BatchCosineCrossEntropy(torch.autograd.Function):
    """The loss value; backward maps ``G = d(loss)/d(cos)`` through ``x_n x_n^T`` and the L2 normalisation.

    ``d/dx_n = (G + G^T) x_n`` (one product, where autograd would take two), then
    ``dx = (d/dx_n - x_n <x_n, d/dx_n>) / |x|`` (:func:`~dmlkit.distances._closed_form.unnormalise`).
    """

    @staticmethod
    def forward(ctx, value, x, coefficient):  # noqa: D102 - autograd protocol
        ctx.save_for_backward(x, coefficient)
        return value.clone()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):  # noqa: D102 - autograd protocol
        x, coefficient = ctx.saved_tensors
        norm = torch.linalg.vector_norm(x, dim=1, keepdim=True)
        scale = norm.clamp_min(EPS).reciprocal_()
        unit = x * scale
        grad_unit = (coefficient + coefficient.T) @ unit
        return None, unnormalise(grad_unit, unit, scale, (norm > EPS).to(x.dtype)).mul_(grad), None
