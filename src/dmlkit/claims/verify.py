"""Recompute every printed statistic of a ``claims.json`` from its per-seed values, with scipy alone.

``scripts/reproduce.py claims --verify docs/claims.json`` checks, for every comparison, the p-value of its
test (paired t: ``scipy.stats.ttest_rel``; TOST: two one-sided ``ttest_1samp``; censored times: the
exact signed-rank permutation test of ``scipy.stats.wilcoxon``), its confidence interval, its
minimal detectable difference (power 0.8 by the noncentral t), the ratio interval of times, the
per-claim and global Holm adjustments and the verdicts; and every arm's mean and interval. It
shares no code with :mod:`dmlkit.claims.analysis`, so a reader can trust the tables without it.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

ALPHA = 0.05


def _holm(ps: list[float]) -> list[float]:
    m = len(ps)
    out = [0.0] * m
    running = 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda i: ps[i])):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        out[i] = running
    return out


def _close(a: float | None, b: float | None, tol: float = 1e-6) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=tol, abs_tol=tol)


def _signed_rank_p(diffs: list[float]) -> float:
    d = np.array([v for v in diffs if v != 0.0], dtype=float)
    if len(d) == 0:
        return 1.0
    finite = np.abs(d[np.isfinite(d)])
    big = 2 * (finite.max() if len(finite) else 1.0) + 1  # an infinite time difference ranks above every finite one
    d = np.where(np.isinf(d), np.sign(d) * big, d)
    method = stats.PermutationMethod(n_resamples=2 ** len(d))
    return float(stats.wilcoxon(d, zero_method="wilcox", method=method).pvalue)


def _row_problems(row: dict, where: str) -> list[str]:
    problems = []
    a, b = np.array(row["values_a"], float), np.array(row["values_b"], float)
    n = len(a)
    if row.get("note") or n < 2:
        return problems
    test = row["test"]
    if test == "signed-rank":
        diffs = []
        for x, xo, y, yo in zip(a, row["observed_a"], b, row["observed_b"]):
            diffs.append(y - x if xo and yo else (math.inf if xo else -math.inf) if (xo or yo) else 0.0)
        p = _signed_rank_p(diffs)
        d = b - a
        logs = np.log(np.maximum(b, 1.0) / np.maximum(a, 1.0))
        half = stats.t.ppf(0.975, n - 1) * logs.std(ddof=1) / math.sqrt(n)
        for name, value in (("ratio", math.exp(logs.mean())), ("ratio_low", math.exp(logs.mean() - half)),
                            ("ratio_high", math.exp(logs.mean() + half))):
            if not _close(row[name], value):
                problems.append(f"{where}: {name} {row[name]} recomputes as {value}")
        confidence = 0.95
    elif test == "TOST":
        d = a - b
        margin = row["margin"]
        if d.std(ddof=1) == 0:
            p = 0.0 if abs(d.mean()) < margin else 1.0
        else:
            p = max(stats.ttest_1samp(d, -margin, alternative="greater").pvalue,
                    stats.ttest_1samp(d, margin, alternative="less").pvalue)
        confidence = 0.90
    else:
        d = a - b
        p = 1.0 if d.std(ddof=1) == 0 and d.mean() == 0 else (
            0.0 if d.std(ddof=1) == 0 else stats.ttest_rel(a, b).pvalue)
        confidence = 0.95
    if not _close(row["p"], float(p)):
        problems.append(f"{where}: p {row['p']} recomputes as {p}")
    sd = d.std(ddof=1)
    half = stats.t.ppf(0.5 + confidence / 2, n - 1) * sd / math.sqrt(n)
    if not (_close(row["ci_low"], d.mean() - half) and _close(row["ci_high"], d.mean() + half)):
        problems.append(f"{where}: {round(100 * confidence)}% CI [{row['ci_low']}, {row['ci_high']}] recomputes as "
                        f"[{d.mean() - half}, {d.mean() + half}]")
    mdd = row.get("mdd")
    if mdd is not None and not math.isnan(mdd):
        crit = stats.t.ppf(1 - ALPHA / 2, n - 1)
        nc = mdd * math.sqrt(n) / sd
        power = stats.nct.sf(crit, n - 1, nc) + stats.nct.cdf(-crit, n - 1, nc)
        if not _close(power, 0.8, 1e-4):
            problems.append(f"{where}: the MDD {mdd} has power {power}, not 0.8")
    return problems


def _verdict_ok(row: dict, p_adj: float, verdict: str) -> bool:
    if row.get("note") or row.get("not_learned") or row.get("not_converged"):
        return verdict.startswith("no verdict")
    separated = p_adj < ALPHA
    if row["kind"] == "equivalent":
        return ("not shown" not in verdict) == separated
    return ("not separable" not in verdict) == separated


def verify(data: dict) -> list[str]:
    """Every disagreement between ``claims.json``'s printed statistics and their recomputation (empty: all agree)."""
    problems: list[str] = []
    every_row = []
    for name, summary in data["claims"].items():
        rows = summary["comparisons"]
        family = []
        for row in rows:
            where = f"{name}: {row['a']} vs {row['b']}"
            untestable = (bool(row.get("note")) or bool(row.get("not_learned")) or bool(row.get("not_converged"))
                          or math.isnan(row.get("p", math.nan)))
            family.append(1.0 if untestable else row["p"])
            if row.get("p_family") != family[-1]:
                problems.append(f"{where}: the Holm family holds p {row.get('p_family')}, expected {family[-1]}")
            if "test" in row:
                problems += _row_problems(row, where)
        for row, p_adj in zip(rows, _holm(family)):
            where = f"{name}: {row['a']} vs {row['b']}"
            if not _close(row["p_holm"], p_adj):
                problems.append(f"{where}: per-claim Holm p {row['p_holm']} recomputes as {p_adj}")
            if not _verdict_ok(row, p_adj, row["verdict"]):
                problems.append(f"{where}: verdict {row['verdict']!r} disagrees with Holm p {p_adj}")
        every_row += list(zip(rows, family))
        for arm in summary["arms"]:
            values = np.array([s["value"] for s in arm["per_seed"]], float)
            if not _close(arm["mean"], float(values.mean())):
                problems.append(f"{name}: {arm['arm']} mean {arm['mean']} recomputes as {values.mean()}")
            if len(values) > 1:
                half = stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / math.sqrt(len(values))
                if not _close(arm["ci_low"], values.mean() - half):
                    problems.append(f"{name}: {arm['arm']} CI recomputes as [{values.mean() - half}, {values.mean() + half}]")
    for (row, _), p_adj in zip(every_row, _holm([p for _, p in every_row])):
        if not _close(row.get("p_holm_global"), p_adj):
            problems.append(f"{row['a']} vs {row['b']}: global Holm p {row.get('p_holm_global')} recomputes as {p_adj}")
        elif not _verdict_ok(row, p_adj, row["verdict_global"]):
            problems.append(f"{row['a']} vs {row['b']}: global verdict {row['verdict_global']!r} disagrees with {p_adj}")
    return problems


__all__ = ["verify"]
