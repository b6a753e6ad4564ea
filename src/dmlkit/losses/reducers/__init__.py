"""Reducers: how a loss turns its selected per-pair (per-triplet, per-sample) terms into a scalar.

Every loss takes one spelling, ``reduction=`` (a name below) or, as in pytorch-metric-learning,
``reducer=`` (a reducer object, dmlkit's or PML's). Each reducer answers both dmlkit's call
``reducer(terms, mask, ...)`` and PML's ``reducer(loss_dict, embeddings, labels)``
(:mod:`dmlkit.losses.reducers.base`); a batch with nothing selected reduces to a 0 that stays on
the autograd graph.

========================  ========================  ==========================================
name (``reduction=``)     class                     scalar
========================  ========================  ==========================================
``"mean"``                MeanReducer               sum of the selected terms / their number
``"mean_nonzero"``        AvgNonZeroReducer         sum / number of selected terms > 0
``"sum"``                 SumReducer                plain sum
(object only)             ThresholdReducer          mean of the selected terms in ``(low, high)``
(object only)             DivisorReducer            sum / the divisor given with the terms
(object only)             ClassWeightedReducer      mean of ``weights[class of anchor] * term``
(object only)             PerAnchorReducer          each anchor's mean, then an inner reducer
(object only)             MultipleReducers          one reducer per sub-loss, added
(object only)             DoNothingReducer          the terms, unreduced (a loss dict)
========================  ========================  ==========================================

The first three (and ``DivisorReducer``) reduce from counts, so every loss takes them on its
fastest path; the others need the terms themselves and are taken by the losses that can hand
their terms over (``PairLoss.reduces_terms``).
"""

from __future__ import annotations

from dmlkit.exceptions import InvalidParameterError
from dmlkit.losses.reducers.averages import (
    AvgNonZeroReducer,
    ClassWeightedReducer,
    DivisorReducer,
    MeanReducer,
    SumReducer,
    ThresholdReducer,
)
from dmlkit.losses.reducers.base import BaseReducer, SelectedTerms
from dmlkit.losses.reducers.composite import (
    DoNothingReducer,
    MultipleReducers,
    PerAnchorReducer,
    PMLReducer,
    average_per_row,
    per_sub_loss,
)

REDUCTIONS: dict[str, type[BaseReducer]] = {
    "mean": MeanReducer,
    "mean_nonzero": AvgNonZeroReducer,
    "sum": SumReducer,
}

#: pytorch-metric-learning reducer class name -> dmlkit reducer with the same settings.
_PML_REDUCERS = {
    "MeanReducer": lambda r: MeanReducer(),
    "AvgNonZeroReducer": lambda r: AvgNonZeroReducer(),
    "SumReducer": lambda r: SumReducer(),
    "DivisorReducer": lambda r: DivisorReducer(),
    "ThresholdReducer": lambda r: ThresholdReducer(getattr(r, "low", None), getattr(r, "high", None)),
    "MultipleReducers": lambda r: MultipleReducers(
        {k: from_pml(v) for k, v in r.reducers.items()}, from_pml(r.default_reducer)
    ),
}


def from_pml(reducer: object) -> BaseReducer:
    """dmlkit's reducer for a PML reducer object: the same rule where dmlkit has it, else PML's object wrapped."""
    if isinstance(reducer, BaseReducer):
        return reducer
    if type(reducer).__name__ in _PML_REDUCERS:
        return _PML_REDUCERS[type(reducer).__name__](reducer)
    return PMLReducer(reducer)


def _is_pml(reducer: object) -> bool:
    return type(reducer).__module__.startswith("pytorch_metric_learning") and hasattr(reducer, "forward")


def get_reducer(
    reduction: str | BaseReducer | object, owner: str, allowed: tuple[str, ...], reduces_terms: bool = False
) -> BaseReducer:
    """The reducer for a ``reduction`` name or a reducer object (dmlkit's or PML's).

    ``allowed`` lists the rules ``owner`` implements from counts; a loss that can hand over its
    terms (``reduces_terms``) takes any reducer object. Anything else is refused with a message
    naming the loss, the value and the choices.
    """
    if isinstance(reduction, str):
        reducer = REDUCTIONS[reduction]() if reduction in REDUCTIONS else None
    elif isinstance(reduction, BaseReducer):
        reducer = reduction
    elif _is_pml(reduction):
        reducer = from_pml(reduction)
    else:
        reducer = None
    if reducer is None or not all(_accepted(leaf, allowed, reduces_terms) for leaf in reducer.leaves()):
        raise InvalidParameterError(
            f"The 'reduction' parameter of {owner} must be one of {list(allowed)} (or the matching "
            f"reducer object: {', '.join(_names(allowed))}"
            f"{'; or any reducer object' if reduces_terms else ''}). Got {reduction!r} instead."
        )
    return reducer


def _accepted(leaf: object, allowed: tuple[str, ...], reduces_terms: bool) -> bool:
    if reduces_terms:
        return True
    return getattr(leaf, "name", None) in allowed


def _names(allowed: tuple[str, ...]) -> list[str]:
    classes = {**{k: v.__name__ for k, v in REDUCTIONS.items()}, "threshold": "ThresholdReducer"}
    return [classes[a] for a in allowed if a in classes]


__all__ = [
    "AvgNonZeroReducer",
    "BaseReducer",
    "ClassWeightedReducer",
    "DivisorReducer",
    "DoNothingReducer",
    "MeanReducer",
    "MultipleReducers",
    "PerAnchorReducer",
    "PMLReducer",
    "REDUCTIONS",
    "SelectedTerms",
    "SumReducer",
    "ThresholdReducer",
    "average_per_row",
    "from_pml",
    "get_reducer",
    "per_sub_loss",
]
