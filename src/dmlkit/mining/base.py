"""What miners and pair weighters hand to losses.

Selections are explicit dataclasses (never told apart by tuple length):

* :class:`PairSelection` — dense boolean masks ``[B, R]`` of the positive and negative pairs
  between ``B`` anchors and ``R`` references (the batch itself, or a cross-batch memory),
  with optional per-pair weights (DRO weighting, distance-weighted sampling counts).
* :class:`TripletSelection` — index triples ``(anchor, positive, negative)`` into the
  anchors and references.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dmlkit._registry import Registry

MINERS: Registry[nn.Module] = Registry("miner")


@dataclass(frozen=True)
class PairSelection:
    """Positive and negative pairs as ``[B, R]`` masks (boolean, or 0/1 floats), with optional ``[B, R]`` weights."""

    positive: torch.Tensor
    negative: torch.Tensor
    positive_weight: torch.Tensor | None = None
    negative_weight: torch.Tensor | None = None

    @property
    def num_pairs(self) -> int:
        return int(self.positive.sum()) + int(self.negative.sum())


@dataclass(frozen=True)
class TripletSelection:
    """Triplets as three ``[T]`` int64 index tensors (anchor rows; positive/negative reference rows)."""

    anchor: torch.Tensor
    positive: torch.Tensor
    negative: torch.Tensor

    def __len__(self) -> int:
        return int(self.anchor.numel())


def label_equality(
    labels: torch.Tensor | None, ref_labels: torch.Tensor | None = None, *, pos_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """``[B, R]`` bool, a fresh tensor: ``pos_mask``, or same class (ids ``[B]``) / a shared label
    (multi-label ``[B, C]``) between ``labels`` and ``ref_labels`` (default: ``labels``); diagonal kept."""
    if pos_mask is not None:
        return pos_mask.to(torch.bool, copy=True)
    if labels is None:
        raise ValueError("label_masks needs labels or pos_mask")
    ref = labels if ref_labels is None else ref_labels
    if labels.dim() == 2:
        return (labels.float() @ ref.float().T) > 0
    return labels[:, None] == ref[None, :]


def label_masks(
    labels: torch.Tensor | None,
    ref_labels: torch.Tensor | None = None,
    *,
    pos_mask: torch.Tensor | None = None,
    same_set: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(positive [B, R], negative [B, R])`` masks from class labels or an explicit mask.

    ``labels`` may be class ids ``[B]`` or multi-label targets ``[B, C]`` (0/1; two samples are
    positive when they share a label). ``pos_mask`` overrides labels. When anchors and
    references are the same set (``ref_labels is None`` or ``same_set=True``) the diagonal
    (a sample with itself) is neither positive nor negative.
    """
    if same_set is None:
        same_set = ref_labels is None
    pos = label_equality(labels, ref_labels, pos_mask=pos_mask)
    neg = ~pos
    if same_set:
        eye = torch.eye(pos.shape[0], pos.shape[1], dtype=torch.bool, device=pos.device)
        pos = pos & ~eye
        neg = neg & ~eye
    return pos, neg
