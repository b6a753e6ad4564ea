"""The report's answer, metrics tables, curves figure and failure tables."""

from __future__ import annotations

import json

import numpy as np

from dmlkit.report import load_run
from dmlkit.report.figures import run_curves_figure
from dmlkit.report.run_reader import TestEmbeddings
from dmlkit.report.summary import answer_html, count_text, metrics_tables
from dmlkit.report.verification import confused_pairs, per_class_ap


def _with_step0_and_manifest(run_dir, kept_pretrained: bool):
    metrics = json.loads((run_dir / "metrics.json").read_text())
    metrics.update(best_step=0 if kept_pretrained else 40, kept_pretrained=kept_pretrained, steps=60,
                   num_impostor_pairs=123456, train_seconds=192.556)
    (run_dir / "metrics.json").write_text(json.dumps(metrics))
    step0 = {"kind": "eval", "split": "val", "step": 0, "time": 0.0, "map_at_r": 0.05, "recall_at_1": 0.3}
    (run_dir / "log.jsonl").write_text(json.dumps(step0) + "\n" + (run_dir / "log.jsonl").read_text())
    manifest = {"train": {"classes": 20, "size": 1234}, "val": {"classes": 5, "size": 300},
                "test": {"classes": 10, "size": 4321}}
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    return load_run(run_dir)


def test_answer_compares_with_the_untrained_embedding_and_says_what_was_kept(fake_run):
    run = _with_step0_and_manifest(fake_run("fine-tuned"), kept_pretrained=False)
    text = answer_html(run)
    # validation MAP@R at step 40 in the fake log: 0.1 + 0.12 * 40 / 60 = 0.18
    assert "Test MAP@R 0.220 and P@1 0.610 with the kept weights" in text
    assert "untrained embedding (step 0) scored validation MAP@R 0.050, the kept weights 0.180 (+0.130)" in text
    assert "training 20 classes / 1,234 images · validation 5 classes / 300 images · test 10 classes / 4,321" in text
    assert "Kept: the weights of step 40, the best validation MAP@R" in text
    kept = answer_html(_with_step0_and_manifest(fake_run("kept"), kept_pretrained=True))
    assert "Kept: the untrained (pretrained) embedding of step 0" in kept


def test_counters_have_thousands_separators_and_sit_apart_from_the_metrics(fake_run, page):
    run = _with_step0_and_manifest(fake_run("counters"), kept_pretrained=False)
    rows = {cells[0]: cells[1] for _, cells in page(metrics_tables(run)).rows}
    assert rows["impostor test pairs"] == "123,456" and rows["training time (s)"] == "192.6"
    assert rows["test"] == "10" and "4,321" in metrics_tables(run)
    assert count_text(1343) == "1,343" and count_text(6.0) == "6"


def test_curves_have_their_own_labelled_axes_and_mark_the_selected_step(fake_run):
    run = _with_step0_and_manifest(fake_run("curves"), kept_pretrained=False)
    fig, notes = run_curves_figure(run)
    assert notes == [] and len(fig.axes) == 4
    ylabels = [ax.get_ylabel() for ax in fig.axes]
    assert ylabels == ["val MAP@R", "val R@1", "training loss", "learning rate"]
    for ax in fig.axes:
        marks = [line for line in ax.lines if line.get_label() == "selected step 40"]
        assert len(marks) == 1 and list(marks[0].get_xdata()) == [40, 40]


def test_per_class_ap_and_confusions_match_loops():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), 5)
    x = rng.standard_normal((20, 3)) + labels[:, None] * 0.3
    classes, ap, counts = per_class_ap(TestEmbeddings(x.astype(np.float32), labels))
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    expected = []
    for c in range(4):  # AP@R of each query of class c, by a plain loop over its ranked neighbours
        values = []
        for q in np.flatnonzero(labels == c):
            order = [j for j in np.argsort(-(unit @ unit[q]), kind="stable") if j != q]
            r = int((labels == c).sum()) - 1
            hits, total = 0, 0.0
            for rank, j in enumerate(order[:r], start=1):
                if labels[j] == c:
                    hits += 1
                    total += hits / rank
            values.append(total / r)
        expected.append(np.mean(values))
    np.testing.assert_allclose(ap, expected, atol=1e-6)
    assert classes.tolist() == [0, 1, 2, 3] and counts.tolist() == [5, 5, 5, 5]
    first = np.array([1, 2, 0, 5, 4, 3])
    pair_labels = np.array([0, 1, 1, 2, 2, 0])
    # sample 0 (0) -> 1 (class 1); 1 (1) -> 2 (1) right; 2 (1) -> 0 (0); 3 (2) -> 5 (0); 4 -> 4 self-class; 5 (0) -> 3 (2)
    assert confused_pairs(pair_labels, first) == [(0, 1, 2), (0, 2, 2)]
