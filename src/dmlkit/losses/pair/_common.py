"""Shared machinery of the pair-based losses: inputs, pair masks, reductions, safe log-sum-exp.

Every pair loss sees its batch as ``B`` anchors against ``R`` references. When no reference
set is given the references are the batch itself and self-pairs are excluded; otherwise the
references are a memory or a proxy set (ASAP applies a pair loss between batch and proxies).

Pairs come from, in order of precedence: ``pairs=`` (a :class:`PairSelection` or
:class:`TripletSelection`), the loss's ``miner``, an explicit ``pos_mask [B, R]``, or the
labels (class ids ``[B]`` or multi-label targets ``[B, C]``).

Reductions are named the same way for every loss:

* ``"mean_nonzero"`` — average over the terms that are > 0 (PML's ``AvgNonZeroReducer``);
* ``"mean"`` — average over every selected term;
* ``"sum"`` — plain sum.

Per-pair losses reduce the positive and the negative pairs separately and add the two (as
PML's sub-losses do). When weights are present (``PairSelection.positive_weight`` /
``negative_weight`` or ``weights=[B, R]``) the loss is ``sum(weight * term)`` over the
selected pairs with no further normalisation: the weighter has already normalised.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dmlkit._validation import check_embeddings_labels
from dmlkit.distances import BaseDistance, as_distance
from dmlkit.exceptions import DataError, InvalidParameterError
from dmlkit.losses.base import MetricLoss, as_fp32
from dmlkit.losses.reducers import get_reducer
from dmlkit.mining.selection import (
    PairSelection,
    TripletSelection,
    label_equality,
    label_masks,
    selection_from_indices_tuple,
)

Selection = PairSelection | TripletSelection

#: Largest number of elements one chunk of a [chunk, R] working tensor may hold.
CHUNK_ELEMENTS = 1 << 22


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


def dissimilarity(mat: torch.Tensor, distance: BaseDistance) -> torch.Tensor:
    """The matrix oriented so that larger means farther: ``-S`` for similarities, ``D`` for distances."""
    return -mat if distance.is_inverted else mat


def oriented(value: float | torch.Tensor, distance: BaseDistance) -> float | torch.Tensor:
    """A threshold given in the distance's own units, oriented like :func:`dissimilarity`."""
    return -value if distance.is_inverted else value


def masked_logsumexp(x: torch.Tensor, mask: torch.Tensor, dim: int = -1, add_one: bool = False) -> torch.Tensor:
    """``log(sum_{mask} exp(x))`` along ``dim`` (``log(1 + ...)`` when ``add_one``).

    Rows with nothing selected give ``-inf`` (``0`` with ``add_one``) and zero, never NaN,
    gradients.
    """
    empty = ~mask.any(dim, keepdim=True)
    x = x.masked_fill(~mask | empty, float("-inf")).masked_fill(empty, 0.0)
    out = torch.logsumexp(x, dim, keepdim=True).masked_fill(empty, float("-inf")).squeeze(dim)
    if add_one:
        # log(1 + e^out) with out = -inf mapped to 0 and a zero gradient there.
        out = log1p_exp(out)
    return out


def log1p_exp(x: torch.Tensor) -> torch.Tensor:
    """``log(1 + exp(x))`` exactly (no threshold), finite gradient at ``x = -inf``."""
    return torch.clamp_min(x, 0.0) + torch.log1p(torch.exp(-x.abs()))


