"""From run records to verdicts: per-claim tables with confidence intervals, paired tests and Holm's correction.

A comparison gets a verdict only when both arms learned: in every seed the arm's selected checkpoint
beats its own starting point (the untrained network) on validation MAP@R. Otherwise the table says
which arm did not learn, and in which seeds.
"""

from __future__ import annotations

import math
import statistics
from typing import Sequence

from scipy import stats as _scipy_stats

from dmlkit.claims.catalogue import ARMS, Claim, learning_rates_for
from dmlkit.report.stats import (
    equivalence_p,
    equivalence_verdict,
    holm,
    paired_t_test,
    superiority_verdict,
)

#: Metrics where lower is better (the comparison's difference is then ``b - a``: positive means ``a`` wins).
LOWER_IS_BETTER = ("steps_to_threshold", "seconds_to_threshold")


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


def run_value(record: dict, claim: Claim) -> tuple[float, bool]:
    """The claim's metric for one run, and whether it is observed (False: a censored time)."""
    if claim.metric == "steps_to_threshold":
        end = record["steps"] + (record["val_curve"][1]["step"] - record["val_curve"][0]["step"]
                                 if len(record["val_curve"]) > 1 else 0)
        return time_to_threshold(record["val_curve"], record["start"]["val"]["map_at_r"], claim.threshold, "step", end)
    if claim.metric == "seconds_to_threshold":
        end = record["val_curve"][-1]["time"] if record["val_curve"] else 0.0
        return time_to_threshold(record["val_curve"], record["start"]["val"]["map_at_r"], claim.threshold, "time", end)
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


def arm_summary(name: str, records: Sequence[dict], claim: Claim) -> dict:
    """One arm's row: chosen point, start and selected validation, the metric's mean and CI, learning per seed."""
    values = [run_value(r, claim) for r in records]
    starts = [start_value(r, claim) for r in records]
    mean, low, high = mean_ci([v for v, _ in values])
    return {
        "arm": name, "description": ARMS[name].description, "point": records[0]["point"], "seeds": len(records),
        "start_val": statistics.fmean(r["start"]["val"]["map_at_r"] for r in records),
        "selected_val": statistics.fmean(r["selected_val_map_at_r"] for r in records),
        "selected_steps": [r["best_step"] for r in records],
        "mean": mean, "ci_low": low, "ci_high": high,
        "start_mean": None if starts[0] is None else statistics.fmean(starts),
        "censored": sum(not ok for _, ok in values),
        "not_learned_seeds": [r["seed"] for r in records if not r["learned"]],
        "projections": [sum(p["complete"] for p in r["projections"]) for r in records] if records[0]["projections"] else None,
        "selected_projection": [selected_projection(r) for r in records] if records[0]["projections"] else None,
    }


def compare(claim: Claim, records: dict[str, list[dict]]) -> list[dict]:
    """Every comparison of ``claim``: paired test over the seeds both arms have, Holm over the claim, verdict."""
    rows = []
    for comp in claim.comparisons:
        a, b = _by_seed(records[comp.a]), _by_seed(records[comp.b])
        seeds = sorted(set(a) & set(b))
        va = [run_value(a[s], claim)[0] for s in seeds]
        vb = [run_value(b[s], claim)[0] for s in seeds]
        if claim.metric in LOWER_IS_BETTER:  # positive difference: a reaches the threshold sooner
            va, vb = [-v for v in va], [-v for v in vb]
        row: dict = {"a": comp.a, "b": comp.b, "kind": comp.kind, "margin": comp.margin, "seeds": seeds}
        if len(seeds) < 2:
            row.update(p=float("nan"), note="fewer than 2 seeds")
            rows.append(row)
            continue
        test = paired_t_test(va, vb)
        row.update(test.as_dict())
        row["p"] = equivalence_p(va, vb, comp.margin) if comp.kind == "equivalent" else test.p
        if claim.metric in LOWER_IS_BETTER:
            ratio_a = statistics.fmean(-v for v in va)
            row["ratio"] = statistics.fmean(-v for v in vb) / ratio_a if ratio_a > 0 else float("inf")
        not_learned = {n: [s for s in seeds if not r[s]["learned"]] for n, r in ((comp.a, a), (comp.b, b))}
        row["not_learned"] = {n: s for n, s in not_learned.items() if s}
        rows.append(row)
    testable = [r for r in rows if not math.isnan(r["p"]) and not r.get("not_learned")]
    for r, p_adj in zip(testable, holm([r["p"] for r in testable])):
        r["p_holm"] = p_adj
    for r in rows:
        r["verdict"] = _verdict(r)
    return rows


