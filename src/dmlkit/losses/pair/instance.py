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

from dmlkit._validation import Interval
from dmlkit.distances import BaseDistance, CosineSimilarity
from dmlkit.exceptions import InvalidParameterError
from dmlkit.losses.base import LOSSES
from dmlkit.losses.logsumexp import softmax_rows
from dmlkit.losses.pair._fixed_distance import require_distance
from dmlkit.losses.pair.base import PairLoss
from dmlkit.losses.pair.batch import PairBatch
from dmlkit.losses.pair.terms import Pairwise


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
        pairs = Pairwise(self.distance, batch.embeddings, batch.embeddings, same_set=True)
        target = torch.unique(batch.labels, return_inverse=True)[1]
        rows = torch.arange(target.numel(), device=target.device)
        logits = pairs.mat * self.gamma
        picked = logits[rows, target]
        # cross-entropy per row and its gradient softmax - one-hot, without autograd
        lse, soft = softmax_rows(logits)
        terms = lse - picked
        divisor = self.reducer.divisor(rows.new_tensor(rows.numel()), (terms > 0).sum()).to(terms.dtype).clamp_min(1.0)
        soft[rows, target] -= 1.0
        return pairs.attach(terms.sum() / divisor, soft.mul_(self.gamma / divisor))
