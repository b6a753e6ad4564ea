"""Reducers built from other reducers: one per sub-loss, per-anchor averaging, none at all, and a
wrapper that lets any pytorch-metric-learning reducer object reduce a dmlkit loss's terms."""

from __future__ import annotations

import copy
from typing import Callable, Mapping

import torch

from dmlkit.losses.reducers.averages import MeanReducer
from dmlkit.losses.reducers.base import BaseReducer, SelectedTerms


class DoNothingReducer(BaseReducer):
    """Returns the loss dict unreduced (PML's ``DoNothingReducer``); a dmlkit loss returns its selected terms as one."""

    name = "do_nothing"

    def reduce_loss_dict(self, loss_dict, embeddings, labels):
        return loss_dict

    def reduce_selected(self, selected: SelectedTerms):
        return selected.as_loss_dict()


class MultipleReducers(BaseReducer):
    """One reducer per sub-loss name, the results added (PML's ``MultipleReducers``).

    ``reducers`` maps sub-loss names (``"pos_loss"``, ``"neg_loss"``, ...) to reducers; the
    others use ``default_reducer`` (a :class:`MeanReducer` if None).
    """

    name = "multiple"

    def __init__(self, reducers: Mapping[str, torch.nn.Module], default_reducer: torch.nn.Module | None = None,
                 collect_stats: bool | None = None):
        super().__init__(collect_stats=collect_stats)
        self.reducers = torch.nn.ModuleDict(dict(reducers))
        self.default_reducer = MeanReducer() if default_reducer is None else default_reducer

    def for_sub_loss(self, name: str) -> BaseReducer:
        return self.reducers[name] if name in self.reducers else self.default_reducer

    def reduce_loss_dict(self, loss_dict, embeddings, labels):
        total = None
        for name, entry in loss_dict.items():
            value = self.for_sub_loss(name)({name: entry}, embeddings, labels)
            total = value if total is None else total + value
        return total

    def reduce_terms(self, terms, mask=None, **context):
        return self.default_reducer(terms, mask, **context)

    def reduce_selected(self, selected: SelectedTerms):
        return self.default_reducer(selected.as_loss_dict(), _embeddings_for(selected), selected.labels)

    def leaves(self) -> list[BaseReducer]:
        parts = [*self.reducers.values(), self.default_reducer]
        return [leaf for part in parts for leaf in (part.leaves() if isinstance(part, BaseReducer) else [part])]



def per_sub_loss(reducer: BaseReducer, names: tuple[str, ...]) -> BaseReducer:
    """One copy of ``reducer`` per sub-loss (PML gives a loss with several sub-losses a
    ``MultipleReducers`` of copies); a :class:`MultipleReducers` is kept as given."""
    if isinstance(reducer, MultipleReducers):
        return reducer
    return MultipleReducers({name: copy.deepcopy(reducer) for name in names})


def average_per_row(matrix: torch.Tensor, num_per_row: torch.Tensor) -> torch.Tensor:
    """``sum_j matrix[i, j] / num_per_row[i]``, 0 for a row with no terms (PML's default aggregation)."""
    return torch.where(num_per_row > 0, matrix.sum(1) / num_per_row.clamp_min(1), matrix.new_zeros(()))


class PerAnchorReducer(BaseReducer):
    """Aggregates each anchor's pair terms, then reduces the per-anchor values (PML's ``PerAnchorReducer``).

    Pair terms are laid out as ``[B, R]`` (a repeated pair keeps its last term, as in PML) and
    ``aggregation_func(matrix, num_per_row) -> [B]`` (default: the mean of the row's terms, 0
    without terms) gives one value per anchor; ``reducer`` (default :class:`MeanReducer`) reduces
    those as elements. Element terms go straight to ``reducer``; triplets are not supported.
    """

    name = "per_anchor"

    def __init__(
        self,
        reducer: torch.nn.Module | None = None,
        aggregation_func: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = average_per_row,
        collect_stats: bool | None = None,
    ):
        super().__init__(collect_stats=collect_stats)
        self.reducer = MeanReducer() if reducer is None else reducer
        self.aggregation_func = aggregation_func

    def reduce_selected(self, selected: SelectedTerms):
        if selected.kind == "triplet":
            raise NotImplementedError("PerAnchorReducer does not reduce triplets (as in PML).")
        if selected.kind == "element":
            return self.reducer(selected.as_loss_dict(), _embeddings_for(selected), selected.labels)
        losses = selected.losses
        anchors, others = selected.indices
        rows = selected.batch_size
        cols = max(rows, int(others.max()) + 1 if others.numel() else 0)
        matrix = losses.new_zeros(rows, cols)
        present = torch.zeros(rows, cols, dtype=torch.bool, device=losses.device)
        matrix = matrix.index_put((anchors, others), losses)
        present[anchors, others] = True
        per_anchor = self.aggregation_func(matrix, present.sum(1))
        per_anchor_terms = SelectedTerms(
            per_anchor, "element", torch.arange(rows, device=losses.device), selected.labels, selected.embeddings
        )
        return self.reducer(per_anchor_terms.as_loss_dict(), _embeddings_for(per_anchor_terms), selected.labels)


class PMLReducer(BaseReducer):
    """Any pytorch-metric-learning reducer object reducing a dmlkit loss's terms through PML's call."""

    name = "pml"

    def __init__(self, reducer: torch.nn.Module):
        super().__init__()
        self.wrapped = reducer

    def reduce_selected(self, selected: SelectedTerms):
        return self.wrapped(selected.as_loss_dict(), _embeddings_for(selected), selected.labels)


def _embeddings_for(selected: SelectedTerms) -> torch.Tensor:
    """The batch's embeddings, or a ``[B, 1]`` stand-in on the terms' graph (what a reducer reads
    from them is the batch size and a zero on the graph)."""
    if selected.embeddings is not None:
        return selected.embeddings
    return (selected.losses.sum() * 0).expand(selected.batch_size, 1)
