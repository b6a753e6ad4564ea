"""Paired t-test, TOST equivalence and Holm's correction against hand-computed and scipy references."""

import math
import statistics

import numpy as np
import pytest
from scipy import stats

from dmlkit.exceptions import InvalidParameterError
from dmlkit.report.stats import (
    equivalence_p,
    equivalence_verdict,
    holm,
    paired_t_test,
    superiority_verdict,
)

A = [0.50, 0.60, 0.70, 0.55, 0.65]
B = [0.45, 0.58, 0.60, 0.50, 0.66]


def test_paired_t_test_matches_the_textbook_formula_and_scipy():
    d = [a - b for a, b in zip(A, B)]  # 0.05, 0.02, 0.10, 0.05, -0.01
    mean, sd = statistics.fmean(d), statistics.stdev(d)
    t = mean / (sd / math.sqrt(5))
    result = paired_t_test(A, B)
    assert result.df == 4 and result.n == 5
    assert result.mean_diff == pytest.approx(0.042)
    assert result.t == pytest.approx(t)
    reference = stats.ttest_rel(A, B)
    assert result.t == pytest.approx(reference.statistic) and result.p == pytest.approx(reference.pvalue)
    half = 2.7764451051977987 * sd / math.sqrt(5)  # t_{0.975, 4}
    assert (result.ci_low, result.ci_high) == pytest.approx((mean - half, mean + half))


def test_paired_t_test_is_antisymmetric_and_handles_constant_differences():
    forward, backward = paired_t_test(A, B), paired_t_test(B, A)
    assert backward.mean_diff == pytest.approx(-forward.mean_diff) and backward.p == pytest.approx(forward.p)
    constant = paired_t_test([1.0, 2.0, 3.0], [0.5, 1.5, 2.5])
    assert constant.p == 0.0 and constant.t == math.inf
    assert paired_t_test([1.0, 2.0], [1.0, 2.0]).p == 1.0


@pytest.mark.parametrize("a, b, match", [([1.0, 2.0], [1.0], "one value of each method"),
                                         ([1.0], [2.0], "at least 2 seeds"),
                                         ([1.0, float("nan")], [1.0, 2.0], "finite")])
def test_paired_t_test_refuses_what_it_cannot_test(a, b, match):
    with pytest.raises(InvalidParameterError, match=match):
        paired_t_test(a, b)


def test_holm_step_down_by_hand():
    # sorted 0.01, 0.03, 0.04 -> x3, x2, x1 = 0.03, 0.06, 0.04 -> monotone 0.03, 0.06, 0.06
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert holm([0.02]) == [0.02]
    assert holm([]) == []


def test_equivalence_is_the_larger_one_sided_p_value():
    margin = 0.1
    d = [a - b for a, b in zip(A, B)]
    lower = stats.ttest_1samp(d, -margin, alternative="greater").pvalue
    upper = stats.ttest_1samp(d, margin, alternative="less").pvalue
    assert equivalence_p(A, B, margin) == pytest.approx(max(lower, upper))
    assert equivalence_p(A, B, 0.001) > 0.5  # a 0.042 mean difference is not within +-0.001
    with pytest.raises(InvalidParameterError, match="margin"):
        equivalence_p(A, B, 0.0)


def test_verdict_words_never_read_not_separable_as_no_worse():
    assert superiority_verdict(0.03, 0.01) == "holds"
    assert superiority_verdict(-0.03, 0.01) == "reversed"
    assert superiority_verdict(0.03, 0.2) == "not separable"
    assert equivalence_verdict(0.01, 0.02) == "equivalent within ±0.02"
    assert "not shown" in equivalence_verdict(0.3, 0.02)
    assert equivalence_verdict(0.01, 2, unit=" points") == "equivalent within ±2 points"


def test_format_p_never_prints_zero():
    from dmlkit.report.stats import format_p

    assert format_p(0.0) == "<0.001" and format_p(0.0004) == "<0.001" and format_p(0.0123) == "0.012"
    assert format_p(1.0) == "1.000" and format_p(float("nan")) == "–" and format_p(None) == "–"


