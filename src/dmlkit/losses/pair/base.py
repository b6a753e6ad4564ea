"""The base class of the pair losses: PML's call, input checks, pair sources, reducer and regularizer.

Per-pair losses reduce the positive and the negative pairs separately and add the two (as
PML's sub-losses do), with the loss's reducer (:mod:`dmlkit.losses.reducers`: ``reduction=`` or
PML's ``reducer=``). When weights are present (``PairSelection.positive_weight`` /
``negative_weight`` or ``weights=[B, R]``) the loss is ``sum(weight * term)`` over the selected
pairs with no further normalisation: the weighter has already normalised.
"""

from __future__ import annotations

import torch

from dmlkit.core.devices import autocast_off, to_device
from dmlkit.core.validation import check_embeddings_labels
from dmlkit.distances import BaseDistance, as_distance
from dmlkit.exceptions import DataError, InvalidParameterError
from dmlkit.losses.base import MetricLoss, as_fp32
from dmlkit.losses.pair.batch import PairBatch, Selection
from dmlkit.losses.reducers import get_reducer, per_sub_loss
from dmlkit.mining.selection import PairSelection, TripletSelection, selection_from_indices_tuple


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
    #: True for losses that can hand their selected terms to any reducer (PerAnchorReducer,
    #: ClassWeightedReducer, ThresholdReducer, ...); the others reduce from counts only.
    reduces_terms: bool = False
    #: PML's sub-loss names; with several, ``reducer`` becomes one copy per sub-loss (PML's
    #: ``MultipleReducers``), read back with ``reducer.for_sub_loss(name)``.
    sub_loss_names: tuple[str, ...] = ("loss",)

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
        reducer = get_reducer(reduction if reducer is None else reducer, name, self.reductions, self.reduces_terms)
        self.reducer = per_sub_loss(reducer, self.sub_loss_names) if len(self.sub_loss_names) > 1 else reducer
        self.reduction = self.reducer.for_sub_loss(self.sub_loss_names[0]).name
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
        keyword sources of pairs (``pairs=`` selection, ``weights=``, ``pos_mask=``); every one of them
        may be on another device than ``embeddings`` (moved there first, as PML does)."""
        if isinstance(embeddings, torch.Tensor):
            indices_tuple, ref_emb, ref_labels, pairs, weights, pos_mask, labels = to_device(
                (indices_tuple, ref_emb, ref_labels, pairs, weights, pos_mask, labels), embeddings.device)
            self.follow_embeddings_(embeddings)
        if indices_tuple is not None:
            if pairs is not None:
                raise InvalidParameterError(f"{type(self).__name__} got both indices_tuple and pairs; pass one.")
            num_refs = embeddings.shape[0] if ref_emb is None else ref_emb.shape[0]
            pairs = selection_from_indices_tuple(indices_tuple, embeddings.shape[0], num_refs)
        batch = self._prepare(embeddings, labels, pairs, weights, ref_emb, ref_labels, pos_mask)
        with autocast_off(embeddings.device.type):
            loss = self.compute_pair_loss(batch)
        return self.add_regularization(loss, embeddings)

    def compute_pair_loss(self, batch: PairBatch) -> torch.Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    def reduce(
        self,
        sub_loss: str,
        terms: torch.Tensor,
        mask: torch.Tensor | None,
        batch: PairBatch,
        kind: str,
        indices: tuple | None = None,
    ) -> torch.Tensor:
        """Hand the terms of ``sub_loss`` (``[B, R]`` pair terms with their ``mask``, or ``[T]``
        terms with ``indices``) and the batch's labels and embeddings to that sub-loss's reducer."""
        reducer = self.reducer.for_sub_loss(sub_loss)
        return reducer(terms, mask, kind=kind, indices=indices, labels=batch.labels, embeddings=batch.embeddings)

    def reduces_from_counts(self) -> bool:
        """Whether every sub-loss's reducer divides a sum by a count (the closed-form paths) and
        records no statistics (a reducer with ``collect_stats`` sees the terms)."""
        reducers = [self.reducer.for_sub_loss(n) for n in self.sub_loss_names]
        return all(getattr(r, "reduces_from_counts", False) and not getattr(r, "collect_stats", False) for r in reducers)

    # -- input handling -------------------------------------------------------------------
    def _prepare(self, embeddings, labels, pairs, weights, ref_emb, ref_labels, pos_mask) -> PairBatch:
        name = type(self).__name__
        if isinstance(embeddings, torch.Tensor) and (ref_emb is None or isinstance(ref_emb, torch.Tensor)):
            self.distance.check_shapes(embeddings, ref_emb)  # PML: the distance decides the shapes
        check_embeddings_labels(embeddings, None, ndim=None)
        num = embeddings.shape[0]
        if labels is not None:
            _check_label_tensor(labels, num, "labels", "embeddings")
        if ref_emb is embeddings and ref_labels is None and pairs is not None:
            # Explicit pairs against the batch itself: the same-set route gives the same pairs
            # with the same rounding as ref_emb=None (PML's losses agree exactly between the two).
            ref_emb = None
        same_set = ref_emb is None
        if ref_emb is None:
            if ref_labels is not None:
                raise InvalidParameterError(f"{name} got ref_labels without ref_emb.")
            references, ref_labels = embeddings, labels
        else:
            if not self.supports_references:
                raise InvalidParameterError(f"{name} does not support ref_emb (it is defined within the batch only).")
            check_embeddings_labels(ref_emb, None, name="ref_emb", ndim=None)
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
            input_dtype=embeddings.dtype,
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
