"""PML's ways to extend AccuracyCalculator: calculate_<name> subclasses, knn_func, kmeans_func,
label_comparison_fn, integer embeddings; checked against brute-force loops and the fast path."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from sklearn.metrics import adjusted_mutual_info_score

from dmlkit.evaluation import AccuracyCalculator

KNN_METRICS = ("mean_average_precision", "mean_average_precision_at_r", "mean_reciprocal_rank", "precision_at_1",
               "r_precision")


def data(n=60, dim=4, classes=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, classes, (n,), generator=g)
    x = torch.randn(classes, dim, generator=g, dtype=torch.float64)[labels] + torch.randn(n, dim, generator=g, dtype=torch.float64)
    return x, labels


def brute_neighbours(query, reference, k, leave_out_self):
    """Reference indices of each query sorted by (distance, index), a plain loop."""
    out = []
    for i in range(len(query)):
        scored = sorted((float(((query[i] - reference[j]) ** 2).sum()), j) for j in range(len(reference))
                        if not (leave_out_self and j == i))
        out.append([j for _, j in scored[:k]])
    return out


class WithPrecisionAt2(AccuracyCalculator):
    def calculate_precision_at_2(self, knn_labels, query_labels, **kwargs):
        return float((knn_labels[:, :2] == query_labels[:, None]).double().mean())

    def requires_knn(self):
        return super().requires_knn() + ["precision_at_2"]


def test_function_dict_lists_builtins_and_subclass_metrics():
    assert set(AccuracyCalculator().get_function_dict()) == set(KNN_METRICS) | {"AMI", "NMI"}
    calc = WithPrecisionAt2(include=("precision_at_1", "precision_at_2"))
    assert list(calc.get_function_dict()) == ["precision_at_1", "precision_at_2"]
    assert list(calc.get_function_dict(exclude=("precision_at_1",))) == ["precision_at_2"]


def test_subclass_metric_matches_a_brute_force_loop():
    x, labels = data()
    calc = WithPrecisionAt2(include=("precision_at_2", "precision_at_1"))
    acc = calc.get_accuracy(x, labels)
    nbrs = brute_neighbours(x, x, 2, leave_out_self=True)
    hits = [sum(int(labels[j] == labels[i]) for j in nbrs[i]) for i in range(len(x))]
    assert acc["precision_at_2"] == pytest.approx(sum(hits) / (2 * len(x)), abs=1e-6)
    assert acc["precision_at_1"] == pytest.approx(AccuracyCalculator(include=("precision_at_1",)).get_accuracy(x, labels)
                                                  ["precision_at_1"], abs=1e-6)


def test_general_path_equals_the_fast_path_on_builtin_metrics():
    x, labels = data(seed=3)
    q, ql = x[:25], labels[:25]
    for ref_includes_query, ref, rl in ((False, x[25:], labels[25:]), (True, x, labels)):
        for k in (None, 3, "max_bin_count"):
            fast = AccuracyCalculator(include=KNN_METRICS, k=k).get_accuracy(q, ql, ref, rl, ref_includes_query)
            general = WithPrecisionAt2(include=KNN_METRICS, k=k).get_accuracy(q, ql, ref, rl, ref_includes_query)
            assert fast.keys() == general.keys()
            for m in fast:
                assert general[m] == pytest.approx(fast[m], abs=1e-6), (m, k, ref_includes_query)


def test_knn_func_is_called_with_pmls_arguments_and_its_neighbours_used():
    x, labels = data(seed=1)
    calls = []

    def farthest_first(query, k, reference, ref_includes_query):
        calls.append((tuple(query.shape), k, tuple(reference.shape), ref_includes_query))
        d = torch.cdist(query.double(), reference.double())
        order = d.argsort(dim=1, descending=True)[:, :k]  # deliberately the farthest references
        return d.gather(1, order), order

    acc = AccuracyCalculator(include=("precision_at_1",), k=5, knn_func=farthest_first).get_accuracy(
        x[:20], labels[:20], x[20:], labels[20:])
    assert calls == [((20, 4), 5, (40, 4), False)]
    far = [max(range(40), key=lambda j: float(((x[i] - x[20 + j]) ** 2).sum())) for i in range(20)]
    expected = np.mean([int(labels[20 + far[i]] == labels[i]) for i in range(20)])
    assert acc["precision_at_1"] == pytest.approx(expected)


def test_kmeans_func_is_used_for_the_clustering_metrics():
    x, labels = data(seed=2)
    seen = []

    def fixed_clusters(query, num_clusters):
        seen.append((tuple(query.shape), num_clusters))
        return np.arange(len(query)) % num_clusters

    acc = AccuracyCalculator(include=("AMI",), kmeans_func=fixed_clusters).get_accuracy(x, labels)
    assert seen == [((60, 4), len(torch.unique(labels)))]
    assert acc["AMI"] == pytest.approx(adjusted_mutual_info_score(labels.numpy(), np.arange(60) % len(torch.unique(labels))))


def test_integer_embeddings_give_the_float_result():
    x, labels = data(seed=4)
    ints = (x * 10).round().long()
    assert AccuracyCalculator(include=KNN_METRICS).get_accuracy(ints, labels) == \
        AccuracyCalculator(include=KNN_METRICS).get_accuracy(ints.float(), labels)
    assert AccuracyCalculator(include=KNN_METRICS).get_accuracy(ints.numpy(), labels.numpy()) == \
        AccuracyCalculator(include=KNN_METRICS).get_accuracy(ints.float(), labels)


def test_custom_label_comparison_on_two_column_labels_matches_a_loop():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(30, 3, generator=g, dtype=torch.float64)
    labels = torch.stack([torch.randint(0, 3, (30,), generator=g), torch.randint(0, 2, (30,), generator=g)], dim=1)

    def same_first(a, b):
        return a[..., 0] == b[..., 0]

    acc = AccuracyCalculator(include=("precision_at_1", "r_precision"), label_comparison_fn=same_first).get_accuracy(
        x, labels)
    nbrs = brute_neighbours(x, x, 29, leave_out_self=True)
    p1, rp = [], []
    for i in range(30):
        # PML's R: references whose label row equals the query's label row (the class size), less the query
        r = sum(bool(same_first(labels[i : i + 1], labels[j : j + 1])) for j in range(30) if j != i)
        if r == 0:
            continue
        matches = [bool(labels[j, 0] == labels[i, 0]) for j in nbrs[i]]
        p1.append(matches[0])
        rp.append(sum(matches[:r]) / r)
    assert acc["precision_at_1"] == pytest.approx(np.mean(p1))
    assert acc["r_precision"] == pytest.approx(np.mean(rp))


def test_k_below_the_largest_class_warns_for_r_metrics(caplog):
    x, labels = data()
    with caplog.at_level(logging.INFO):
        AccuracyCalculator(include=("r_precision",), k=2).get_accuracy(x, labels)
    assert any(r.levelno == logging.WARNING and "max_bin_count" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        AccuracyCalculator(include=("precision_at_1",), k=2).get_accuracy(x, labels)
    assert not any(r.levelno >= logging.WARNING for r in caplog.records)
