"""N-pair loss (Sohn, 2016): one (anchor, positive) pair per class, softmax over the others.

PML vs paper: Sohn uses raw inner products plus an L2 penalty on the embeddings; PML's
default distance is a dot product of L2-normalised embeddings (a cosine) and no penalty.
dmlkit follows PML (``distance=CosineSimilarity()``); pass ``DotProductSimilarity(normalize_embeddings=False)`` for
the paper's logits. ``scale`` (default 1: PML's and the paper's logits) multiplies the similarities
before the softmax (an inverse temperature: cosine logits span only [-1, 1]).
The pair of a class is its first sample and that sample's first positive
(batch order), as in PML, so the values match.

float16 batches: the anchor-positive block is computed in float16 and each class's term rounded to
float16 before the mean, as PML's per-pair losses are (its float16 test compares to the last bit).
"""

from __future__ import annotations

import torch

from dmlkit.core.validation import Interval
from dmlkit.distances import BaseDistance, CosineSimilarity
from dmlkit.exceptions import InvalidParameterError
from dmlkit.losses.base import LOSSES
from dmlkit.losses.pair.base import PairLoss
from dmlkit.losses.pair.batch import PairBatch
from dmlkit.losses.pair.terms import Pairwise, in_input_precision, rounded_to_input


@LOSSES.register("npairs")
class NPairsLoss(PairLoss):
    """Cross-entropy of ``sim(anchor_c, positive_c')`` over classes ``c'`` with target ``c``.

    Sohn (2016) Eq. (3) (N-pair-mc); mean over the ``N`` classes having a positive pair.
    """

    reductions = ("mean", "sum")
    supports_references = False
    requires_labels = True
    _repr_keys = ("reduction", "scale")
    _parameter_constraints = {"scale": [Interval(float, 0, None, closed="neither")]}

    def __init__(
        self, *, scale: float = 1.0, distance: BaseDistance | None = None, miner: object | None = None,
        reduction: str = "mean",
        reducer: object | None = None,
        embedding_regularizer: object | None = None,
        embedding_reg_weight: float = 1.0,
    ):
        super().__init__(
            distance=distance, miner=miner, reduction=reduction,
            reducer=reducer,
            embedding_regularizer=embedding_regularizer,
            embedding_reg_weight=embedding_reg_weight,
        )
        self.scale = float(scale)

    def default_distance(self) -> BaseDistance:
        return CosineSimilarity()

    def compute_pair_loss(self, batch: PairBatch) -> torch.Tensor:
        labels = batch.labels
        if labels is None or labels.dim() != 1:
            raise InvalidParameterError("NPairsLoss needs class-id labels [B] (one pair per class).")
        anchors, positives = self._pairs(batch)
        x = batch.embeddings
        pairs = Pairwise(self.distance, x, x, same_set=True, rows=anchors, cols=positives)
        # Cross-entropy of row c over the N positives with target c; d/d(logits) = softmax - I.
        sign = 1.0 if self.distance.is_inverted else -1.0
        mat = in_input_precision(pairs.mat, self.distance, batch, anchors, positives)
        logits = mat if sign > 0 else -mat
        log_soft = torch.log_softmax(logits if self.scale == 1.0 else logits * self.scale, 1)
        scale = 1.0 / max(self.reducer.divisor(anchors.numel(), anchors.numel()), 1)
        value = rounded_to_input(-log_soft.diagonal(), batch).sum() * scale
        soft = log_soft.exp_()
        soft.diagonal().sub_(1.0)
        return pairs.attach(value, soft.mul_(sign * scale * self.scale))

    @staticmethod
    def _pairs(batch: PairBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """``(anchors [N], positives [N])``: per class, its first sample having a positive and that
        sample's first positive (batch order)."""
        labels = batch.labels
        if batch.selection is None and batch.pos_mask is None:
            positive = (labels[:, None] == labels[None, :]).to(torch.uint8).fill_diagonal_(0)
            first_pos = positive.argmax(1)  # 0 for a sample without positives
            # Class ids: the class's first sample is the one whose first positive comes later.
            index = torch.arange(labels.shape[0], device=labels.device)
            anchors = (first_pos > index).nonzero().squeeze(1)
            return anchors, first_pos.index_select(0, anchors)
        same_class = labels[:, None] == labels[None, :]
        positive = batch.pair_masks().positive
        has_pos = positive.any(1)
        anchors = (has_pos & ~(same_class & has_pos).tril_(-1).any(1)).nonzero().squeeze(1)
        return anchors, positive.index_select(0, anchors).to(torch.uint8).argmax(1)
