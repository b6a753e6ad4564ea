"""Verification metrics: ROC AUC, equal error rate, FNMR at a fixed FMR, and the threshold that reaches it.

A verification system decides "same identity or not" for a pair of images by thresholding a
score. Here the score of a pair ``(i, j)`` is the cosine similarity of the L2-normalised
embeddings, over all distinct pairs ``i < j`` of one labelled set (validation classes, a test
split, or a labelled gallery). A pair is *genuine* when both labels are equal, *impostor*
otherwise, and it is a *match* at threshold ``t`` when ``score >= t`` (ISO/IEC 19795-1 terms):

* ``FMR(t)``  = impostor pairs with ``score >= t`` / impostor pairs (false match rate);
* ``FNMR(t)`` = genuine pairs with ``score < t`` / genuine pairs (false non-match rate).

Candidate thresholds are the distinct scores plus one value just above the largest score
(``math.nextafter(max, inf)``: nothing matches, FMR = 0, FNMR = 1). Ties are never split: every
pair whose score equals ``t`` is a match at ``t``, so tied pairs move together. Then

* ``threshold_at_fmr_<f>``: the smallest candidate ``t`` with ``FMR(t) <= f`` (the most
  permissive threshold that keeps the false match rate within ``f``); ``FMR`` is computed in
  float64 as ``count / impostors``;
* ``fnmr_at_fmr_<f>``: ``FNMR`` at that threshold;
* ``eer``: the smallest ``max(FMR(t), FNMR(t))`` over candidate thresholds, i.e. the lowest rate
  that both errors reach at one threshold (no interpolation between thresholds);
* ``roc_auc``: ``P(s_genuine > s_impostor) + P(s_genuine = s_impostor) / 2`` over all
  genuine x impostor pairs (Mann-Whitney U / (G * I), equal to ``sklearn.metrics.roc_auc_score``).

Metrics that need a genuine and an impostor pair are NaN when either set is empty.

Large sets: the all-pairs set has ``N (N - 1) / 2`` members. When that exceeds ``max_pairs`` the
pairs are sampled with a ``torch.Generator`` seeded by ``seed``: every genuine pair is kept when
they number at most ``max_pairs // 2`` (else ``max_pairs // 2`` genuine pairs are drawn uniformly,
with replacement), and the rest of the budget is filled with impostor pairs drawn uniformly with
replacement. FMR, FNMR and ROC AUC are conditional on the pair's kind, so this stratified sample
estimates them without bias. ``num_genuine_pairs`` / ``num_impostor_pairs`` report what was used.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F

from dmlkit.core.validation import Interval, check_embeddings_labels, validate_params
from dmlkit.evaluation._checks import check_finite
from dmlkit.exceptions import DataError, InvalidParameterError

#: The FMR operating points reported by :func:`verification_metrics` by default.
DEFAULT_FMRS: tuple[float, ...] = (1e-2, 1e-3)
#: Pairs scored exactly before sampling starts (about N = 3,160 samples; ~45 MB of scores and flags).
DEFAULT_MAX_PAIRS = 5_000_000
_CHUNK = 1 << 16  # pairs (or rows x columns) scored at a time
_GRAM_ROWS = 30_000  # up to this many samples, sampled pairs are read from blocks of the full product


def fmr_key(fmr: float) -> str:
    """``1e-3 -> "1e-3"``, ``0.005 -> "5e-3"``: the suffix of ``fnmr_at_fmr_*`` / ``threshold_at_fmr_*``."""
    mantissa, exponent = f"{fmr:e}".split("e")
    mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{int(exponent)}"


def verification_metrics(
    embeddings: torch.Tensor,
    labels: torch.Tensor,
    *,
    fmrs: Sequence[float] = DEFAULT_FMRS,
    max_pairs: int = DEFAULT_MAX_PAIRS,
    seed: int = 1234,
) -> dict[str, float | int]:
    """ROC AUC, EER, FNMR and threshold at each FMR in ``fmrs`` over the pairs of ``embeddings [N, D]``.

    Returns ``roc_auc, eer, fnmr_at_fmr_<f>, threshold_at_fmr_<f>`` (floats, see the module
    docstring for the exact definitions and tie rule) and ``num_genuine_pairs,
    num_impostor_pairs`` (ints).
    """
    fmrs = _check(embeddings, labels, fmrs, max_pairs, seed)
    scores, genuine = pair_scores(embeddings, labels, max_pairs=max_pairs, seed=seed)
    curve = _Curve(scores, genuine)
    out: dict[str, float | int] = {"roc_auc": curve.roc_auc(), "eer": curve.eer()}
    for fmr in fmrs:
        threshold, fnmr = curve.at_fmr(fmr)
        out[f"fnmr_at_fmr_{fmr_key(fmr)}"] = fnmr
        out[f"threshold_at_fmr_{fmr_key(fmr)}"] = threshold
    out["num_genuine_pairs"] = curve.n_genuine
    out["num_impostor_pairs"] = curve.n_impostor
    return out


def threshold_at_fmr(
    embeddings: torch.Tensor,
    labels: torch.Tensor,
    fmr: float,
    *,
    max_pairs: int = DEFAULT_MAX_PAIRS,
    seed: int = 1234,
) -> float:
    """The smallest cosine-similarity threshold whose false match rate on these pairs is ``<= fmr``.

    A pair matches when ``score >= threshold``; see the module docstring for ties and sampling.
    """
    (fmr,) = _check(embeddings, labels, (fmr,), max_pairs, seed)
    curve = _Curve(*pair_scores(embeddings, labels, max_pairs=max_pairs, seed=seed))
    if curve.n_impostor == 0:
        raise DataError("threshold_at_fmr needs at least one impostor pair (two different labels); all labels are equal.")
    if curve.n_impostor * fmr < 1:
        import warnings

        warnings.warn(f"a false match rate of {fmr:g} needs at least {math.ceil(1 / fmr)} impostor pairs to be measured; "
                      f"these embeddings give {curve.n_impostor}, so the threshold only separates the pairs seen "
                      "(label more gallery classes for a meaningful threshold).", UserWarning, stacklevel=2)
    return curve.at_fmr(fmr)[0]


def _check(embeddings, labels, fmrs, max_pairs, seed) -> tuple[float, ...]:
    check_embeddings_labels(embeddings, labels)
    check_finite(embeddings, "embeddings")
    if embeddings.shape[0] < 2:
        raise DataError(f"Verification needs at least two samples; embeddings has {embeddings.shape[0]} row.")
    validate_params(
        "verification_metrics",
        {"max_pairs": max_pairs, "seed": seed},
        {"max_pairs": [Interval(int, 2, None, closed="left")], "seed": [Interval(int, 0, None, closed="left")]},
    )
    try:
        values = tuple(float(f) for f in fmrs)
    except (TypeError, ValueError):
        values = ()
    if not values or any(not 0.0 < f < 1.0 for f in values):
        raise InvalidParameterError(
            f"The 'fmr' parameter of verification_metrics must be floats in (0, 1). Got {fmrs!r} instead."
        )
    return values


def pair_scores(
    embeddings: torch.Tensor, labels: torch.Tensor, *, max_pairs: int = DEFAULT_MAX_PAIRS, seed: int = 1234
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosine scores ``[P]`` float64 and genuine flags ``[P]`` bool of all pairs ``i < j`` (or a sample).

    All pairs, row by row, when ``N (N - 1) / 2 <= max_pairs``; else the seeded stratified sample
    described in the module docstring.
    """
    x = F.normalize(embeddings.detach().cpu(), dim=1)
    labels = labels.detach().cpu().long()
    n = x.shape[0]
    if n * (n - 1) // 2 <= max_pairs:
        return _all_pairs(x, labels)
    generator = torch.Generator().manual_seed(seed)
    first_g, second_g = _genuine_pairs(labels, max_pairs // 2, generator)
    first_i, second_i = _impostor_pairs(labels, max_pairs - len(first_g), generator)
    first, second = torch.cat([first_g, first_i]), torch.cat([second_g, second_i])
    return _scores_of(x, first, second).double(), labels[first] == labels[second]


def _scores_of(x: torch.Tensor, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """``<x[first[p]], x[second[p]]>`` ``[P]``: read from row blocks of ``x @ x.T`` when that product
    is cheap (``N <= _GRAM_ROWS``), else from gathered rows in small chunks."""
    n = x.shape[0]
    if n > _GRAM_ROWS:
        return torch.cat([(x[a] * x[b]).sum(1) for a, b in zip(first.split(4096), second.split(4096))])
    order = torch.argsort(first)
    first, second = first[order], second[order]
    rows = max(1, _CHUNK * 16 // n)
    bounds = torch.searchsorted(first, torch.arange(0, n + rows, rows).clamp_max(n))
    scores = torch.empty(len(first), dtype=x.dtype)
    for block, (lo, hi) in enumerate(zip(bounds[:-1].tolist(), bounds[1:].tolist())):
        if lo < hi:
            start = block * rows
            gram = x[start : start + rows] @ x.T  # [rows, N]
            scores[lo:hi] = gram[first[lo:hi] - start, second[lo:hi]]
    out = torch.empty_like(scores)
    out[order] = scores
    return out


def _all_pairs(x: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n = x.shape[0]
    rows = max(1, _CHUNK // max(n, 1))
    scores, genuine = [], []
    for start in range(0, n - 1, rows):
        end = min(start + rows, n)
        upper = torch.arange(start, n).unsqueeze(0) > torch.arange(start, end).unsqueeze(1)  # j > i
        scores.append((x[start:end] @ x[start:].T)[upper].double())
        genuine.append((labels[start:end].unsqueeze(1) == labels[start:].unsqueeze(0))[upper])
    return torch.cat(scores), torch.cat(genuine)


def _distinct_pair(size: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Offsets ``a != b`` drawn uniformly in ``[0, size)`` (elementwise sizes ``>= 2``)."""
    a = (torch.rand(size.shape, generator=generator, dtype=torch.float64) * size).long()
    b = (torch.rand(size.shape, generator=generator, dtype=torch.float64) * (size - 1)).long()
    return a, b + (b >= a).long()


def _genuine_pairs(labels: torch.Tensor, budget: int, generator: torch.Generator):
    """Every same-label pair ``i < j`` when they number at most ``budget``; else ``budget`` drawn uniformly."""
    order = torch.argsort(labels, stable=True)
    _, counts = torch.unique_consecutive(labels[order], return_counts=True)
    starts = torch.cumsum(counts, 0) - counts
    pairs_per_class = counts * (counts - 1) // 2
    total = int(pairs_per_class.sum())
    if total == 0:
        empty = torch.zeros(0, dtype=torch.int64)
        return empty, empty
    if total > budget:  # class ~ its pair count, then two distinct members: a uniform genuine pair
        cls = torch.multinomial(pairs_per_class.double(), budget, replacement=True, generator=generator)
        a, b = _distinct_pair(counts[cls], generator)
        return order[starts[cls] + a], order[starts[cls] + b]
    first, second = [], []
    for size in torch.unique(counts[counts > 1]).tolist():  # one triu per class size, all classes of it at once
        tri = torch.triu_indices(size, size, 1)
        base = starts[counts == size].unsqueeze(1)
        first.append(order[(base + tri[0]).reshape(-1)])
        second.append(order[(base + tri[1]).reshape(-1)])
    return torch.cat(first), torch.cat(second)


def _impostor_pairs(labels: torch.Tensor, budget: int, generator: torch.Generator):
    """``budget`` different-label pairs drawn uniformly with replacement (rejection from uniform pairs)."""
    n = len(labels)
    _, counts = torch.unique(labels, return_counts=True)
    all_pairs = n * (n - 1) // 2
    impostor = all_pairs - int((counts * (counts - 1) // 2).sum())
    if impostor == 0 or budget <= 0:
        empty = torch.zeros(0, dtype=torch.int64)
        return empty, empty
    first, second, found = [], [], 0
    while found < budget:
        draw = int((budget - found) * all_pairs / impostor * 1.1) + 64
        a, b = _distinct_pair(torch.full((draw,), n, dtype=torch.int64), generator)
        keep = labels[a] != labels[b]
        first.append(a[keep])
        second.append(b[keep])
        found += int(keep.sum())
    return torch.cat(first)[:budget], torch.cat(second)[:budget]


class _Curve:
    """FMR and FNMR at every candidate threshold, from one descending sort of the scores."""

    def __init__(self, scores: torch.Tensor, genuine: torch.Tensor):
        order = torch.argsort(scores, descending=True)
        s, g = scores[order], genuine[order]
        self.n_genuine = int(g.sum())
        self.n_impostor = len(g) - self.n_genuine
        last_of_tie = torch.cat([torch.nonzero(s[1:] != s[:-1]).squeeze(1), torch.tensor([len(s) - 1])])
        gen_cum = torch.cumsum(g.long(), 0)
        imp_cum = torch.arange(1, len(s) + 1) - gen_cum
        zero = torch.zeros(1, dtype=torch.int64)
        # index 0 = the threshold above every score (nothing matches); index k = the k-th largest distinct score
        above = torch.tensor([math.nextafter(float(s[0]), math.inf)], dtype=torch.float64)
        self.thresholds = torch.cat([above, s[last_of_tie]])
        self.matched_genuine = torch.cat([zero, gen_cum[last_of_tie]])
        self.matched_impostor = torch.cat([zero, imp_cum[last_of_tie]])
        self.fmr = self.matched_impostor.double() / self.n_impostor if self.n_impostor else None
        self.fnmr = (self.n_genuine - self.matched_genuine).double() / self.n_genuine if self.n_genuine else None

    def roc_auc(self) -> float:
        if self.fmr is None or self.fnmr is None:
            return float("nan")
        gen_tied = torch.diff(self.matched_genuine).double()  # genuine pairs at each distinct score
        imp_tied = torch.diff(self.matched_impostor).double()
        imp_below = (self.n_impostor - self.matched_impostor[1:]).double()
        return float((gen_tied * (imp_below + 0.5 * imp_tied)).sum() / (self.n_genuine * self.n_impostor))

    def eer(self) -> float:
        if self.fmr is None or self.fnmr is None:
            return float("nan")
        return float(torch.maximum(self.fmr, self.fnmr).min())

    def at_fmr(self, fmr: float) -> tuple[float, float]:
        """(threshold, FNMR) at the smallest threshold with FMR <= ``fmr``; NaNs without impostor pairs."""
        if self.fmr is None:
            return float("nan"), float("nan")
        k = int(torch.searchsorted(self.fmr, torch.tensor([fmr], dtype=torch.float64), right=True)) - 1
        return float(self.thresholds[k]), (float(self.fnmr[k]) if self.fnmr is not None else float("nan"))


def det_curve(scores: torch.Tensor, genuine: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(thresholds, fmr, fnmr)`` float64 at every distinct score of the pairs (``score >= threshold``
    matches), from ``pair_scores``; the points of a DET curve. Needs genuine and impostor pairs."""
    curve = _Curve(scores, genuine)
    if curve.fmr is None or curve.fnmr is None:
        raise DataError("A DET curve needs genuine and impostor pairs; these labels give "
                        f"{curve.n_genuine} genuine and {curve.n_impostor} impostor pairs.")
    return curve.thresholds, curve.fmr, curve.fnmr
