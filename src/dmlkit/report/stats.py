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


def format_p(p: float | None) -> str:
    """A p-value as tables print it: three decimals, ``<0.001`` below that (never ``0.000``), ``–`` when missing."""
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return "–"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def paired_t_power(diff: float, sd: float, n: int, alpha: float = ALPHA) -> float:
    """Power of the two-sided paired t-test at level ``alpha`` when the true mean difference is ``diff``.

    ``T = mean / (sd / sqrt(n))`` follows a noncentral t with ``n - 1`` degrees of freedom and
    noncentrality ``diff * sqrt(n) / sd``; power is ``P(|T| > t_{1 - alpha/2, n-1})``.
    """
    if n < 2 or not sd > 0:
        raise InvalidParameterError(f"Power needs n >= 2 seeds and a spread sd > 0; got n={n}, sd={sd}.")
    df = n - 1
    crit = float(_scipy_stats.t.ppf(1 - alpha / 2, df))
    nc = diff * math.sqrt(n) / sd
    return float(_scipy_stats.nct.sf(crit, df, nc) + _scipy_stats.nct.cdf(-crit, df, nc))


def minimal_detectable_difference(sd: float, n: int, power: float = 0.8, alpha: float = ALPHA) -> float:
    """The smallest true mean difference the two-sided paired t-test detects with ``power`` (exact noncentral t).

    ``sd`` is the standard deviation of the per-seed differences (the observed spread); ``nan`` when it is 0
    or ``n < 2`` (no spread to size a test by).
    """
    if n < 2 or not sd > 0 or not math.isfinite(sd):
        return float("nan")
    from scipy.optimize import brentq

    high = sd
    while paired_t_power(high, sd, n, alpha) < power and high < 1e6 * sd:
        high *= 2
    try:
        return float(brentq(lambda d: paired_t_power(d, sd, n, alpha) - power, 0.0, high, xtol=1e-12 * sd))
    except ValueError:  # the noncentral t is not finite that far out (n = 2: df = 1): no size to give
        return float("nan")


@dataclass(frozen=True)
class SignedRankTest:
    """Wilcoxon's signed-rank test of paired differences (zeros dropped, ties at their average rank), exact p."""

    n: int
    n_nonzero: int
    statistic: float
    p: float


def signed_rank_test(differences: Sequence[float]) -> SignedRankTest:
    """Two-sided exact Wilcoxon signed-rank test of ``differences`` (``+inf`` / ``-inf`` allowed: the largest ranks).

    Zero differences are dropped (Wilcoxon's convention); ``|d|`` is ranked with ties at their average rank;
    the statistic is the sum of the positive differences' ranks and ``p`` counts, over all ``2^n`` sign
    assignments, those at least as far from the mean ``n(n+1)/4`` (exact also with ties).
    """
    d = [float(v) for v in differences if float(v) != 0.0]
    n = len(d)
    if any(math.isnan(v) for v in d):
        raise InvalidParameterError(f"A signed-rank test needs numbers; got {list(differences)}.")
    if n == 0:
        return SignedRankTest(len(differences), 0, 0.0, 1.0)
    if n > 20:
        raise InvalidParameterError(f"The exact signed-rank test enumerates 2^n sign assignments; n = {n} > 20.")
    ranks = _scipy_stats.rankdata([abs(v) for v in d])  # inf ranks last; equal infinities tie
    statistic = float(sum(r for r, v in zip(ranks, d) if v > 0))
    centre = float(sum(ranks)) / 2
    import itertools

    distance = abs(statistic - centre) - 1e-9
    extreme = sum(1 for signs in itertools.product((0, 1), repeat=n)
                  if abs(sum(r for r, s in zip(ranks, signs) if s) - centre) >= distance)
    return SignedRankTest(len(differences), n, statistic, min(1.0, extreme / 2 ** n))


def censored_differences(a: Sequence[float], a_observed: Sequence[bool], b: Sequence[float],
                         b_observed: Sequence[bool]) -> list[float]:
    """Per-seed ``b - a`` of times (lower is better) where a censored time ("never reached") is the worst rank.

    A censored time is worse than every observed one: one censored arm gives ``+inf`` (``b`` censored: ``a``
    wins) or ``-inf``; both censored give 0 (a tie, dropped by the signed-rank test).
    """
    out = []
    for x, xo, y, yo in zip(a, a_observed, b, b_observed):
        if xo and yo:
            out.append(float(y) - float(x))
        elif xo or yo:
            out.append(math.inf if xo else -math.inf)
        else:
            out.append(0.0)
    return out


def ratio_interval(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Geometric-mean ratio ``b / a`` over seeds with its t confidence interval (paired log ratios).

    Times are floored at 1 (a step) so that a threshold reached at the start does not divide by 0.
    """
    logs = [math.log(max(float(y), 1.0) / max(float(x), 1.0)) for x, y in zip(a, b)]
    n = len(logs)
    mean = sum(logs) / n
    if n < 2:
        return math.exp(mean), float("nan"), float("nan")
    sd = math.sqrt(sum((v - mean) ** 2 for v in logs) / (n - 1))
    half = float(_scipy_stats.t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


__all__ = [
    "ALPHA", "PairedTest", "SignedRankTest", "censored_differences", "equivalence_p", "equivalence_verdict", "format_p",
    "holm", "minimal_detectable_difference", "paired_t_power", "paired_t_test", "ratio_interval", "signed_rank_test",
    "superiority_verdict",
]
