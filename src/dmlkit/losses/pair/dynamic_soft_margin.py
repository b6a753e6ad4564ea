"""Dynamic soft margin loss (Zhang & Rusinkiewicz, "Learning Local Descriptors with a CDF-Based
Dynamic Soft Margin", ICCV 2019).

Eq. (6)-(8): for each triplet, ``t = d_ap - d_an`` (Euclidean between L2-normalised
embeddings) is weighted by the CDF of ``t`` (a running histogram over ``[min_val, -min_val]``
with ``num_bins`` bins, linear interpolation between neighbouring bins, momentum ``momentum``)
and the loss is ``mean CDF(t) * t``. The weights are statistics, not part of the graph (the
authors' code detaches them; PML back-propagates through the current batch's histogram).

* With labels: every triplet of the batch (or the mined ones), as PML does.
* Without labels (descriptor pairs, PML's form): row ``i`` of ``embeddings`` and of ``ref_emb``
  are a matching pair and the negative is the hardest one in its row or column. With unequal
  counts the shorter side is padded with zeros, as in PML and the authors' code.

Histogram (``hist_``, a buffer: saved in ``state_dict``): PML mixes the current batch's
interpolated counts into the normalised history, ``h <- normalise((1 - momentum) h + momentum
counts)``; the authors' code (``normalize_batch_histogram=True``) normalises the batch's
histogram before mixing. Values outside the bins fall into the first or last bin (PML indexes
past the histogram there).
"""

from __future__ import annotations

import torch

from dmlkit.core.validation import BOOL, Interval
from dmlkit.distances import BaseDistance, LpDistance
from dmlkit.losses.base import LOSSES, zero_loss
from dmlkit.losses.pair._fixed_distance import require_distance
from dmlkit.losses.pair.base import PairLoss
from dmlkit.losses.pair.batch import PairBatch
from dmlkit.mining.selection import TripletSelection


@LOSSES.register("dynamic_soft_margin")
class DynamicSoftMarginLoss(PairLoss):
    """``mean_t CDF(t) * t`` over triplets, ``t = d_ap - d_an`` (Zhang & Rusinkiewicz Eq. (8))."""

    reductions = ("mean",)
    _repr_keys = ("min_val", "num_bins", "momentum", "normalize_batch_histogram")
    _parameter_constraints = {
        "min_val": [Interval(float, None, 0, closed="neither")],
        "num_bins": [Interval(int, 1, None)],
        "momentum": [Interval(float, 0, 1, closed="right")],
        "normalize_batch_histogram": [BOOL],
    }

    def __init__(
        self,
        min_val: float = -2.0,
        num_bins: int = 10,
        momentum: float = 0.01,
        normalize_batch_histogram: bool = False,
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
        require_distance("DynamicSoftMarginLoss", self.distance, LpDistance, p=2, normalize_embeddings=True)
        self.min_val = float(min_val)
        self.num_bins = int(num_bins)
        self.delta = 2.0 * abs(self.min_val) / self.num_bins
        self.momentum = float(momentum)
        self.normalize_batch_histogram = normalize_batch_histogram
        self.register_buffer("hist_", torch.zeros(self.num_bins))

    def default_distance(self) -> BaseDistance:
        return LpDistance(power=1, normalize_embeddings=True)

    def forward(self, embeddings, labels=None, indices_tuple=None, ref_emb=None, ref_labels=None, **kwargs):
        """PML's call; without labels (or pairs), row ``i`` of ``embeddings`` and ``ref_emb`` form a matching pair."""
        descriptor_pairs = labels is None and indices_tuple is None and not any(
            kwargs.get(k) is not None for k in ("pairs", "pos_mask")
        )
        if descriptor_pairs and isinstance(embeddings, torch.Tensor) and embeddings.dim() == 2:
            rows = ref_emb.shape[0] if isinstance(ref_emb, torch.Tensor) and ref_emb.dim() == 2 else embeddings.shape[0]
            kwargs["pos_mask"] = torch.eye(embeddings.shape[0], rows, dtype=torch.bool, device=embeddings.device)
        return super().forward(embeddings, labels, indices_tuple, ref_emb, ref_labels, **kwargs)

    def compute_pair_loss(self, batch: PairBatch) -> torch.Tensor:
        mat = self.distance.matrix(batch.embeddings, batch.references)
        if batch.labels is None and batch.selection is None:
            t = self._descriptor_pair_gaps(mat)
        elif isinstance(batch.selection, TripletSelection):
            sel = batch.selection
            t = mat[sel.anchor, sel.positive] - mat[sel.anchor, sel.negative]
        else:
            masks = batch.pair_masks()
            anchors, positives = masks.positive.nonzero(as_tuple=True)
            gaps = mat[anchors, positives].unsqueeze(1) - mat[anchors]  # [P, R]
            t = gaps[masks.negative[anchors]]
        if t.numel() == 0:
            return zero_loss(batch.embeddings, batch.references)
        with torch.no_grad():
            self._update_histogram(t.detach())
            weights = torch.cumsum(self.hist_, 0)[self._positions(t.detach()).floor().long()]
        return (weights.to(t.dtype) * t).mean()

    @staticmethod
    def _descriptor_pair_gaps(mat: torch.Tensor) -> torch.Tensor:
        """``d_ii - min(min_j d_ji, min_j d_ij)`` (``j != i``) per pair ``i``, zero-padded to ``max(B, R)`` as in PML."""
        rows, cols = mat.shape
        size = max(rows, cols)
        off_diagonal = mat.masked_fill(torch.eye(rows, cols, dtype=torch.bool, device=mat.device), float("inf"))
        pad = mat.new_zeros
        positive = torch.cat([mat.diagonal(), pad(size - min(rows, cols))])
        column_min = torch.cat([off_diagonal.amin(0), pad(size - cols)])
        row_min = torch.cat([off_diagonal.amin(1), pad(size - rows)])
        return positive - torch.minimum(column_min, row_min)

    def _positions(self, t: torch.Tensor) -> torch.Tensor:
        """Fractional bin positions of ``t``, clamped into ``[0, num_bins - 1]``."""
        return ((t - self.min_val) / self.delta).clamp(0.0, self.num_bins - 1).nan_to_num(0.0)

    def _update_histogram(self, t: torch.Tensor) -> None:
        position = self._positions(t)
        low = position.floor()
        upper = position - low
        index = low.long()
        counts = torch.zeros(self.num_bins, dtype=t.dtype, device=t.device)
        counts.scatter_add_(0, index, 1.0 - upper)
        counts.scatter_add_(0, (index + 1).clamp_max(self.num_bins - 1), upper)
        if self.normalize_batch_histogram:
            counts = counts / counts.sum()
        history = self.hist_.to(device=t.device, dtype=t.dtype)
        momentum = self.momentum if bool(history.sum() != 0) else 1.0
        mixed = (1.0 - momentum) * history + momentum * counts
        self.hist_ = mixed / mixed.sum()
