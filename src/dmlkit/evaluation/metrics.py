"""The metrics table: every metric's result key, its label, and where it is shown.

CLI tables, run reports, ``dmlkit compare``, cross-validation summaries, the validation curves,
checkpoint selection and sweeps all read this one table, so a new metric is one row here (plus the
function that computes it in :mod:`dmlkit.evaluation`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    """One metric: ``key`` in result dicts, ``label`` for people, and where it appears."""

    key: str
    label: str
    higher_is_better: bool = True
    summary: bool = False  # one of the few columns of `dmlkit compare` and cross-validation summaries
    curve: bool = False  # drawn as a validation curve in reports


METRICS: tuple[Metric, ...] = (
    Metric("precision_at_1", "P@1", summary=True),
    Metric("recall_at_1", "R@1", summary=True, curve=True),
    Metric("recall_at_2", "R@2"),
    Metric("recall_at_4", "R@4"),
    Metric("recall_at_8", "R@8"),
    Metric("r_precision", "R-Precision", summary=True),
    Metric("map_at_r", "MAP@R", summary=True, curve=True),
    Metric("nmi", "NMI", summary=True),
    Metric("nmi_plus", "NMI+"),  # eval.over_cluster > 1: k-means with over_cluster x the class count (EPS)
    # verification over all pairs of the split (evaluation/verification.py): pair scores = cosine similarity
    Metric("roc_auc", "ROC AUC"),
    Metric("eer", "EER", higher_is_better=False),
    Metric("fnmr_at_fmr_1e-2", "FNMR@FMR=1e-2", higher_is_better=False),
    Metric("fnmr_at_fmr_1e-3", "FNMR@FMR=1e-3", higher_is_better=False),
    Metric("threshold_at_fmr_1e-3", "threshold@FMR=1e-3"),  # a cosine similarity; neither direction is better
)

#: The metric that chooses checkpoints, stops early and scores sweep trials (validation MAP@R, ASAP App. A.2).
SELECTION_METRIC = "map_at_r"

#: key -> label, in the papers' order.
LABELS: dict[str, str] = {m.key: m.label for m in METRICS}
#: Keys of the full table (`dmlkit train` / `dmlkit evaluate`).
TABLE_KEYS: list[str] = [m.key for m in METRICS]
#: Keys of the short summaries (`dmlkit compare`).
SUMMARY_KEYS: list[str] = [m.key for m in METRICS if m.summary]
#: Retrieval keys of the short summaries (cross-validation averages; clustering is not averaged there).
RETRIEVAL_SUMMARY_KEYS: tuple[str, ...] = tuple(k for k in SUMMARY_KEYS if k != "nmi")
#: ``(key, label)`` of the validation curves, MAP@R first.
CURVES: tuple[tuple[str, str], ...] = tuple(
    sorted(((m.key, m.label) for m in METRICS if m.curve), key=lambda kv: kv[0] != SELECTION_METRIC)
)
