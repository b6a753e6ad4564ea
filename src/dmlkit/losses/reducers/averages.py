"""Reducers that average or add the terms: mean, mean of the non-zero, sum, thresholded mean,
sum over a divisor the loss gives, and a class-weighted mean (PML's reducers of those names)."""

from __future__ import annotations

import torch

from dmlkit.exceptions import DataError, InvalidParameterError
from dmlkit.losses.reducers.base import BaseReducer, SelectedTerms


def _masked_sum(terms: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    return terms.sum() if mask is None else torch.where(mask, terms, terms.new_zeros(())).sum()


class _CountReducer(BaseReducer):
    """``sum(selected terms) / count``: reduced from the mask on dmlkit's path (no indexing)."""

    reduces_from_counts = True

    def reduce_terms(self, terms, mask=None, **context):
        if mask is None:
            mask = torch.ones_like(terms, dtype=torch.bool)
        return _masked_sum(terms, mask) / self.count(terms, mask).clamp_min(1).to(terms.dtype)

    def count(self, terms: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:  # pragma: no cover - interface
        raise NotImplementedError


class MeanReducer(_CountReducer):
    """Average over every selected term (PML's ``MeanReducer``)."""

    name = "mean"

    def reduce_terms(self, terms, mask=None, **context):
        if mask is None:  # every term: their sum over their number (no mask built, two operators)
            return terms.sum() / max(terms.numel(), 1)
        return super().reduce_terms(terms, mask, **context)

    def count(self, terms, mask):
        return mask.sum()

    def divisor(self, num_selected, num_nonzero):
        return num_selected

    def reduce_selected(self, selected: SelectedTerms):
        losses = selected.losses
        return losses.mean() if losses.numel() else selected.zero()


class SumReducer(_CountReducer):
    """Plain sum of the selected terms (PML's ``SumReducer``)."""

    name = "sum"

    def reduce_terms(self, terms, mask=None, **context):
        return _masked_sum(terms, mask)

    def divisor(self, num_selected, num_nonzero):
        return num_selected * 0 + 1  # 1, as the counts' type (int or tensor)

    def reduce_selected(self, selected: SelectedTerms):
        return selected.losses.sum()


class ThresholdReducer(BaseReducer):
    """Average over the selected terms with ``low < term < high`` (PML's ``ThresholdReducer``).

    None of the terms in range gives a 0 on the graph. With ``collect_stats`` it records
    ``num_past_filter``, ``num_above_low`` and ``num_below_high``.
    """

    name = "threshold"
    stats = ("losses_size", "num_past_filter", "num_above_low", "num_below_high")

    def __init__(self, low: float | None = None, high: float | None = None, collect_stats: bool | None = None):
        super().__init__(collect_stats=collect_stats)
        owner = type(self).__name__
        if low is None and high is None:
            raise InvalidParameterError(f"{owner} needs 'low', 'high' or both. Got neither.")
        for key, value in (("low", low), ("high", high)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise InvalidParameterError(
                    f"The '{key}' parameter of {owner} must be a float or None. Got {value!r} instead."
                )
        self.low = None if low is None else float(low)
        self.high = None if high is None else float(high)

    def _in_range(self, terms: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        above = terms > self.low if self.low is not None else None
        below = terms < self.high if self.high is not None else None
        return above, below

    def _record(self, kept: torch.Tensor, above, below) -> None:
        if self.collect_stats:
            self.num_past_filter = int(kept.sum())
            self.num_above_low = int(above.sum()) if above is not None else 0
            self.num_below_high = int(below.sum()) if below is not None else 0

    def reduce_terms(self, terms, mask=None, **context):
        keep = torch.ones_like(terms, dtype=torch.bool) if mask is None else mask
        above, below = self._in_range(terms)
        for condition in (above, below):
            if condition is not None:
                keep = keep & condition
        self._record(keep, above, below)
        return _masked_sum(terms, keep) / keep.sum().clamp_min(1).to(terms.dtype)

    def reduce_selected(self, selected: SelectedTerms):
        losses = selected.losses
        above, below = self._in_range(losses)
        keep = torch.ones_like(losses, dtype=torch.bool)
        for condition in (above, below):
            if condition is not None:
                keep = keep & condition
        self._record(keep, above, below)
        kept = losses[keep]
        return kept.mean() if kept.numel() else selected.zero()

    def extra_repr(self) -> str:
        return f"low={self.low}, high={self.high}"


class AvgNonZeroReducer(ThresholdReducer):
    """Average over the selected terms that are > 0 (PML's ``AvgNonZeroReducer``: ``ThresholdReducer(low=0)``)."""

    name = "mean_nonzero"
    reduces_from_counts = True

    def __init__(self, collect_stats: bool | None = None):
        super().__init__(low=0, collect_stats=collect_stats)

    def divisor(self, num_selected, num_nonzero):
        return num_nonzero

    def extra_repr(self) -> str:
        return ""


class DivisorReducer(BaseReducer):
    """``sum(terms) / divisor``, the divisor coming with the terms (PML's ``DivisorReducer``).

    PML's losses that use it put ``"divisor"`` in their loss dict; a divisor of 0 gives a 0 on
    the graph. A dmlkit loss that gives no divisor gets the plain sum (divisor 1). The last
    divisor seen is recorded as ``divisor_value`` with ``collect_stats`` (PML: the stat ``divisor``,
    a name dmlkit's reducers use for the count rule).
    """

    name = "divisor"
    reduces_from_counts = True
    stats = ("losses_size", "divisor_value")

    def __init__(self, collect_stats: bool | None = None):
        super().__init__(collect_stats=collect_stats)

    def reduce_entry(self, entry, embeddings, labels):
        if entry["reduction_type"] != "already_reduced" and "divisor" not in entry:
            raise DataError("DivisorReducer needs a 'divisor' in the loss dict (next to 'losses'). Got none.")
        return super().reduce_entry(entry, embeddings, labels)

    def reduce_terms(self, terms, mask=None, *, divisor=None, **context):
        total = _masked_sum(terms, mask)
        return total if divisor is None else self._divide(total, divisor, lambda: (terms * 0).sum())

    def reduce_selected(self, selected: SelectedTerms):
        divisor = 1 if selected.divisor is None else selected.divisor
        return self._divide(selected.losses.sum(), divisor, selected.zero)

    def _divide(self, total: torch.Tensor, divisor, zero) -> torch.Tensor:
        if self.collect_stats:
            self.divisor_value = divisor
        if divisor == 0:
            return zero()
        if total.dtype == torch.float16:
            return (total.float() / divisor).half()  # a half sum can overflow where the mean does not
        return total / divisor

    def divisor(self, num_selected, num_nonzero):
        return num_selected * 0 + 1


class ClassWeightedReducer(BaseReducer):
    """``mean_t(w[y_anchor(t)] * term_t)``: each term weighted by its anchor's class (PML's ``ClassWeightedReducer``).

    ``weights [C]`` holds one weight per class; a pair's or triplet's anchor is its first index.
    """

    name = "class_weighted"

    def __init__(self, weights: torch.Tensor, collect_stats: bool | None = None):
        super().__init__(collect_stats=collect_stats)
        self.weights = torch.as_tensor(weights)

    def reduce_selected(self, selected: SelectedTerms):
        if selected.labels is None:
            raise DataError("ClassWeightedReducer needs the batch's labels to weight each term by its class. Got None.")
        losses = selected.losses
        if not losses.numel():
            return selected.zero()
        weights = self.weights.to(device=losses.device, dtype=losses.dtype)
        anchors = selected.anchors.to(selected.labels.device)
        return (losses * weights[selected.labels[anchors].to(losses.device)]).mean()

    def extra_repr(self) -> str:
        return f"weights={self.weights.tolist()}"
