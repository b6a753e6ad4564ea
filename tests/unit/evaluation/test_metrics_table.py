"""One metrics table: every place that lists metrics reads it."""

import inspect
import json

from dmlkit import crossval
from dmlkit.cli import compare, evaluate, train
from dmlkit.engine import trainer
from dmlkit.evaluation import clustering_metrics, retrieval_metrics, verification_metrics
from dmlkit.evaluation.metrics import CURVES, LABELS, METRICS, SELECTION_METRIC, SUMMARY_KEYS, TABLE_KEYS
from dmlkit.report import figures, run_report
from dmlkit.sweep import study


def test_every_consumer_uses_the_table(tmp_path):
    # the verbs import the table when they run (their help imports no torch), so their code is what is checked
    assert all("from dmlkit.evaluation.metrics import TABLE_KEYS" in inspect.getsource(verb.run) for verb in (train, evaluate))
    (tmp_path / "metrics.json").write_text(json.dumps({key: 0.5 for key in SUMMARY_KEYS}))
    assert compare.comparison_table([str(tmp_path)]).splitlines()[0].split()[1:] == list(SUMMARY_KEYS)
    assert run_report.METRIC_NAMES is LABELS and figures.CURVE_METRICS is CURVES
    assert trainer.SELECTION_METRIC == study.OBJECTIVE == SELECTION_METRIC == "map_at_r"
    assert set(crossval.REPORTED) <= set(SUMMARY_KEYS) and "map_at_r" in crossval.REPORTED
    assert CURVES[0] == ("map_at_r", "MAP@R")


def test_table_keys_are_the_keys_evaluation_returns():
    import torch

    x, y = torch.randn(40, 4, dtype=torch.float64), torch.arange(40) % 5
    clustering = set(clustering_metrics(x, y, over_cluster=2, seed=0))  # nmi, ami and (over-clustered) nmi_plus
    computed = set(retrieval_metrics(x, y)) | set(verification_metrics(x, y)) | clustering
    assert set(TABLE_KEYS) <= computed
    assert len({m.key for m in METRICS}) == len(METRICS) and all(m.label for m in METRICS)
