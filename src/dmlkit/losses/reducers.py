"""Reducers: how a loss turns its selected per-pair (per-triplet, per-sample) terms into a scalar.

Every loss takes one spelling, ``reduction=`` (a name below) or, as in pytorch-metric-learning,
``reducer=`` (a reducer object, dmlkit's or PML's). A reducer is called as
``reducer(terms, mask) -> scalar`` where ``mask`` selects the terms that exist (the pairs or
triplets the batch actually has); a batch with nothing selected reduces to a 0 that stays on the
autograd graph.

========================  ==============  ==========================================
name (``reduction=``)     class           scalar
========================  ==============  ==========================================
``"mean"``                MeanReducer     sum of the selected terms / their number
``"mean_nonzero"``        AvgNonZeroReducer  sum / number of selected terms > 0
``"sum"``                 SumReducer      plain sum
(object only)             ThresholdReducer   mean of the selected terms in ``(low, high)``
========================  ==============  ==========================================
"""

from __future__ import annotations

import torch

from dmlkit.exceptions import InvalidParameterError


class BaseReducer:
    """``reducer(terms, mask) -> scalar``: reduce the ``terms`` where ``mask`` is True."""

    #: The ``reduction=`` name of this rule.
    name: str = ""

    def __call__(self, terms: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if mask is None:
            mask = torch.ones_like(terms, dtype=torch.bool)
        total = torch.where(mask, terms, terms.new_zeros(())).sum()
        return total / self.count(terms, mask).clamp_min(1).to(terms.dtype)

    def count(self, terms: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    def divisor(self, num_selected, num_nonzero):
        """What the sum of the terms is divided by, from counts a loss already has (its analytic paths)."""
        raise TypeError(f"{type(self).__name__} needs the terms themselves; this loss reduces from counts.")

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and vars(other) == vars(self)

    def __hash__(self) -> int:
        return hash(type(self))


class MeanReducer(BaseReducer):
    """Average over every selected term (PML's ``MeanReducer``)."""

    name = "mean"

    def count(self, terms: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return mask.sum()

    def divisor(self, num_selected, num_nonzero):
        return num_selected


class AvgNonZeroReducer(BaseReducer):
    """Average over the selected terms that are > 0 (PML's ``AvgNonZeroReducer``)."""

    name = "mean_nonzero"

    def count(self, terms: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return (mask & (terms > 0)).sum()

    def divisor(self, num_selected, num_nonzero):
        return num_nonzero


class SumReducer(BaseReducer):
    """Plain sum of the selected terms (PML's ``SumReducer``)."""

    name = "sum"

    def __call__(self, terms: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if mask is None:
            return terms.sum()
        return torch.where(mask, terms, terms.new_zeros(())).sum()

    def divisor(self, num_selected, num_nonzero):
        return num_selected * 0 + 1  # 1, as the counts' type (int or tensor)


class ThresholdReducer(BaseReducer):
    """Average over the selected terms with ``low < term < high`` (PML's ``ThresholdReducer``)."""

    name = "threshold"

    def __init__(self, low: float | None = None, high: float | None = None):
        if low is None and high is None:
            raise InvalidParameterError("ThresholdReducer needs 'low', 'high' or both. Got neither.")
        for key, value in (("low", low), ("high", high)):
            if value is not None and not isinstance(value, (int, float)):
                raise InvalidParameterError(
                    f"The '{key}' parameter of ThresholdReducer must be a float or None. Got {value!r} instead."
                )
        self.low = None if low is None else float(low)
        self.high = None if high is None else float(high)

    def __call__(self, terms: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        keep = torch.ones_like(terms, dtype=torch.bool) if mask is None else mask
        if self.low is not None:
            keep = keep & (terms > self.low)
        if self.high is not None:
            keep = keep & (terms < self.high)
        return MeanReducer()(terms, keep)

    def __repr__(self) -> str:
        return f"ThresholdReducer(low={self.low}, high={self.high})"


REDUCTIONS: dict[str, type[BaseReducer]] = {
    "mean": MeanReducer,
    "mean_nonzero": AvgNonZeroReducer,
    "sum": SumReducer,
}

#: pytorch-metric-learning reducer class name -> dmlkit reducer (built from the PML object).
_PML_REDUCERS = {
    "MeanReducer": lambda r: MeanReducer(),
    "AvgNonZeroReducer": lambda r: AvgNonZeroReducer(),
    "SumReducer": lambda r: SumReducer(),
    "ThresholdReducer": lambda r: ThresholdReducer(getattr(r, "low", None), getattr(r, "high", None)),
}


def get_reducer(reduction: str | BaseReducer | object, owner: str, allowed: tuple[str, ...]) -> BaseReducer:
    """The reducer for a ``reduction`` name or a reducer object (dmlkit's or PML's).

    ``allowed`` lists the rules ``owner`` implements; anything else is refused with a message
    naming the loss, the value and the choices.
    """
    if isinstance(reduction, str):
        reducer = REDUCTIONS[reduction]() if reduction in REDUCTIONS else None
    elif isinstance(reduction, BaseReducer):
        reducer = reduction
    elif type(reduction).__module__.startswith("pytorch_metric_learning") and type(reduction).__name__ in _PML_REDUCERS:
        reducer = _PML_REDUCERS[type(reduction).__name__](reduction)
    else:
        reducer = None
    if reducer is None or reducer.name not in allowed:
        raise InvalidParameterError(
            f"The 'reduction' parameter of {owner} must be one of {list(allowed)} (or the matching "
            f"reducer object: {', '.join(_names(allowed))}). Got {reduction!r} instead."
        )
    return reducer


def _names(allowed: tuple[str, ...]) -> list[str]:
    classes = {**{k: v.__name__ for k, v in REDUCTIONS.items()}, "threshold": "ThresholdReducer"}
    return [classes[a] for a in allowed if a in classes]
