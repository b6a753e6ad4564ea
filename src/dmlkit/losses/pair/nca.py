"""Neighbourhood components analysis (Goldberger et al., NIPS 2004) on a batch.

Eqs. (1)-(2): ``p_ij = softmax_j(-scale * d_ij)`` over the references ``j != i`` and
``L_i = -log sum_{j in C_i} p_ij`` (``C_i``: the references of ``i``'s class); mean over anchors
having a positive. Distance default as in PML: squared Euclidean between L2-normalised
embeddings; for a similarity the logits are ``+scale * s``. Mined pairs (``indices_tuple``)
weight each anchor by how often it occurs in them over the largest count, as PML does; the
classes still come from the labels. PML drops an anchor whose probability underflows to 0;
dmlkit keeps it (``-log p`` from log-sum-exps stays finite).
"""

from __future__ import annotations

import torch

from dmlkit.core.validation import Interval
from dmlkit.distances import BaseDistance, LpDistance
from dmlkit.exceptions import InvalidParameterError
from dmlkit.losses.base import LOSSES
from dmlkit.losses.logsumexp import softmax_rows
from dmlkit.losses.pair.base import PairLoss
from dmlkit.losses.pair.batch import PairBatch
from dmlkit.losses.pair.terms import Pairwise
from dmlkit.mining.selection import PairSelection


@LOSSES.register("nca")
class NCALoss(PairLoss):
    """``-log sum_{j in C_i} softmax_j(-softmax_scale * d_ij)`` per anchor (Goldberger et al. Eq. (1)-(2))."""

    reductions = ("mean", "mean_nonzero", "sum")
    _repr_keys = ("softmax_scale", "reduction")
    _parameter_constraints = {"softmax_scale": [Interval(float, 0, None, closed="neither")]}

    def __init__(
        self,
        softmax_scale: float = 1,
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
        self.softmax_scale = float(softmax_scale)

    def default_distance(self) -> BaseDistance:
        return LpDistance(power=2, normalize_embeddings=True)

    def compute_pair_loss(self, batch: PairBatch) -> torch.Tensor:
        if batch.labels is None and batch.pos_mask is None:
            raise InvalidParameterError("NCALoss needs labels (or pos_mask): the classes C_i of Eq. (1).")
        pairs = Pairwise(self.distance, batch.embeddings, batch.references, batch.same_set)
        scale = self.softmax_scale if self.distance.is_inverted else -self.softmax_scale
        logits = pairs.mat * scale
        positive, negative = batch.label_pair_masks()
        # L_i = LSE_{j != i} z_ij - LSE_{j in C_i} z_ij; dL_i/dz_ij = softmax_all_ij - softmax_pos_ij
        lse_all, soft_all = softmax_rows(logits.masked_fill(~(positive | negative), float("-inf")))
        lse_pos, soft_pos = softmax_rows(logits.masked_fill_(~positive, float("-inf")))
        has_positive = positive.any(1)
        terms = torch.where(has_positive, lse_all - lse_pos, logits.new_zeros(()))
        weight = has_positive.to(logits.dtype)
        if batch.selection is not None:
            weight = weight * self._anchor_weights(batch).to(logits.dtype)
        terms = terms * weight
        divisor = self.reducer.divisor(has_positive.sum(), ((terms > 0) & has_positive).sum())
        divisor = divisor.to(logits.dtype).clamp_min(1.0)
        coefficient = soft_all.sub_(soft_pos).mul_((weight * (scale / divisor)).unsqueeze(1))
        return pairs.attach(terms.sum() / divisor, coefficient)

    @staticmethod
    def _anchor_weights(batch: PairBatch) -> torch.Tensor:
        """How often each anchor occurs in the mined pairs or triplets, over the largest count (PML's rule)."""
        sel = batch.selection
        if isinstance(sel, PairSelection):
            chosen = (sel.positive.bool(), sel.negative.bool())
            counts = sum(m.sum(1) + (m.sum(0) if batch.same_set else 0) for m in chosen)
        else:
            index = sel.anchor if not batch.same_set else torch.cat([sel.anchor, sel.positive, sel.negative])
            counts = torch.bincount(index, minlength=batch.num_anchors)[: batch.num_anchors]
        counts = counts.to(batch.embeddings.dtype)
        return counts / counts.max().clamp_min(1.0)
