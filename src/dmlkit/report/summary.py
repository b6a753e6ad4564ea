"""The report's answer and tables: what was learnt (test scores against the untrained embedding), split
sizes, what was kept and why, display-named metrics, counters and the validation scores per evaluation."""

from __future__ import annotations

import math
from typing import Any

from dmlkit.evaluation.metrics import LABELS, SELECTION_METRIC
from dmlkit.report import html
from dmlkit.report.run_reader import RunData

#: Display names of result keys the metrics table (:mod:`dmlkit.evaluation.metrics`) does not list.
EXTRA_LABELS: dict[str, str] = {
    "ami": "AMI",
    "threshold_at_fmr_1e-2": "threshold@FMR=1e-2",
    "gain_over_pretrained": "gain over pretrained (MAP@R)",
    "gain_standard_error": "gain standard error",
    "covering_radius": "covering radius",
}
#: Counters (not scores) of metrics.json and eval records: display name, unit suffix.
COUNTERS: dict[str, str] = {
    "steps": "training steps",
    "best_step": "selected step",
    "train_seconds": "training time (s)",
    "num_genuine_pairs": "genuine test pairs",
    "num_impostor_pairs": "impostor test pairs",
    "num_queries_excluded": "queries without a true match (excluded)",
}
SPLITS = ("train", "val", "test", "query", "gallery")
SPLIT_NAMES = {"train": "training", "val": "validation", "test": "test", "query": "query", "gallery": "gallery"}


def metric_label(key: str) -> str:
    """Display name of a result key (``map_at_r`` -> ``MAP@R``, ``steps`` -> ``training steps``); one
    table for the report, the comparison and the tables below. Unknown keys get spaces for underscores."""
    return LABELS.get(key) or EXTRA_LABELS.get(key) or COUNTERS.get(key) or key.replace("_", " ")


def ordered_metric_keys(keys: list[str] | set[str]) -> list[str]:
    """The standard metrics in the papers' order, then any extra keys alphabetically."""
    known = [k for k in LABELS if k in keys]
    return known + sorted(k for k in keys if k not in LABELS)


def count_text(value: float | int) -> str:
    """A counter with thousands separators (``6600`` -> ``6,600``; seconds to one decimal)."""
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.1f}"
    return f"{int(value):,}"


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _record_at(run: RunData, split: str, step: int | None) -> dict[str, Any] | None:
    if step is None:
        return None
    matches = [r for r in run.records_of("eval", split=split) if r.get("step") == step]
    return matches[-1] if matches else None


def split_sizes_text(run: RunData) -> str:
    """``training 20 classes / 1,234 images · validation ... · test ...`` from manifest.json."""
    parts = [f"{SPLIT_NAMES[s]} {c:,} classes / {n:,} images" for s in SPLITS if s in run.split_sizes
             for c, n in [run.split_sizes[s]]]
    return " · ".join(parts) if parts else "split sizes not recorded (no manifest.json)"


def kept_text(run: RunData) -> str:
    """What the run kept and why: selected weights, the pretrained embedding, or the last step."""
    step = _number(run.metrics.get("best_step"))
    selected_on = run.metrics.get("selected_on")
    if run.metrics.get("kept_pretrained") is True:
        return ("Kept: the untrained (pretrained) embedding of step 0 — no fine-tuned checkpoint beat its validation "
                "MAP@R by more than two standard errors of the per-query gain, so training was not worth keeping.")
    if selected_on == "val" and step is not None:
        return (f"Kept: the weights of step {int(step):,}, the best validation MAP@R"
                + (" (and significantly better than the untrained embedding)" if "kept_pretrained" in run.metrics
                   else "") + ".")
    if step is not None:
        return f"Kept: the last weights (step {int(step):,}); there was no validation split to choose by."
    return "Kept: not recorded."


