"""Paired t-test, TOST equivalence and Holm's correction against hand-computed and scipy references."""

import math
import statistics

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
