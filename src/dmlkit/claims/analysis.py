"""From run records to verdicts: per-claim tables with confidence intervals, paired tests and Holm's correction.

"Learned": a run learned when its selected checkpoint beats its own starting point (the untrained
network, or the pretrained backbone alone on photos) on *validation* MAP@R by at least
:data:`LEARN_MARGIN` (1 point) at a step after 0. A comparison gets a verdict only when both arms
learned in every seed; otherwise the table says which arm did not learn, in which seeds, and the
comparison stays in its Holm families with ``p = 1`` (dropping it would shrink the families).
"Converged": a run converged unless it selected its last step at the cap *and* that step beats every
validation before its last patience window by :data:`IMPROVING_GAIN` (0.1 point) or more; an accuracy
comparison gets no verdict when more than one seed of an arm was still improving at the cap.

Tests: accuracy claims use Student's paired t over seeds (95 % CI); equivalence claims two one-sided
tests (TOST) with the 90 % CI that goes with them; convergence claims the exact Wilcoxon
signed-rank test of the paired times with "never reached" as the worst rank, and the geometric-mean
ratio of the times with its 95 % CI (a never-reached time enters the ratio as the cap: a bound).
Every row gives the minimal detectable difference at 80 % power from its observed spread; Holm's
correction runs per claim and once over every confirmatory comparison of the run
(:func:`add_global_holm`).
"""

from __future__ import annotations

import math
import statistics
from typing import Sequence

from scipy import stats as _scipy_stats

from dmlkit.claims.catalogue import ARMS, Claim
from dmlkit.report.stats import (
    censored_differences,
    equivalence_p,
    equivalence_verdict,
    format_p,
    holm,
    minimal_detectable_difference,
    paired_t_test,
    ratio_interval,
    signed_rank_test,
    superiority_verdict,
)

#: Metrics where lower is better (the comparison's difference is then ``b - a``: positive means ``a`` wins).
LOWER_IS_BETTER = ("steps_to_threshold", "seconds_to_threshold")
#: The validation MAP@R gain over step 0 that counts as learning (a stated margin: 1 point).
LEARN_MARGIN = 0.01


def learned(record: dict, margin: float = LEARN_MARGIN) -> bool:
    """Whether a run's selected checkpoint (after step 0) beats step 0 on validation MAP@R by ``margin`` or more."""
    gain = float(record["selected_val_map_at_r"]) - float(record["start"]["val"]["map_at_r"])
    return bool(record["best_step"] > 0 and gain >= margin - 1e-12)


def at_cap(record: dict) -> bool:
    """Whether a run selected its last step at the cap."""
    return record["best_step"] >= record["budget_steps"]


#: The validation MAP@R gain over a run's last patience window that counts as still improving (0.1 point):
#: schedules that decay to zero at the cap let a converged run creep up by hundredths of a point to its end.
IMPROVING_GAIN = 0.001


def last_window_gain(record: dict) -> float:
    """Selected validation MAP@R minus the best before the run's last patience window (``patience`` validations;
    one validation for a fixed-length run, which has no patience)."""
    budget = record["budget"]
    window_start = record["budget_steps"] - (budget["patience"] or 1) * budget["eval_every"]
    before = [float(p["map_at_r"]) for p in record["val_curve"] if p["step"] <= window_start]
    return float(record["selected_val_map_at_r"]) - max(before + [float(record["start"]["val"]["map_at_r"])])


def still_improving(record: dict, gain: float = IMPROVING_GAIN) -> bool:
    """Whether a run was still improving when the budget ended (not converged): it selected its last step at the
    cap, and that step beats everything before its last patience window by ``gain`` or more."""
    return at_cap(record) and last_window_gain(record) >= gain - 1e-12


#: Seeds of an arm that may end still improving at the cap before its comparisons get no verdict.
MOST_SEEDS_AT_CAP = 1