def _verdict(row: dict) -> str:
    if row.get("note"):
        return f"no verdict: {row['note']}"
    if row.get("not_learned"):
        return "no verdict: " + "; ".join(f"{n} did not learn (seeds {s})" for n, s in row["not_learned"].items())
    if len(row["seeds"]) < 5:
        prefix = f"(only {len(row['seeds'])} seeds, not a result) "
    else:
        prefix = ""
    if row["kind"] == "equivalent":  # margins of metrics in [0, 1] are said in percentage points, as the tables are
        return prefix + equivalence_verdict(row["p_holm"], round(100 * row["margin"], 6), unit=" points")
    return prefix + superiority_verdict(row["mean_diff"], row["p_holm"])


def summarise_claim(claim: Claim, records: dict[str, list[dict]]) -> dict:
    """The claim's arms and comparisons (JSON-ready)."""
    return {
        "claim": claim.name, "paper": claim.paper, "source": claim.source, "statement": claim.statement,
        "paper_numbers": claim.paper_numbers, "metric": claim.metric, "threshold": claim.threshold,
        "arms": [arm_summary(n, records[n], claim) for n in claim.arms],
        "comparisons": compare(claim, records),
    }


def _fmt(v: float | None, scale: float = 100.0, digits: int = 1) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{scale * v:.{digits}f}"


def _point(point: dict, setting: str) -> str:
    """The chosen grid point; a learning rate at the grid's edge is marked (a wider grid might choose past it)."""
    grid = learning_rates_for(setting)
    edge = " (grid edge)" if point["lr"] in (min(grid), max(grid)) else ""
    return ", ".join(f"{k} {v:g}{edge if k == 'lr' else ''}" for k, v in point.items())


def claim_markdown(summary: dict) -> str:
    """The claim's two tables: arms (with the untrained start), then comparisons with p-values and verdicts."""
    times = summary["metric"] in LOWER_IS_BETTER
    scale, digits = (1.0, 0) if times else (100.0, 1)
    what = summary["metric"] + (f" (validation MAP@R {summary['threshold']:g})" if times else " (test, %)")
    lines = [f"### {summary['paper']}, {summary['source']}: {summary['statement']}", "",
             f"Paper: {summary['paper_numbers']}.", "",
             f"| arm | chosen | start val MAP@R | selected val MAP@R | selected steps | {what}: mean [95% CI] | start |",
             "|---|---|---|---|---|---|---|"]
    for a in summary["arms"]:
        extra = f" ({a['censored']} never reached)" if a["censored"] else ""
        learned = "" if not a["not_learned_seeds"] else f" — did not learn in seeds {a['not_learned_seeds']}"
        proj = ("" if not a["projections"] else
                f"; projections completed {a['projections']}, selected in projection {a['selected_projection']}")
        lines.append(
            f"| {a['arm']} | {_point(a['point'], ARMS[a['arm']].setting)} | {_fmt(a['start_val'])} | {_fmt(a['selected_val'])} | "
            f"{a['selected_steps']}{proj} | {_fmt(a['mean'], scale, digits)} [{_fmt(a['ci_low'], scale, digits)}, "
            f"{_fmt(a['ci_high'], scale, digits)}]{extra}{learned} | {_fmt(a['start_mean'], scale, digits)} |")
    lines += ["", "| comparison | seeds | difference [95% CI] | t (df) | p | Holm p | verdict |", "|---|---|---|---|---|---|---|"]
    for c in summary["comparisons"]:
        if "mean_diff" not in c:
            lines.append(f"| {c['a']} vs {c['b']} | {len(c['seeds'])} | – | – | – | – | {c['verdict']} |")
            continue
        sign = -1.0 if times else 1.0  # times: shown as a's minus b's (negative: a sooner)
        low, high = sorted((sign * c["ci_low"], sign * c["ci_high"]))
        ratio = f"; b / a = {c['ratio']:.2f}x" if "ratio" in c else ""
        kind = f" (equivalence, margin ±{_fmt(c['margin'])})" if c["kind"] == "equivalent" else ""
        lines.append(
            f"| {c['a']} vs {c['b']}{kind} | {len(c['seeds'])} | {_fmt(sign * c['mean_diff'], scale, digits)} "
            f"[{_fmt(low, scale, digits)}, {_fmt(high, scale, digits)}]{ratio} | {sign * c['t']:.2f} ({c['df']}) | "
            f"{c['p']:.3g} | {_fmt(c.get('p_holm'), 1.0, 3) if 'p_holm' in c else '–'} | {c['verdict']} |")
    return "\n".join(lines) + "\n"


__all__ = ["arm_summary", "claim_markdown", "compare", "mean_ci", "run_value", "summarise_claim", "time_to_threshold"]
