"""The reducer protocol: one object, two calls (dmlkit's losses and pytorch-metric-learning's).

* ``reducer(terms, mask=None, *, kind="element", indices=None, labels=None, embeddings=None,
  divisor=None)``: what dmlkit's losses call. ``terms`` is a ``[B, R]`` matrix of pair terms
  (``mask`` selects the pairs that exist; a pair's anchor is its row) or a ``[T]`` vector of
  per-element or per-triplet terms (``indices`` names each term's batch rows: ``[T]`` for
  elements, ``(anchors, others)`` for pairs, ``(anchors, positives, negatives)`` for triplets).
  ``labels [B]`` and ``embeddings [B, D]`` are the batch's, for reducers that read them.
* ``reducer(loss_dict, embeddings, labels)``: PML's call. ``loss_dict`` maps sub-loss names to
  ``{"losses": t, "indices": ..., "reduction_type": "element" | "pos_pair" | "neg_pair" |
  "triplet" | "already_reduced"}`` (``"divisor"`` for :class:`DivisorReducer`); each entry is
  reduced and the sub-losses are added. A sub-loss given as the number 0 (PML's "nothing to
  learn") reduces to ``sum(embeddings * 0)``, a 0 that stays on the autograd graph.

Both calls end in :meth:`BaseReducer.reduce_selected`, which sees the selected terms with their
indices (:class:`SelectedTerms`). A reducer that only divides the sum of the terms by a count
(``reduces_from_counts``) also answers :meth:`BaseReducer.divisor`, so a loss with a closed-form
gradient can reduce from counts without materialising its terms; a loss holding any other
reducer hands its terms over instead (it asks the reducer, never tests its type).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from dmlkit.core.devices import to_device
from dmlkit.core.records import init_stats
from dmlkit.exceptions import DataError

#: PML's ``reduction_type`` values.
KINDS = ("element", "pos_pair", "neg_pair", "triplet", "already_reduced")


@dataclass
class SelectedTerms:
    """The selected terms ``losses [T]`` of one sub-loss, with their batch indices and context."""

    losses: torch.Tensor
    kind: str
    indices: torch.Tensor | tuple | None
    labels: torch.Tensor | None = None
    embeddings: torch.Tensor | None = None
    divisor: object | None = None
    #: Rows of the batch (anchors), when known without ``embeddings``.
    num_anchors: int | None = None

    @property
    def anchors(self) -> torch.Tensor:
        """The batch row each term belongs to: the element itself, or the pair's/triplet's anchor."""
        return self.indices if self.kind == "element" else self.indices[0]

    @property
    def batch_size(self) -> int:
        if self.embeddings is not None:
            return self.embeddings.shape[0]
        if self.num_anchors is not None:
            return self.num_anchors
        anchors = self.anchors
        return int(anchors.max()) + 1 if anchors.numel() else 0

    def zero(self) -> torch.Tensor:
        """A 0 on the autograd graph: ``sum(embeddings * 0)`` (PML's zero loss), else from the terms."""
        source = self.embeddings if self.embeddings is not None else self.losses
        return (source * 0).sum()

    def as_loss_dict(self, name: str = "loss") -> dict:
        """PML's loss dict for these terms."""
        entry = {"losses": self.losses, "indices": self.indices, "reduction_type": self.kind}
        if self.divisor is not None:
            entry["divisor"] = self.divisor
        return {name: entry}


def select_terms(
    terms: torch.Tensor, mask: torch.Tensor | None, kind: str, indices: torch.Tensor | tuple | None
) -> tuple[torch.Tensor, str, torch.Tensor | tuple]:
    """``(losses [T], kind, indices)`` for the internal call: a ``[B, R]`` matrix becomes its
    selected pairs ``(rows, cols)``; a ``[T]`` vector keeps the entries ``mask`` selects."""
    if terms.dim() == 2:
        if mask is None:
            mask = torch.ones_like(terms, dtype=torch.bool)
        rows, cols = mask.nonzero(as_tuple=True)
        return terms[rows, cols], (kind if kind != "element" else "pos_pair"), (rows, cols)
    if indices is None:
        indices = torch.arange(terms.shape[0], device=terms.device)
    if mask is None:
        return terms, kind, indices
    if isinstance(indices, (tuple, list)):
        return terms[mask], kind, tuple(i[mask] for i in indices)
    return terms[mask], kind, indices[mask]


def check_sizes(losses: object, indices: object, kind: str) -> None:
    """PML's loss-dict contract: one index tensor per element, two per pair, three per triplet."""
    if kind not in KINDS:
        raise DataError(f"reduction_type must be one of {list(KINDS)}. Got {kind!r} instead.")
    if kind == "already_reduced":
        if torch.is_tensor(losses) and losses.numel() != 1:
            raise DataError(f"an 'already_reduced' loss must hold one value. Got shape {tuple(losses.shape)}.")
        return
    expected = {"element": 1, "pos_pair": 2, "neg_pair": 2, "triplet": 3}[kind]
    parts = [indices] if kind == "element" else list(indices) if isinstance(indices, (tuple, list)) else None
    if not torch.is_tensor(losses) or parts is None or len(parts) != expected or any(
        not torch.is_tensor(p) or p.shape[0] != losses.shape[0] for p in parts
    ):
        raise DataError(
            f"a {kind!r} loss needs losses [T] and {expected} index tensor(s) of length T. "
            f"Got losses {getattr(losses, 'shape', losses)!r} and indices {indices!r}."
        )


class BaseReducer(torch.nn.Module):
    """Reduces a loss's selected terms to a scalar; called as dmlkit's losses or as PML's call it."""

    #: The ``reduction=`` name of this rule ("" for object-only reducers).
    name: str = ""
    #: Whether the rule is ``sum(terms) / divisor(counts)`` (see :meth:`divisor`).
    reduces_from_counts: bool = False

    #: Statistics recorded with ``collect_stats`` (PML's names).
    stats: tuple[str, ...] = ("losses_size",)

    def __init__(self, collect_stats: bool | None = None):
        super().__init__()
        init_stats(self, collect_stats, self.stats)

    # -- the two calls ------------------------------------------------------------------------
    def forward(self, terms, *args, **kwargs):
        if isinstance(terms, Mapping):
            return self.reduce_loss_dict(terms, *args, **kwargs)
        if isinstance(terms, torch.Tensor):  # masks, indices and labels follow the terms (PML's contract)
            args, kwargs = to_device((args, kwargs), terms.device)
        return self.reduce_terms(terms, *args, **kwargs)

    def reduce_loss_dict(self, loss_dict: Mapping, embeddings: torch.Tensor | None, labels: torch.Tensor | None):
        """PML's call: each sub-loss reduced, the results added."""
        total = None
        for entry in loss_dict.values():
            value = self.reduce_entry(entry, embeddings, labels)
            total = value if total is None else total + value
        return total

    def reduce_entry(self, entry: Mapping, embeddings: torch.Tensor | None, labels: torch.Tensor | None):
        """One sub-loss of PML's loss dict."""
        losses, indices, kind = entry["losses"], entry["indices"], entry["reduction_type"]
        if self.collect_stats:
            self.losses_size = 1 if not torch.is_tensor(losses) or losses.dim() == 0 else len(losses)
        if not torch.is_tensor(losses) and losses == 0:
            return (embeddings * 0).sum()
        check_sizes(losses, indices, kind)
        if kind == "already_reduced":
            return losses
        indices, labels = to_device((indices, labels), losses.device)
        selected = SelectedTerms(losses, kind, indices, labels, embeddings, entry.get("divisor"))
        return self.reduce_selected(selected)

    def reduce_terms(
        self,
        terms: torch.Tensor,
        mask: torch.Tensor | None = None,
        *,
        kind: str = "element",
        indices: torch.Tensor | tuple | None = None,
        labels: torch.Tensor | None = None,
        embeddings: torch.Tensor | None = None,
        divisor: object | None = None,
    ):
        """dmlkit's call (see the module docstring); the default selects the terms and reduces them."""
        losses, kind, indices = select_terms(terms, mask, kind, indices)
        num_anchors = terms.shape[0] if terms.dim() == 2 else None
        return self.reduce_selected(SelectedTerms(losses, kind, indices, labels, embeddings, divisor, num_anchors))

    # -- what a rule defines --------------------------------------------------------------------
    def reduce_selected(self, selected: SelectedTerms):  # pragma: no cover - interface
        raise NotImplementedError

    def divisor(self, num_selected, num_nonzero):
        """What the sum of the terms is divided by, from counts a loss already has (its analytic paths)."""
        raise TypeError(f"{type(self).__name__} needs the terms themselves; this loss reduces from counts.")

    # -- composition ------------------------------------------------------------------------------
    def leaves(self) -> list[BaseReducer]:
        """The rules this reducer applies (itself; a composite its parts)."""
        return [self]

    def for_sub_loss(self, name: str) -> BaseReducer:
        """The reducer of the sub-loss ``name`` (itself; :class:`MultipleReducers` looks it up)."""
        return self

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and repr(other) == repr(self)

    def __hash__(self) -> int:
        return hash(type(self))
