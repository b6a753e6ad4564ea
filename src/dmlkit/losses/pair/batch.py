"""One call's pairs: anchors, references and which pairs are positive, negative or weighted.

Every pair loss sees its batch as ``B`` anchors against ``R`` references. When no reference
set is given the references are the batch itself and self-pairs are excluded; otherwise the
references are a memory or a proxy set (ASAP applies a pair loss between batch and proxies).

Pairs come from, in order of precedence: ``pairs=`` (a :class:`PairSelection` or
:class:`TripletSelection`, or PML's ``indices_tuple``), the loss's ``miner``, an explicit
``pos_mask [B, R]``, or the labels (class ids ``[B]`` or multi-label targets ``[B, C]``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dmlkit.mining.selection import PairSelection, TripletSelection, label_equality, label_masks

Selection = PairSelection | TripletSelection


@dataclass(frozen=True)
class PairMasks:
    """Positive and negative pairs ``[B, R]`` with optional per-pair weights ``[B, R]``."""

    positive: torch.Tensor
    negative: torch.Tensor
    positive_weight: torch.Tensor | None = None
    negative_weight: torch.Tensor | None = None

    @property
    def weighted(self) -> bool:
        return self.positive_weight is not None or self.negative_weight is not None


@dataclass(frozen=True)
class PairBatch:
    """One call's validated inputs: anchors ``[B, D]``, references ``[R, D]`` and pair sources."""

    embeddings: torch.Tensor
    labels: torch.Tensor | None
    references: torch.Tensor
    ref_labels: torch.Tensor | None
    same_set: bool
    selection: Selection | None
    weights: torch.Tensor | None
    pos_mask: torch.Tensor | None
    #: The dtype the caller's embeddings came in (before a float16 / bfloat16 batch's float32 upcast).
    input_dtype: torch.dtype | None = None

    @property
    def float16_input(self) -> bool:
        """Whether the caller's embeddings were float16 (``embeddings`` holds their float32 copy): the dtype
        of PML's float16 tests, whose roundings a few losses keep (bfloat16 accumulates in float32 throughout)."""
        return self.input_dtype == torch.float16

    def label_pair_masks(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(positive, negative)`` ``[B, R]`` from ``pos_mask`` or the labels."""
        return label_masks(
            self.labels,
            None if self.same_set else self.ref_labels,
            pos_mask=self.pos_mask,
            same_set=self.same_set,
        )

    def pair_masks(self) -> PairMasks:
        """The selected pairs as dense masks; a triplet selection becomes its (a, p) and (a, n) pairs.

        Duplicated pairs (a pair in several mined triplets) count once, unlike PML, which
        repeats them.
        """
        sel = self.selection
        if isinstance(sel, PairSelection):
            pos, neg = sel.positive.bool(), sel.negative.bool()
            pw, nw = sel.positive_weight, sel.negative_weight
        elif isinstance(sel, TripletSelection):
            pos = torch.zeros(self.num_anchors, self.num_references, dtype=torch.bool, device=self.device)
            neg = torch.zeros_like(pos)
            pos[sel.anchor, sel.positive] = True
            neg[sel.anchor, sel.negative] = True
            pw = nw = None
        else:
            pos, neg = self.label_pair_masks()
            pw = nw = None
        pw, nw = _combine(pw, self.weights), _combine(nw, self.weights)
        if pw is not None or nw is not None:
            pw = pos.to(self.embeddings.dtype) if pw is None else pw.to(self.embeddings.dtype)
            nw = neg.to(self.embeddings.dtype) if nw is None else nw.to(self.embeddings.dtype)
        return PairMasks(pos, neg, pw, nw)

    def label_equal(self) -> torch.Tensor:
        """``[B, R]`` bool, a fresh tensor: ``pos_mask``, or same class / a shared label; diagonal kept."""
        return label_equality(self.labels, None if self.same_set else self.ref_labels, pos_mask=self.pos_mask)

    def float_masks(self) -> PairMasks:
        """:meth:`pair_masks` as 0/1 masks in the embeddings' dtype; weights (if any) are zero off their mask."""
        dtype = self.embeddings.dtype
        if self.selection is None:
            pos = self.label_equal().to(dtype)
            neg = 1.0 - pos
            if self.same_set:
                pos.fill_diagonal_(0.0)
                neg.fill_diagonal_(0.0)
            pos_w = neg_w = self.weights
        elif isinstance(self.selection, PairSelection):  # bool or 0/1 masks, used as they are
            sel = self.selection
            pos, neg = sel.positive.to(dtype), sel.negative.to(dtype)
            pos_w, neg_w = _combine(sel.positive_weight, self.weights), _combine(sel.negative_weight, self.weights)
        else:
            masks = self.pair_masks()
            pos, neg = masks.positive.to(dtype), masks.negative.to(dtype)
            pos_w, neg_w = masks.positive_weight, masks.negative_weight
        if pos_w is not None or neg_w is not None:
            pos_w = pos if pos_w is None else pos_w.to(dtype) * pos
            neg_w = neg if neg_w is None else neg_w.to(dtype) * neg
        return PairMasks(pos, neg, pos_w, neg_w)

    def excluded_masks(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(not positive, not negative)`` bool ``[B, R]``: the fill masks of masked log-sum-exps."""
        if self.selection is None:
            equal = self.label_equal()
            not_pos = ~equal
            if self.same_set:
                not_pos.fill_diagonal_(True)
                equal.fill_diagonal_(True)
            return not_pos, equal
        masks = self.pair_masks()
        return ~masks.positive, ~masks.negative

    @property
    def num_anchors(self) -> int:
        return self.embeddings.shape[0]

    @property
    def num_references(self) -> int:
        return self.references.shape[0]

    @property
    def device(self) -> torch.device:
        return self.embeddings.device


def _combine(weight: torch.Tensor | None, extra: torch.Tensor | None) -> torch.Tensor | None:
    """The product of two optional per-pair weights."""
    if weight is None or extra is None:
        return extra if weight is None else weight
    return weight * extra
