"""A k-nearest-neighbour classifier over an index: distance-weighted vote, confidence, and "unknown".

Each of a query's ``k`` nearest gallery items whose cosine score reaches the threshold votes for its
label with weight ``1 / (d + eps)``, ``d = 1 - score`` the cosine distance (Dudani 1976; scikit-learn's
``KNeighborsClassifier(weights="distance")``). The label with the largest total weight wins (a tie
goes to the label of the nearer neighbour); its confidence is its share of the votes cast. A query
none of whose neighbours reaches the threshold is *unknown* (label ``None``): with the threshold
chosen at a false match rate on the gallery's pairs (:meth:`Index.set_threshold_at_fmr`), a query of
a class the gallery lacks is accepted about as often as an impostor pair matches, once per neighbour.
A query whose nearest item is unlabelled (added without a label) and reaches the threshold is not
unknown: it matches a gallery item that has no label, and is reported as such.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

#: Added to the cosine distance before inverting it, so an exact duplicate (distance 0) has a finite weight.
DISTANCE_EPS = 1e-6


@dataclass
class Classification:
    """Per query ``[Q]``: ``labels`` (``None``: no labelled neighbour voted), ``confidence`` (the winner's share
    of the vote weight, 0 without a label), ``nearest_score`` (cosine score of the nearest item),
    ``nearest_unlabelled`` (the nearest item has no label and reaches the threshold) and the ``threshold``
    used (None: none)."""

    labels: list[str | None]
    confidence: np.ndarray
    nearest_score: np.ndarray
    threshold: float | None
    nearest_unlabelled: np.ndarray | None = None

    def __post_init__(self):
        if self.nearest_unlabelled is None:
            self.nearest_unlabelled = np.zeros(len(self.labels), dtype=bool)

    @property
    def unknown(self) -> np.ndarray:
        """``[Q]`` bool: no labelled neighbour voted and the nearest item is no unlabelled match either."""
        return np.array([label is None for label in self.labels], dtype=bool) & ~self.nearest_unlabelled

    def records(self, names: Sequence[str]) -> list[dict[str, Any]]:
        """One JSON-ready dict per query: ``{query, label, unknown, confidence, nearest_score, nearest_unlabelled}``."""
        unknown = self.unknown
        return [{"query": str(name), "label": label, "unknown": bool(unknown[q]), "confidence": float(conf),
                 "nearest_score": float(score), "nearest_unlabelled": bool(self.nearest_unlabelled[q])}
                for q, (name, label, conf, score) in enumerate(zip(names, self.labels, self.confidence,
                                                                    self.nearest_score))]


def vote(scores: np.ndarray, codes: np.ndarray, names: Sequence[str], threshold: float | None) -> Classification:
    """Distance-weighted vote of neighbours ``scores [Q, k]`` (cosine, best first; -inf: none) with label
    ``codes [Q, k]`` (indices into ``names``; -1: unlabelled or none); neighbours below ``threshold`` do not vote."""
    scores = np.asarray(scores, dtype=np.float64)
    weights = 1.0 / (np.maximum(1.0 - scores, 0.0) + DISTANCE_EPS)
    voting = codes >= 0
    if threshold is not None:
        voting &= scores >= threshold
    weights = np.where(voting, weights, 0.0)
    same = (codes[:, :, None] == codes[:, None, :]) & voting[:, None, :]  # [Q, k, k]: neighbour j shares i's label
    totals = np.where(voting, (same * weights[:, None, :]).sum(-1), -1.0)  # each neighbour's label's total
    winner = totals.argmax(1)  # first (nearest) position among equal totals
    rows = np.arange(len(codes))
    cast = weights.sum(1)
    known = voting.any(1)
    confidence = np.where(known, totals[rows, winner] / np.where(known, cast, 1.0), 0.0)
    labels = [names[codes[q, winner[q]]] if known[q] else None for q in range(len(codes))]
    nearest = scores[:, 0] if scores.shape[1] else np.full(len(codes), -np.inf)
    # an item found (finite score) without a code is unlabelled; it counts as a match where it reaches the threshold
    unlabelled = (codes[:, 0] < 0) & np.isfinite(nearest) if scores.shape[1] else np.zeros(len(codes), dtype=bool)
    if threshold is not None:
        unlabelled &= nearest >= threshold
    return Classification(labels, confidence, nearest, threshold, unlabelled)
