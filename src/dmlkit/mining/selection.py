"""What miners and pair weighters hand to losses.

Selections are explicit dataclasses (never told apart by tuple length):

* :class:`PairSelection` — dense boolean masks ``[B, R]`` of the positive and negative pairs
  between ``B`` anchors and ``R`` references (the batch itself, or a cross-batch memory),
  with optional per-pair weights (DRO weighting, distance-weighted sampling counts).
* :class:`TripletSelection` — index triples ``(anchor, positive, negative)`` into the
  anchors and references.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

PairList = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class PairSelection:
    """Positive and negative pairs as ``[B, R]`` masks (boolean, or 0/1 floats), with optional ``[B, R]`` weights."""

    positive: torch.Tensor
    negative: torch.Tensor
    positive_weight: torch.Tensor | None = None
    negative_weight: torch.Tensor | None = None
    #: PML's ``(a1, p, a2, n)`` as the miner listed it (its order, pairs drawn twice listed twice:
    #: HDC's hardest-first order, the uniform histogram's draws with replacement). The masks are
    #: its set of pairs; losses read the masks, :meth:`to_indices_tuple` returns this list.
    listed: PairList | None = None
    #: Builds ``listed`` on demand, for a miner whose order costs a sort that losses (reading the
    #: masks) never need: HDC's hardest-first list is only sorted when PML's tuple is asked for.
    lister: Callable[[], PairList] | None = None

    @classmethod
    def from_pairs(cls, a1: torch.Tensor, p: torch.Tensor, a2: torch.Tensor, n: torch.Tensor,
                   num_anchors: int, num_references: int) -> "PairSelection":
        """The selection of the listed pairs, keeping the list (order and repeats) for PML."""
        positive = torch.zeros(num_anchors, num_references, dtype=torch.bool, device=a1.device)
        negative = torch.zeros_like(positive)
        positive[a1, p] = True
        negative[a2, n] = True
        return cls(positive, negative, listed=(a1, p, a2, n))

    @property
    def num_pairs(self) -> int:
        return int(self.positive.sum()) + int(self.negative.sum())

    def to_indices_tuple(self) -> PairList:
        """PML's pair tuple ``(a1, p, a2, n)`` of int64 index tensors (the miner's list when it kept
        or can build one, otherwise the row-major order of the masks)."""
        if self.listed is not None:
            return self.listed
        if self.lister is not None:
            return self.lister()
        a1, p = self.positive.bool().nonzero(as_tuple=True)
        a2, n = self.negative.bool().nonzero(as_tuple=True)
        return a1, p, a2, n


@dataclass(frozen=True)
class TripletSelection:
    """Triplets as three ``[T]`` int64 index tensors (anchor rows; positive/negative reference rows)."""

    anchor: torch.Tensor
    positive: torch.Tensor
    negative: torch.Tensor

    def __len__(self) -> int:
        return int(self.anchor.numel())

    def to_indices_tuple(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """PML's triplet tuple ``(a, p, n)``."""
        return self.anchor, self.positive, self.negative


def selection_from_indices_tuple(
    indices_tuple: tuple, num_anchors: int, num_references: int
) -> PairSelection | TripletSelection:
    """A selection from a miner's output: a dmlkit selection (returned as it is) or PML's tuple.

    ``(a1, p, a2, n)`` (pairs) becomes a :class:`PairSelection` over ``[num_anchors,
    num_references]`` (a pair listed twice counts once); ``(a, p, n)`` (triplets) becomes a
    :class:`TripletSelection`.
    """
    from dmlkit.exceptions import DataError

    if isinstance(indices_tuple, (PairSelection, TripletSelection)):
        return indices_tuple
    if not isinstance(indices_tuple, (tuple, list)) or len(indices_tuple) not in (3, 4) or not all(
        isinstance(t, torch.Tensor) and t.dim() == 1 and not t.is_floating_point() for t in indices_tuple
    ):
        raise DataError(
            "indices_tuple must be a dmlkit miner's PairSelection/TripletSelection (also accepted as pairs=) "
            "or PML's (a1, p, a2, n) pairs or (a, p, n) triplets: 3 or 4 one-dimensional "
            f"integer tensors. Got {_describe(indices_tuple)} instead."
        )
    index = [t.long() for t in indices_tuple]
    bounds = (num_anchors, num_references) * 2 if len(index) == 4 else (num_anchors, num_references, num_references)
    for t, bound in zip(index, bounds):
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= bound):
            raise DataError(f"indices_tuple holds an index outside [0, {bound}) for {num_anchors} anchors "
                            f"and {num_references} references.")
    if len(index) == 3:
        if not index[0].shape == index[1].shape == index[2].shape:
            raise DataError("indices_tuple (a, p, n) needs three tensors of equal length.")
        return TripletSelection(*index)
    a1, p, a2, n = index
    if a1.shape != p.shape or a2.shape != n.shape:
        raise DataError("indices_tuple (a1, p, a2, n) needs len(a1) == len(p) and len(a2) == len(n).")
    selection = PairSelection.from_pairs(a1, p, a2, n, num_anchors, num_references)
    return PairSelection(selection.positive, selection.negative)


def _describe(value: object) -> str:
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}: " + ", ".join(
            f"{tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__ for t in value
        )
    return repr(value)


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