def test_minimal_detectable_difference_has_80_percent_power_by_noncentral_t_and_by_simulation():

    from dmlkit.report.stats import minimal_detectable_difference, paired_t_power

    for n, sd in ((5, 0.02), (8, 0.05), (30, 1.0)):
        mdd = minimal_detectable_difference(sd, n)
        assert paired_t_power(mdd, sd, n) == pytest.approx(0.8, abs=1e-9)
        # a Monte-Carlo check with scipy's own one-sample t-test on simulated per-seed differences
        rng = np.random.default_rng(n)
        d = rng.normal(mdd, sd, size=(20_000, n))
        rejected = stats.ttest_1samp(d, 0.0, axis=1).pvalue < 0.05
        assert rejected.mean() == pytest.approx(0.8, abs=0.012)
        # larger than the normal-approximation floor (z_{0.975} + z_{0.8}) sd / sqrt(n), close to it for large n
        floor = (stats.norm.ppf(0.975) + stats.norm.ppf(0.8)) * sd / n ** 0.5
        assert mdd > floor and (n < 30 or mdd < 1.05 * floor)
    assert math.isnan(minimal_detectable_difference(0.0, 5)) and math.isnan(minimal_detectable_difference(1.0, 1))


def test_exact_signed_rank_test_matches_scipy_without_ties_and_enumerates_with_ties():
    import itertools

    from dmlkit.report.stats import signed_rank_test

    rng = np.random.default_rng(0)
    for n in (2, 5, 8, 11):
        for _ in range(20):
            d = rng.normal(0.3, 1.0, n)
            ours = signed_rank_test(d)
            ref = stats.wilcoxon(d, method="exact")
            assert ours.p == pytest.approx(ref.pvalue, rel=1e-12)
            assert min(ours.statistic, n * (n + 1) / 2 - ours.statistic) == pytest.approx(ref.statistic)
    # ties and zeros: a brute-force enumeration over sign flips of the average ranks
    d = [1.0, -1.0, 2.0, 2.0, 0.0, 3.0, math.inf]
    nz = [v for v in d if v]
    ranks = stats.rankdata(np.abs(nz))
    t_obs = sum(r for r, v in zip(ranks, nz) if v > 0)
    sums = [sum(r for r, s in zip(ranks, signs) if s) for signs in itertools.product((0, 1), repeat=len(nz))]
    centre = sum(ranks) / 2
    expected = sum(abs(s - centre) >= abs(t_obs - centre) - 1e-9 for s in sums) / len(sums)
    result = signed_rank_test(d)
    assert result.n_nonzero == 6 and result.p == pytest.approx(expected) and result.statistic == pytest.approx(t_obs)
    assert signed_rank_test([0.0, 0.0]).p == 1.0


def test_censored_times_rank_worst_and_ratios_have_intervals():

    from dmlkit.report.stats import censored_differences, ratio_interval, signed_rank_test

    a, b = [20.0, 25.0, 30.0, 22.0, 28.0], [45.0, 50.0, 300.0, 300.0, 70.0]
    diffs = censored_differences(a, [True] * 5, b, [True, True, False, False, True])
    assert diffs[:2] == [25.0, 25.0] and diffs[2:4] == [math.inf, math.inf]
    assert censored_differences([5.0], [False], [6.0], [False]) == [0.0]
    assert censored_differences([5.0], [False], [6.0], [True]) == [-math.inf]
    assert signed_rank_test(diffs).p == pytest.approx(2 / 32)  # all five differences favour a
    ratio, low, high = ratio_interval(a, b)
    logs = np.log(np.array(b) / np.array(a))
    half = stats.t.ppf(0.975, 4) * logs.std(ddof=1) / 5 ** 0.5
    assert ratio == pytest.approx(math.exp(logs.mean())) and (low, high) == pytest.approx(
        (math.exp(logs.mean() - half), math.exp(logs.mean() + half)))
