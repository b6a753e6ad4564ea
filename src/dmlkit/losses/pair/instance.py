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

from dmlkit.core.cpu_ops import exp_
from dmlkit.core.validation import Interval
from dmlkit.distances import BaseDistance, CosineSimilarity
from dmlkit.distances._closed_form import EPS, unnormalise
from dmlkit.exceptions import InvalidParameterError
from dmlkit.losses.base import LOSSES
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
        return _BatchCosineCrossEntropy.apply(batch.embeddings, target, self.gamma, self.reducer)


class _BatchCosineCrossEntropy(torch.autograd.Function):
    """``sum_i CE(gamma * cos(x_i, X), target_i) / divisor``; its gradient is computed in the same pass.

    ``Z = gamma x_n x_n^T`` (``x_n`` the L2-normalised rows) is one product; the row log-sum-exp
    and softmax ``S`` come from one exp pass, and the loss reads ``Z[i, target_i]``. The output
    is a scalar, so the forward (when ``x`` needs a gradient) also computes ``d(loss)/dx`` up to
    the incoming scalar, overwriting its temporaries instead of saving them for a backward:
    ``d(loss)/dZ = (S - Y) / divisor`` (``Y`` the one-hot targets) and ``Z`` is symmetric, so
    ``d/dx_n = gamma / divisor ((S + S^T) x_n - x_n[target] - Y^T x_n)``, one product, with
    ``S^T = exp(Z - lse^T)`` one more exp pass instead of a transposed, cache-unfriendly sum and
    the one-hot part a gather and a scatter-add of rows; then ``dx = (d/dx_n - x_n <x_n, d/dx_n>) / |x|``
    (:func:`~dmlkit.distances._closed_form.unnormalise`).
    """

    @staticmethod
    def forward(ctx, x, target, gamma, reducer):  # noqa: D102 - autograd protocol
        norm = torch.linalg.vector_norm(x, dim=1, keepdim=True)
        scale = norm.clamp_min(EPS).reciprocal_()
        unit = x * scale
        logits = torch.mm(unit, unit.T).mul_(gamma)
        picked = logits.gather(1, target[:, None]).squeeze_(1)
        shift = logits.amax(1, keepdim=True)
        both = exp_(torch.sub(logits, shift))
        total = both.sum(1, keepdim=True)
        lse = shift.add_(total.log())
        terms = lse.squeeze(1) - picked
        divisor = max(float(reducer.divisor(terms.numel(), (terms > 0).sum())), 1.0)
        if ctx.needs_input_grad[0]:
            both.div_(total).add_(exp_(logits.sub_(lse.T)))  # S + S^T
            grad_unit = torch.mm(both, unit).sub_(unit.index_select(0, target)).index_add_(0, target, unit, alpha=-1.0)
            ctx.save_for_backward(unnormalise(grad_unit, unit, scale, (norm > EPS).to(x.dtype)).mul_(gamma / divisor))
        return terms.sum() / divisor

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):  # noqa: D102 - autograd protocol
        (grad_x,) = ctx.saved_tensors
        return grad_x * grad, None, None, None
