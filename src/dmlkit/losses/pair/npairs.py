"""N-pair loss (Sohn, 2016): one (anchor, positive) pair per class, softmax over the others.

PML vs paper: Sohn uses raw inner products plus an L2 penalty on the embeddings; PML's
default distance is a dot product of L2-normalised embeddings (a cosine) and no penalty.
dmlkit follows PML (``distance=CosineSimilarity()``); pass ``DotProductSimilarity()`` for
the paper's logits. The pair of a class is its first sample and that sample's first positive
(batch order), as in PML, so the values match.
"""

from __future__ import annotations

import torch

from dmlkit.distances import BaseDistance, CosineSimilarity
from dmlkit.exceptions import InvalidParameterError
from dmlkit.losses.base import LOSSES
from dmlkit.losses.pair._common import PairBatch, PairLoss


@LOSSES.register("npairs")
class NPairsLoss(PairLoss):
    """Cross-entropy of ``sim(anchor_c, positive_c')`` over classes ``c'`` with target ``c``.

    Sohn (2016) Eq. (3) (N-pair-mc); mean over the ``N`` classes having a positive pair.
    """

    reductions = ("mean", "sum")
    supports_references = False
    requires_labels = True
    _repr_keys = ("reduction",)

    def __init__(
        self, *, distance: BaseDistance | None = None, miner: object | None = None, reduction: str = "mean"
    ):
        super().__init__(distance=distance, miner=miner, reduction=reduction)

    def default_distance(self) -> BaseDistance:
        return CosineSimilarity()

    def compute_pair_loss(self, batch: PairBatch) -> torch.Tensor:
        labels = batch.labels
        if labels is None or labels.dim() != 1:
            raise InvalidParameterError("NPairsLoss needs class-id labels [B] (one pair per class).")
        positive = batch.pair_masks().positive
        has_pos = positive.any(1)
        first_pos = positive.to(torch.int8).argmax(1)
        classes, inverse = labels.unique(return_inverse=True)
        index = torch.arange(labels.numel(), device=labels.device)
        sentinel = labels.numel()
        first_anchor = torch.full((classes.numel(),), sentinel, dtype=torch.long, device=labels.device)
        first_anchor.scatter_reduce_(0, inverse, torch.where(has_pos, index, sentinel), reduce="amin")
        anchors = first_anchor[first_anchor < sentinel]
        if anchors.numel() == 0:
            return (batch.embeddings * 0).sum()
        mat = self.distance(batch.embeddings[anchors], batch.embeddings[first_pos[anchors]])
        logits = mat if self.distance.is_inverted else -mat
        targets = torch.arange(anchors.numel(), device=labels.device)
        return torch.nn.functional.cross_entropy(logits, targets, reduction=self.reduction)