def time_to_threshold(curve: Sequence[dict], start: float, threshold: float, key: str, budget_end: float) -> tuple[float, bool]:
    """When the validation curve first reaches ``threshold``, linearly interpolated between evaluations.

    ``curve``: ``{"step", "time", "map_at_r"}`` records in order; ``start`` is the MAP@R at step 0 (time 0).
    Returns ``(value, reached)``; a curve that never reaches it gives ``budget_end`` (censored).
    """
    prev_x, prev_y = 0.0, start
    if start >= threshold:
        return 0.0, True
    for point in curve:
        x, y = float(point[key]), float(point["map_at_r"])
        if y >= threshold:
            return prev_x + (threshold - prev_y) / (y - prev_y) * (x - prev_x), True
        prev_x, prev_y = x, y
    return budget_end, False


def run_value(record: dict, claim: Claim, threshold: float | None = None) -> tuple[float, bool]:
    """The claim's metric for one run, and whether it is observed (False: a censored time, given as the cap).

    Times: to the claim's fixed ``threshold``, or, for a claim with a ``threshold_fraction``, to the seed's own
    step-0 validation MAP@R plus ``threshold`` (a gain: every arm of a seed starts from the same network on the
    same validation classes, so the level is common to the arms compared)."""
    threshold = claim.threshold if threshold is None else threshold
    if claim.metric in LOWER_IS_BETTER and claim.threshold_fraction is not None:
        threshold = float(record["start"]["val"]["map_at_r"]) + threshold
    if claim.metric == "steps_to_threshold":
        return time_to_threshold(record["val_curve"], record["start"]["val"]["map_at_r"], threshold, "step",
                                 float(record["budget_steps"]))
    if claim.metric == "seconds_to_threshold":
        end = record["val_curve"][-1]["time"] if record["val_curve"] else 0.0
        return time_to_threshold(record["val_curve"], record["start"]["val"]["map_at_r"], threshold, "time", end)
    return float(record["test"][claim.metric]), True


def selected_projection(record: dict) -> int:
    """The ASAP projection (0-based) during which the selected checkpoint was taken."""
    ends = sorted((p["step"], p["projection"]) for p in record["projections"])
    return next((proj for end, proj in ends if record["best_step"] <= end), ends[-1][1] if ends else 0)


def start_value(record: dict, claim: Claim) -> float | None:
    """The untrained network's value of the claim's metric (None for times)."""
    if claim.metric in LOWER_IS_BETTER:
        return None
    return float(record["start"]["test"][claim.metric])


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean and its two-sided t confidence interval over seeds."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, float("nan"), float("nan")
    half = float(_scipy_stats.t.ppf(0.5 + confidence / 2, n - 1)) * statistics.stdev(values) / math.sqrt(n)
    return mean, mean - half, mean + half


def _by_seed(records: Sequence[dict]) -> dict[int, dict]:
    return {r["seed"]: r for r in records}


def clustering_keys(metric: str) -> list[str]:
    """The NMI / NMI+ metrics reported beside ``metric`` (same prefix: ``letters_``, ``languages_``, ``fine_``)."""
    prefix = metric[: metric.index("_") + 1] if metric.startswith(("letters_", "languages_", "fine_")) else ""
    return [f"{prefix}nmi", f"{prefix}nmi_plus"]