def answer_html(run: RunData) -> str:
    """Two lines opening the page: test MAP@R and P@1 of the kept weights against the untrained embedding
    (step 0, where logged), then the split sizes and what was kept and why."""
    m = run.metrics
    test_map, test_p1 = _number(m.get(SELECTION_METRIC)), _number(m.get("precision_at_1"))
    scores = [f"{name} {value:.3f}" for name, value in (("MAP@R", test_map), ("P@1", test_p1)) if value is not None]
    first = "Test " + " and ".join(scores) + " with the kept weights" if scores else "No test metrics recorded"
    untrained = _record_at(run, "test", 0) or _record_at(run, "val", 0)
    if untrained is not None:
        split = "test" if _record_at(run, "test", 0) is not None else "validation"
        best = _record_at(run, "val", int(_number(m.get("best_step")) or 0)) if split == "validation" else None
        before = _number(untrained.get(SELECTION_METRIC))
        after = _number(best.get(SELECTION_METRIC)) if best else None
        if split == "test":
            after = test_map
        if before is not None:
            first += (f"; the untrained embedding (step 0) scored {split} MAP@R {before:.3f}"
                      + (f", the kept weights {after:.3f} ({after - before:+.3f})" if after is not None else ""))
    else:
        first += "; the untrained embedding (step 0) was not evaluated"
    second = f"Splits: {split_sizes_text(run)}. {kept_text(run)}"
    return (f'<div class="answer" id="answer"><p><strong>{html.esc(first)}.</strong></p>'
            f"<p>{html.esc(second)}</p></div>")


def metrics_tables(run: RunData) -> str:
    """Test scores by display name (P@1 = R@1 shown once, explained), then the counters with thousands
    separators, then the split sizes."""
    values = {k: v for k, v in run.metric_values().items() if k not in COUNTERS}
    if not values and not run.metrics:
        return html.note("metrics.json has no numeric metrics.")
    p1, r1 = values.get("precision_at_1"), values.get("recall_at_1")
    same = p1 is not None and r1 is not None and abs(p1 - r1) < 1e-12
    rows = []
    for key in ordered_metric_keys(set(values)):
        if same and key == "recall_at_1":
            continue
        label = "P@1 = R@1" if same and key == "precision_at_1" else metric_label(key)
        rows.append((label, values[key]))
    blocks = [html.table(("test metric", "value"), rows, numeric_columns=(1,))] if rows else []
    counters = [(COUNTERS[k], count_text(run.metrics[k])) for k in COUNTERS if _number(run.metrics.get(k)) is not None]
    if counters:
        blocks.append("<h3>Counters</h3>" + html.table(("counter", "value"), counters, numeric_columns=(1,)))
    if run.split_sizes:
        sizes = [(SPLIT_NAMES[s], f"{run.split_sizes[s][0]:,}", f"{run.split_sizes[s][1]:,}")
                 for s in SPLITS if s in run.split_sizes]
        blocks.append("<h3>Split sizes</h3>" + html.table(("split", "classes", "images"), sizes, numeric_columns=(1, 2)))
    body = '<div class="tables">' + "".join(f"<div>{block}</div>" for block in blocks) + "</div>"
    if same:
        body += html.note("P@1 and R@1 are the same number here: with one neighbour, the first neighbour being "
                          "right is both the precision and the recall at 1 (leave-one-out retrieval).")
    return body


def evaluations_table(run: RunData) -> str:
    """Every validation evaluation: step, time and its scores by display name (the selected step bold)."""
    records = run.records_of("eval", split="val")
    if not records:
        return ""
    keys = [k for k in ordered_metric_keys({k for r in records for k in r})
            if k in LABELS and any(_number(r.get(k)) is not None for r in records)]
    best = _number(run.metrics.get("best_step"))
    rows, classes = [], []
    for r in records:
        rows.append([count_text(r.get("step", 0)), f"{_number(r.get('time')) or 0.0:,.1f}"]
                    + [r.get(k, "—") for k in keys])
        classes.append("differs" if best is not None and r.get("step") == best else "")
    header = ["step", "time (s)"] + [metric_label(k) for k in keys]
    return ("<h3>Validation scores per evaluation</h3><div class=\"scroll\">"
            + html.table(header, rows, numeric_columns=range(1, len(header)), row_classes=classes)
            + "</div>" + html.note("Highlighted: the selected step."))
