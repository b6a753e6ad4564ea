"""Paired comparisons of two methods over seeds: t-tests, equivalence tests, Holm's correction, verdicts.

The seed is the unit: each seed gives one number per method (trained on the same classes, from the
same initial weights), and a comparison tests the per-seed differences ``d_s = a_s - b_s``
(Student's paired t-test, ``n - 1`` degrees of freedom). Several comparisons of one claim are
corrected together with Holm's step-down procedure. "Not separable" is never read as "no worse":
a claim that a method costs nothing is tested as equivalence within a stated margin (two one-sided
tests, Schuirmann 1987).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

from scipy import stats as _scipy_stats

from dmlkit.exceptions import InvalidParameterError

#: The family-wise error rate of a claim's confirmatory comparisons.
ALPHA = 0.05


@dataclass(frozen=True)
class PairedTest:
    """Student's paired t-test of ``mean(a - b) = 0`` (two-sided) with its confidence interval."""

    n: int
    mean_a: float
    mean_b: float
    mean_diff: float
    std_diff: float
    se: float
    t: float
    df: int
    p: float
    ci_low: float
    ci_high: float
    confidence: float

    def as_dict(self) -> dict:
        return asdict(self)


def _paired_differences(a: Sequence[float], b: Sequence[float]) -> list[float]:
    a, b = [float(v) for v in a], [float(v) for v in b]
    if len(a) != len(b):
        raise InvalidParameterError(f"A paired test needs one value of each method per seed: got {len(a)} and {len(b)}.")
    if len(a) < 2:
        raise InvalidParameterError(f"A paired test needs at least 2 seeds; got {len(a)}.")
    if not all(math.isfinite(v) for v in (*a, *b)):
        raise InvalidParameterError(f"A paired test needs finite values; got {a} and {b}.")
    return [x - y for x, y in zip(a, b)]


def _mean_se(d: list[float]) -> tuple[float, float, float]:
    """Mean, sample standard deviation and standard error of the mean of the differences."""
    n = len(d)
    mean = sum(d) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    return mean, sd, sd / math.sqrt(n)


def paired_t_test(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> PairedTest:
    """Paired t-test of ``a`` against ``b`` (index ``s`` of both is seed ``s``); ``p`` is two-sided.

    Identical differences (standard deviation 0) give ``p = 0`` when they are not zero and ``p = 1``
    when they are (the t statistic is infinite or undefined there).
    """
    d = _paired_differences(a, b)
    n = len(d)
    mean, sd, se = _mean_se(d)
    df = n - 1
    half = float(_scipy_stats.t.ppf(0.5 + confidence / 2, df)) * se
    if se == 0:
        t, p = (math.copysign(math.inf, mean), 0.0) if mean != 0 else (0.0, 1.0)
    else:
        t = mean / se
        p = float(2 * _scipy_stats.t.sf(abs(t), df))
    return PairedTest(n=n, mean_a=sum(map(float, a)) / n, mean_b=sum(map(float, b)) / n, mean_diff=mean, std_diff=sd,
                      se=se, t=t, df=df, p=p, ci_low=mean - half, ci_high=mean + half, confidence=confidence)


def equivalence_p(a: Sequence[float], b: Sequence[float], margin: float) -> float:
    """Two one-sided paired t-tests (TOST) of ``|mean(a - b)| >= margin``: small ``p`` shows equivalence within ``margin``.

    ``p`` is the larger of the two one-sided p-values; equivalence at level ``alpha`` is the same as the
    ``1 - 2 alpha`` confidence interval of the mean difference lying inside ``(-margin, margin)``.
    """
    if not margin > 0:
        raise InvalidParameterError(f"The equivalence margin must be > 0; got {margin}.")
    d = _paired_differences(a, b)
    n = len(d)
    mean, _, se = _mean_se(d)
    if se == 0:
        return 0.0 if abs(mean) < margin else 1.0
    lower = float(_scipy_stats.t.sf((mean + margin) / se, n - 1))  # H0: mean <= -margin
    upper = float(_scipy_stats.t.cdf((mean - margin) / se, n - 1))  # H0: mean >= +margin
    return max(lower, upper)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error control), in the order given.

    The ``i``-th smallest p-value is multiplied by ``m - i`` (``i`` from 0), then made monotone
    (never below the adjusted value of a smaller p-value) and capped at 1.
    """
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * float(pvalues[i])))
        adjusted[i] = running
    return adjusted


def superiority_verdict(diff: float, p_adjusted: float, alpha: float = ALPHA) -> str:
    """``holds`` / ``reversed`` when the Holm-adjusted two-sided test separates the arms, else ``not separable``."""
    if p_adjusted < alpha:
        return "holds" if diff > 0 else "reversed"
    return "not separable"


def equivalence_verdict(p_adjusted: float, margin: float, alpha: float = ALPHA, unit: str = "") -> str:
    """``equivalent within +-margin`` when TOST rejects a difference of ``margin`` or more, else ``not shown``
    (``unit`` follows the margin, e.g. ``" points"`` for a margin given in percentage points)."""
    within = f"within ±{margin:g}{unit}"
    return f"equivalent {within}" if p_adjusted < alpha else f"equivalence {within} not shown"


__all__ = [
    "ALPHA", "PairedTest", "equivalence_p", "equivalence_verdict", "holm", "paired_t_test", "superiority_verdict",
]