def arm_summary(name: str, records: Sequence[dict], claim: Claim, threshold: float | None = None,
                tuning: dict | None = None) -> dict:
    """One arm's row: chosen point, start and selected validation, the metric's mean and CI, per-seed values."""
    values = [run_value(r, claim, threshold) for r in records]
    starts = [start_value(r, claim) for r in records]
    mean, low, high = mean_ci([v for v, _ in values])
    clustering = {k: statistics.fmean(r["test"][k] for r in records)
                  for k in clustering_keys(claim.metric) if all(k in r["test"] for r in records)}
    return {
        "arm": name, "description": ARMS[name].description, "point": records[0]["point"], "seeds": len(records),
        "start_val": statistics.fmean(r["start"]["val"]["map_at_r"] for r in records),
        "selected_val": statistics.fmean(r["selected_val_map_at_r"] for r in records),
        "selected_steps": [r["best_step"] for r in records],
        "at_cap": sum(at_cap(r) for r in records),
        "still_improving": sum(still_improving(r) for r in records),
        "mean": mean, "ci_low": low, "ci_high": high,
        "start_mean": None if starts[0] is None else statistics.fmean(starts),
        "censored": sum(not ok for _, ok in values),
        "not_learned_seeds": [r["seed"] for r in records if not learned(r)],
        "clustering": clustering,
        "per_seed": [{"seed": r["seed"], "value": v, "observed": ok, "start_val": r["start"]["val"]["map_at_r"],
                      "selected_val": r["selected_val_map_at_r"], "selected_step": r["best_step"],
                      "steps": r["steps"], "learned": learned(r), "last_window_gain": last_window_gain(r),
                      "still_improving": still_improving(r)} for r, (v, ok) in zip(records, values)],
        "tuning": tuning,
        "projections": [sum(p["complete"] for p in r["projections"]) for r in records] if records[0]["projections"] else None,
        "selected_projection": [selected_projection(r) for r in records] if records[0]["projections"] else None,
    }


def _time_test(row: dict, ta: list[float], oa: list[bool], tb: list[float], ob: list[bool]) -> None:
    """Signed-rank test of censored times (``b - a``: positive when ``a`` is sooner) and the ratio ``b / a``."""
    diffs = censored_differences(ta, oa, tb, ob)
    rank = signed_rank_test(diffs)
    finite = [y - x for x, y in zip(ta, tb)]  # censored times at the cap: a bound on the difference
    test = paired_t_test(tb, ta)
    ratio, r_low, r_high = ratio_interval(ta, tb)
    row.update(test="signed-rank", p=rank.p, statistic=rank.statistic, n_nonzero=rank.n_nonzero,
               median_diff=statistics.median(diffs), mean_diff=statistics.fmean(finite), std_diff=test.std_diff,
               ci_low=test.ci_low, ci_high=test.ci_high, confidence=0.95, censored=not (all(oa) and all(ob)),
               ratio=ratio, ratio_low=r_low, ratio_high=r_high,
               mdd=minimal_detectable_difference(test.std_diff, len(ta)))


def compare(claim: Claim, records: dict[str, list[dict]], threshold: float | None = None) -> list[dict]:
    """Every comparison of ``claim``: paired test over the seeds both arms have, Holm over the claim, verdict."""
    rows = []
    for comp in claim.comparisons:
        a, b = _by_seed(records[comp.a]), _by_seed(records[comp.b])
        seeds = sorted(set(a) & set(b))
        ra = [run_value(a[s], claim, threshold) for s in seeds]
        rb = [run_value(b[s], claim, threshold) for s in seeds]
        row: dict = {"a": comp.a, "b": comp.b, "kind": comp.kind, "margin": comp.margin, "seeds": seeds,
                     "values_a": [v for v, _ in ra], "values_b": [v for v, _ in rb],
                     "observed_a": [ok for _, ok in ra], "observed_b": [ok for _, ok in rb]}
        not_learned = {n: [s for s in seeds if not learned(r[s])] for n, r in ((comp.a, a), (comp.b, b))}
        row["not_learned"] = {n: s for n, s in not_learned.items() if s}
        if claim.metric not in LOWER_IS_BETTER:  # curves train a fixed length: their steps to a level are the test
            capped = {n: [s for s in seeds if still_improving(r[s])] for n, r in ((comp.a, a), (comp.b, b))}
            row["not_converged"] = {n: s for n, s in capped.items() if len(s) > MOST_SEEDS_AT_CAP}
        if len(seeds) < 2:
            row.update(p=float("nan"), note="fewer than 2 seeds")
        elif claim.metric in LOWER_IS_BETTER:
            _time_test(row, row["values_a"], row["observed_a"], row["values_b"], row["observed_b"])
        elif comp.kind == "equivalent":  # TOST goes with the 90 % interval (two one-sided 5 % tests)
            test = paired_t_test(row["values_a"], row["values_b"], confidence=0.90)
            row.update(test.as_dict(), test="TOST", p=equivalence_p(row["values_a"], row["values_b"], comp.margin),
                       mdd=minimal_detectable_difference(test.std_diff, len(seeds)))
        else:
            test = paired_t_test(row["values_a"], row["values_b"])
            row.update(test.as_dict(), test="paired t", mdd=minimal_detectable_difference(test.std_diff, len(seeds)))
        # a comparison without a verdict stays in the family with p = 1 (dropping it would shrink the family)
        untestable = math.isnan(row["p"]) or bool(row["not_learned"]) or bool(row.get("not_converged"))
        row["p_family"] = 1.0 if untestable else row["p"]
        rows.append(row)
    for r, p_adj in zip(rows, holm([r["p_family"] for r in rows])):
        r["p_holm"] = p_adj
    for r in rows:
        r["verdict"] = _verdict(r, r["p_holm"])
    return rows