def weighted_sum(terms: torch.Tensor, mask: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``sum(weight * term)`` over the selected pairs, no normalisation (DRO weights rule)."""
    return torch.where(mask, weight * terms, terms.new_zeros(())).sum()


class _AttachGradient(torch.autograd.Function):
    """Identity on ``value``; routes ``grad * coefficient`` to ``tensor`` in backward."""

    @staticmethod
    def forward(ctx, value, tensor, coefficient):  # noqa: D102 - autograd protocol
        ctx.save_for_backward(coefficient)
        return value.clone()

    @staticmethod
    def backward(ctx, grad):  # noqa: D102 - autograd protocol
        (coefficient,) = ctx.saved_tensors
        return grad, grad * coefficient, None


def attach_gradient(value: torch.Tensor, *tensor_and_coefficient: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """A scalar equal to ``value`` whose gradient w.r.t. each tensor is its ``coefficient``.

    Used by losses that compute their value and the analytic derivative w.r.t. the distance
    matrix under ``no_grad`` (chunk by chunk for all-triplet losses, so memory stays
    ``O(B R)`` instead of ``O(B R^2)``); the backward pass is one multiplication.
    """
    out = value.detach()
    for tensor, coefficient in tensor_and_coefficient:
        out = _AttachGradient.apply(out, tensor, coefficient.detach())
    return out


def _check_label_tensor(labels: torch.Tensor, rows: int, name: str, rows_name: str) -> None:
    if not isinstance(labels, torch.Tensor):
        raise InvalidParameterError(f"{name} must be a torch.Tensor. Got {type(labels).__name__}.")
    if labels.dim() not in (1, 2):
        raise DataError(f"{name} must be class ids [B] or multi-label targets [B, C]. Got shape {tuple(labels.shape)}.")
    if labels.is_floating_point() or labels.is_complex():
        raise DataError(f"{name} must hold integer class ids (int64) or 0/1 targets. Got dtype {labels.dtype}.")
    if labels.dim() == 1 and labels.dtype == torch.bool:
        raise DataError(f"{name} must hold integer class ids (int64). Got dtype {labels.dtype}.")
    if labels.shape[0] != rows:
        raise DataError(f"{rows_name} has {rows} rows but {name} has {labels.shape[0]}.")


def _check_matrix(x: torch.Tensor, shape: tuple[int, int], name: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise InvalidParameterError(f"{name} must be a torch.Tensor of shape {list(shape)}. Got {type(x).__name__}.")
    if tuple(x.shape) != shape:
        raise DataError(
            f"{name} has shape {tuple(x.shape)} but embeddings and references need {shape} (anchors x references)."
        )


class PairLoss(MetricLoss):
    """Base of the pair-based losses.

    ``loss(embeddings [B, D], labels [B] | [B, C] | None, *, pairs=None, weights=None,
    ref_emb=None, ref_labels=None, pos_mask=None) -> scalar``.
    """

    #: Reductions this loss accepts (first is the default).
    reductions: tuple[str, ...] = ("mean_nonzero", "mean", "sum")
    #: False for losses that only make sense within the batch (N-pairs).
    supports_references: bool = True
    #: True for per-pair losses that honour per-pair weights.
    supports_weights: bool = False
    #: True for losses that can be driven by a pos_mask or pairs without class labels.
    requires_labels = False

    def __init__(
        self,
        *,
        distance: object | None,
        miner: object | None,
        reduction: str,
        reducer: object | None = None,
        embedding_regularizer: object | None = None,
        embedding_reg_weight: float = 1.0,
    ):
        super().__init__()
        name = type(self).__name__
        if miner is not None and not callable(miner):
            raise InvalidParameterError(f"The 'miner' parameter of {name} must be callable. Got {miner!r} instead.")
        self.distance = self.default_distance() if distance is None else as_distance(distance, name)
        self.miner = miner
        self.reducer = get_reducer(reduction if reducer is None else reducer, name, self.reductions)
        self.reduction = self.reducer.name
        self.set_regularizers(embedding_regularizer, embedding_reg_weight)

    def default_distance(self) -> BaseDistance:  # pragma: no cover - overridden
        raise NotImplementedError

    def forward(
        self,
        embeddings: torch.Tensor,
        labels: torch.Tensor | None = None,
        indices_tuple: tuple | None = None,
        ref_emb: torch.Tensor | None = None,
        ref_labels: torch.Tensor | None = None,
        *,
        pairs: Selection | None = None,
        weights: torch.Tensor | None = None,
        pos_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """PML's call ``loss(embeddings, labels, indices_tuple, ref_emb, ref_labels)`` plus dmlkit's
        keyword sources of pairs (``pairs=`` selection, ``weights=``, ``pos_mask=``)."""
        if indices_tuple is not None:
            if pairs is not None:
                raise InvalidParameterError(f"{type(self).__name__} got both indices_tuple and pairs; pass one.")
            num_refs = embeddings.shape[0] if ref_emb is None else ref_emb.shape[0]
            pairs = selection_from_indices_tuple(indices_tuple, embeddings.shape[0], num_refs)
        batch = self._prepare(embeddings, labels, pairs, weights, ref_emb, ref_labels, pos_mask)
        with torch.autocast(device_type=embeddings.device.type, enabled=False):
            loss = self.compute_pair_loss(batch)
        return self.add_regularization(loss, embeddings)

    def compute_pair_loss(self, batch: PairBatch) -> torch.Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    # -- input handling -------------------------------------------------------------------
    def _prepare(self, embeddings, labels, pairs, weights, ref_emb, ref_labels, pos_mask) -> PairBatch:
        name = type(self).__name__
        check_embeddings_labels(embeddings, None)
        num = embeddings.shape[0]
        if labels is not None:
            _check_label_tensor(labels, num, "labels", "embeddings")
        same_set = ref_emb is None
        if ref_emb is None:
            if ref_labels is not None:
                raise InvalidParameterError(f"{name} got ref_labels without ref_emb.")
            references, ref_labels = embeddings, labels
        else:
            if not self.supports_references:
                raise InvalidParameterError(f"{name} does not support ref_emb (it is defined within the batch only).")
            check_embeddings_labels(ref_emb, None, name="ref_emb")
            if ref_emb.shape[1] != embeddings.shape[1]:
                raise DataError(
                    f"embeddings has {embeddings.shape[1]} columns but ref_emb has {ref_emb.shape[1]}."
                )
            references = as_fp32(ref_emb).to(as_fp32(embeddings).dtype)
            if ref_labels is not None:
                _check_label_tensor(ref_labels, ref_emb.shape[0], "ref_labels", "ref_emb")
                if labels is not None and labels.dim() != ref_labels.dim():
                    raise DataError(
                        f"labels has shape {tuple(labels.shape)} but ref_labels has {tuple(ref_labels.shape)}; "
                        "both must be class ids or both multi-label targets."
                    )
        shape = (num, references.shape[0])
        if pos_mask is not None:
            _check_matrix(pos_mask, shape, "pos_mask")
        if weights is not None:
            if not self.supports_weights:
                raise InvalidParameterError(
                    f"{name} does not take per-pair weights; use a per-pair loss "
                    "(ContrastiveLoss, MarginLoss, BinomialDevianceLoss)."
                )
            _check_matrix(weights, shape, "weights")
        if pairs is None and self.miner is not None:
            pairs = self.miner(embeddings, labels, ref_emb, ref_labels)
        if pairs is not None:
            self._check_selection(pairs, shape)
        elif pos_mask is None:
            if labels is None:
                raise InvalidParameterError(f"{name} needs labels, pos_mask or pairs.")
            if not same_set and ref_labels is None:
                raise InvalidParameterError(f"{name} got ref_emb without ref_labels (and no pos_mask or pairs).")
        return PairBatch(
            embeddings=as_fp32(embeddings),
            labels=labels,
            references=as_fp32(embeddings) if same_set else references,
            ref_labels=ref_labels,
            same_set=same_set,
            selection=pairs,
            weights=weights,
            pos_mask=pos_mask,
        )

    def _check_selection(self, pairs: object, shape: tuple[int, int]) -> None:
        name = type(self).__name__
        if isinstance(pairs, PairSelection):
            _check_matrix(pairs.positive, shape, "pairs.positive")
            _check_matrix(pairs.negative, shape, "pairs.negative")
            for w, wname in ((pairs.positive_weight, "pairs.positive_weight"), (pairs.negative_weight, "pairs.negative_weight")):
                if w is not None:
                    if not self.supports_weights:
                        raise InvalidParameterError(
                            f"{name} does not take per-pair weights ({wname}); use a per-pair loss "
                            "(ContrastiveLoss, MarginLoss, BinomialDevianceLoss)."
                        )
                    _check_matrix(w, shape, wname)
        elif isinstance(pairs, TripletSelection):
            a, p, n = pairs.anchor, pairs.positive, pairs.negative
            if not (a.shape == p.shape == n.shape) or a.dim() != 1:
                raise DataError(
                    f"pairs (TripletSelection) must hold three [T] index tensors of equal length. "
                    f"Got {tuple(a.shape)}, {tuple(p.shape)}, {tuple(n.shape)}."
                )
            if a.numel() and (int(a.max()) >= shape[0] or int(torch.maximum(p.max(), n.max())) >= shape[1]):
                raise DataError(
                    f"pairs (TripletSelection) indexes past the {shape[0]} anchors or {shape[1]} references."
                )
        else:
            raise InvalidParameterError(
                f"The 'pairs' argument of {name} must be a PairSelection, a TripletSelection or None. "
                f"Got {type(pairs).__name__} instead."
            )
