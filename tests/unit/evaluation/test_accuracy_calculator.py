"""dmlkit's AccuracyCalculator returns PML's keys and PML's values (exact k-NN on both sides)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pytorch_metric_learning.distances import LpDistance
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator as PMLAccuracyCalculator
from pytorch_metric_learning.utils.inference import CustomKNN

from dmlkit.evaluation import AccuracyCalculator
from dmlkit.exceptions import DataError, InvalidParameterError

KNN_METRICS = ("mean_average_precision", "mean_average_precision_at_r", "mean_reciprocal_rank", "precision_at_1",
               "r_precision")


def clustered(n=120, dim=6, classes=8, spread=1.5, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, classes, (n,), generator=g)
    centers = torch.randn(classes, dim, generator=g, dtype=torch.float64) * spread
    x = centers[labels] + torch.randn(n, dim, generator=g, dtype=torch.float64)
    return x.to(dtype), labels


def pml_calculator(**kwargs):
    # brute-force Euclidean k-NN: PML's exact reference (faiss would also do, this avoids its float32 ties)
    return PMLAccuracyCalculator(device=torch.device("cpu"), knn_func=CustomKNN(LpDistance(normalize_embeddings=False)),
                                 **kwargs)


def assert_same(ours: dict, theirs: dict):
    assert list(ours) == sorted(theirs, key=list(ours).index) and set(ours) == set(theirs)
    for key in theirs:
        np.testing.assert_allclose(ours[key], theirs[key], rtol=1e-6, atol=1e-9, err_msg=key)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("options", [{}, {"avg_of_avgs": True}, {"return_per_class": True}, {"k": "max_bin_count"}, {"k": 5}])
def test_leave_one_out_matches_pml(options, dtype):
    x, y = clustered(dtype=dtype)
    ours = AccuracyCalculator(include=KNN_METRICS, **options).get_accuracy(x, y)
    theirs = pml_calculator(include=KNN_METRICS, **options).get_accuracy(x, y)
    assert_same(ours, theirs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_separate_gallery_and_lone_queries_match_pml(dtype):
    q, qy = clustered(n=60, seed=1, dtype=dtype)
    r, ry = clustered(n=90, seed=2, dtype=dtype)
    ry[ry == 3] = 4  # class 3 has no reference: its queries are "lone" and left out
    ours = AccuracyCalculator(include=KNN_METRICS).get_accuracy(q, qy, r, ry)
    theirs = pml_calculator(include=KNN_METRICS).get_accuracy(q, qy, r, ry)
    assert_same(ours, theirs)
    assert ours["precision_at_1"] < 1.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_leave_one_out_with_lone_queries_matches_pml(dtype):
    # two classes of one sample: their queries are left out, the others still search all 120 rows
    x, y = clustered(dtype=dtype, seed=5)
    y[7], y[30] = 100, 101
    ours = AccuracyCalculator(include=KNN_METRICS, k="max_bin_count").get_accuracy(x, y)
    theirs = pml_calculator(include=KNN_METRICS, k="max_bin_count").get_accuracy(x, y)
    assert_same(ours, theirs)


def test_reference_that_includes_the_query_matches_pml():
    q, qy = clustered(n=50, seed=3)
    extra, ey = clustered(n=30, seed=4)
    r, ry = torch.cat([q, extra]), torch.cat([qy, ey])
    ours = AccuracyCalculator(include=KNN_METRICS).get_accuracy(q, qy, r, ry, ref_includes_query=True)
    theirs = pml_calculator(include=KNN_METRICS).get_accuracy(q, qy, r, ry, ref_includes_query=True)
    assert_same(ours, theirs)


def test_clustering_metrics_match_pml_and_all_keys_are_pmls():
    x, y = clustered(n=200, spread=6.0, seed=5, dtype=torch.float32)
    ours = AccuracyCalculator().get_accuracy(x, y)
    theirs = PMLAccuracyCalculator(device=torch.device("cpu")).get_accuracy(x, y)
    assert set(ours) == set(theirs) == {"AMI", "NMI", *KNN_METRICS}
    for key in ("AMI", "NMI"):
        assert ours[key] == pytest.approx(theirs[key], abs=1e-6)
    assert AccuracyCalculator(exclude=("AMI", "NMI")).get_accuracy(x, y).keys() == set(KNN_METRICS)
    assert list(AccuracyCalculator().get_accuracy(x, y, include=("precision_at_1",))) == ["precision_at_1"]


def test_known_values_on_a_hand_made_ranking():
    # 1-D points: ranking of each query is by distance; two classes of three
    x = torch.tensor([[0.0], [1.0], [5.0], [2.0], [6.0], [7.0]])
    y = torch.tensor([0, 0, 1, 0, 1, 1])
    out = AccuracyCalculator(include=("precision_at_1", "r_precision", "mean_average_precision_at_r")).get_accuracy(x, y)
    # query 2 (x=5): neighbours 6(1), 7(1) -> both relevant; query 3 (x=2): 1(0), 0(0) -> both relevant ...
    assert out["precision_at_1"] == 1.0 and out["r_precision"] == 1.0 and out["mean_average_precision_at_r"] == 1.0
    y2 = torch.tensor([0, 1, 1, 0, 1, 0])
    out = AccuracyCalculator(include=("precision_at_1",), return_per_class=True).get_accuracy(x, y2)
    # class 0: x=0 -> 1.0 (label 1) miss, x=2 -> 1.0 miss, x=7 -> 6.0 miss; class 1: x=1 -> 0 miss, x=5 -> 6 hit, x=6 -> 5/7 tie -> 5 hit
    assert out["precision_at_1"] == [0.0, pytest.approx(2 / 3)]


def test_bad_arguments_are_named():
    with pytest.raises(InvalidParameterError, match="unknown metrics \\['map'\\]"):
        AccuracyCalculator(include=("map",))
    with pytest.raises(InvalidParameterError, match="mutually exclusive"):
        AccuracyCalculator(avg_of_avgs=True, return_per_class=True)
    with pytest.raises(InvalidParameterError, match="'k' parameter of AccuracyCalculator"):
        AccuracyCalculator(k=0)
    with pytest.raises(InvalidParameterError, match="The 'knn_func' parameter of AccuracyCalculator must be callable"):
        AccuracyCalculator(knn_func="faiss")
    with pytest.raises(NotImplementedError, match="label_comparison_fn"):
        AccuracyCalculator(label_comparison_fn=torch.eq)  # clustering metrics are included by default
    with pytest.raises(DataError, match="same length"):
        AccuracyCalculator().get_accuracy(torch.randn(5, 2), torch.zeros(4))
    with pytest.raises(DataError, match="ref_includes_query"):
        AccuracyCalculator().get_accuracy(torch.randn(5, 2), torch.zeros(5), torch.randn(5, 2), torch.zeros(5),
                                          ref_includes_query=True)