def add_global_holm(summaries: dict[str, dict]) -> None:
    """Holm over every confirmatory comparison of the run (all claims together): ``p_holm_global`` and its verdict."""
    rows = [r for s in summaries.values() for r in s["comparisons"]]
    for r, p_adj in zip(rows, holm([r["p_family"] for r in rows])):
        r["p_holm_global"] = p_adj
        r["verdict_global"] = _verdict(r, p_adj)


def _direction(row: dict) -> float:
    return row["median_diff"] if row.get("test") == "signed-rank" else row["mean_diff"]


def _verdict(row: dict, p_adjusted: float) -> str:
    if row.get("note"):
        return f"no verdict: {row['note']}"
    if row.get("not_learned"):
        return "no verdict: " + "; ".join(f"{n} did not learn (seeds {s})" for n, s in row["not_learned"].items())
    if row.get("not_converged"):
        return "no verdict: " + "; ".join(f"{n} still improving at the cap (seeds {s}): not converged"
                                          for n, s in row["not_converged"].items())
    prefix = f"(only {len(row['seeds'])} seeds, not a result) " if len(row["seeds"]) < 5 else ""
    if row["kind"] == "equivalent":  # margins of metrics in [0, 1] are said in percentage points, as the tables are
        return prefix + equivalence_verdict(p_adjusted, round(100 * row["margin"], 6), unit=" points")
    return prefix + superiority_verdict(_direction(row), p_adjusted)


def summarise_claim(claim: Claim, records: dict[str, list[dict]], *, threshold: float | None = None,
                    tuning: dict[str, dict] | None = None, variant: str = "") -> dict:
    """The claim's arms and comparisons (JSON-ready); ``variant`` names a second reading (e.g. one common rate)."""
    threshold = claim.threshold if threshold is None else threshold
    tuning = tuning or {}
    return {
        "claim": claim.name + (f"@{variant}" if variant else ""), "paper": claim.paper, "source": claim.source,
        "statement": claim.statement + (f" ({variant})" if variant else ""), "paper_numbers": claim.paper_numbers,
        "metric": claim.metric, "threshold": threshold, "threshold_is_gain": claim.threshold_fraction is not None,
        "arms": [arm_summary(n, records[n], claim, threshold, tuning.get(n)) for n in claim.arms],
        "comparisons": compare(claim, records, threshold),
    }


def _fmt(v: float | None, scale: float = 100.0, digits: int = 1) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{scale * v:.{digits}f}"


def _point(arm: dict) -> str:
    """The chosen grid point; a value at its grid's edge is marked (with the hard limit that stopped the grid)."""
    tuning = arm.get("tuning") or {}
    edges = tuning.get("edges", {})
    return ", ".join(f"{k} {v:g}{' (' + edges[k] + ')' if k in edges else ''}" for k, v in arm["point"].items())


def claim_markdown(summary: dict) -> str:
    """The claim's two tables: arms (with the untrained start), then comparisons with p-values and verdicts."""
    times = summary["metric"] in LOWER_IS_BETTER
    scale, digits = (1.0, 0) if times else (100.0, 1)
    level = (f"step 0 + {summary['threshold']:.3f}" if summary.get("threshold_is_gain") else f"{summary['threshold']:.3f}"
             ) if times else ""
    what = summary["metric"] + (f" (validation MAP@R {level})" if times else " (test, %)")
    nmi = sorted({k for a in summary["arms"] for k in a["clustering"]})
    nmi_head = "".join(f" {k} (%) |" for k in nmi)
    lines = [f"### {summary['paper']}, {summary['source']}: {summary['statement']}", "",
             f"Paper: {summary['paper_numbers']}.", "",
             "| arm | chosen | start val MAP@R | selected val MAP@R | selected steps (at cap; still improving) | "
             f"{what}: mean [95% CI] | start |{nmi_head}",
             "|---|---|---|---|---|---|---|" + "---|" * len(nmi)]
    for a in summary["arms"]:
        extra = f" ({a['censored']} never reached)" if a["censored"] else ""
        not_learned = "" if not a["not_learned_seeds"] else f" — did not learn in seeds {a['not_learned_seeds']}"
        if not times and a["still_improving"] > MOST_SEEDS_AT_CAP:
            not_learned += f" — still improving at the cap in {a['still_improving']} seeds: not converged, raise the cap"
        proj = ("" if not a["projections"] else
                f"; projections completed {a['projections']}, selected in projection {a['selected_projection']}")
        nmi_cells = "".join(f" {_fmt(a['clustering'].get(k))} |" for k in nmi)
        lines.append(
            f"| {a['arm']} | {_point(a)} | {_fmt(a['start_val'])} | {_fmt(a['selected_val'])} | "
            f"{a['selected_steps']} ({a['at_cap']}; {a['still_improving']}){proj} | {_fmt(a['mean'], scale, digits)} "
            f"[{_fmt(a['ci_low'], scale, digits)}, "
            f"{_fmt(a['ci_high'], scale, digits)}]{extra}{not_learned} | {_fmt(a['start_mean'], scale, digits)} |{nmi_cells}")
    lines += ["", "| comparison | seeds | test | difference [CI] | MDD (80% power) | p | Holm p (claim) | Holm p (all claims) "
              "| verdict (claim Holm) | verdict (all claims) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for c in summary["comparisons"]:
        if "mean_diff" not in c:
            lines.append(f"| {c['a']} vs {c['b']} | {len(c['seeds'])} | – | – | – | – | {format_p(c.get('p_holm'))} | "
                         f"{format_p(c.get('p_holm_global'))} | {c['verdict']} | {c.get('verdict_global', '–')} |")
            continue
        sign = -1.0 if times else 1.0  # times: shown as a's minus b's (negative: a sooner)
        low, high = sorted((sign * c["ci_low"], sign * c["ci_high"]))
        level = f"{round(100 * c['confidence'])}%"
        ratio = (f"; b / a = {c['ratio']:.2f}x [{c['ratio_low']:.2f}, {c['ratio_high']:.2f}]"
                 f"{' (never-reached at the cap: a bound)' if c.get('censored') else ''}") if "ratio" in c else ""
        kind = f" (equivalence, margin ±{_fmt(c['margin'])})" if c["kind"] == "equivalent" else ""
        lines.append(
            f"| {c['a']} vs {c['b']}{kind} | {len(c['seeds'])} | {c['test']} | {_fmt(sign * c['mean_diff'], scale, digits)} "
            f"[{level}: {_fmt(low, scale, digits)}, {_fmt(high, scale, digits)}]{ratio} | {_fmt(c.get('mdd'), scale, digits)} | "
            f"{format_p(c['p'])} | {format_p(c.get('p_holm'))} | {format_p(c.get('p_holm_global'))} | {c['verdict']} | "
            f"{c.get('verdict_global', '–')} |")
    return "\n".join(lines) + "\n"


__all__ = ["LEARN_MARGIN", "add_global_holm", "arm_summary", "claim_markdown", "compare", "learned", "mean_ci",
           "run_value", "summarise_claim", "time_to_threshold"]
