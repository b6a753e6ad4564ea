"""PML's module-level accuracy functions (``utils.accuracy_calculator``) under dmlkit: the same names, arguments and
values as PML's own, on random neighbour labels with ties, lone classes and several label components; and
against float64 references written from the metric definitions (Musgrave et al. 2020, Sec. 3.2)."""

from __future__ import annotations

import math

import pytest
import torch
from pytorch_metric_learning.utils import accuracy_calculator as pml

from dmlkit.evaluation import accuracy_calculator as dml
from dmlkit.evaluation.accuracy_calculator import AccuracyCalculator

ALL = ("get_label_match_counts", "get_lone_query_labels", "get_relevance_mask", "get_unique_labels",
       "maybe_get_avg_of_avgs", "mean_average_precision", "mean_reciprocal_rank", "nan_accuracy", "precision_at_k",
       "r_precision", "try_getting_not_lone_labels")


def test_every_pml_function_is_importable_from_the_same_module_name():
    for name in ALL:
        assert callable(getattr(dml, name)), name
    assert dml.EQUALITY is torch.eq


def neighbours(seed: int, queries: int = 40, references: int = 60, classes: int = 7, k: int = 12,
               ref_includes_query: bool = False):
    g = torch.Generator().manual_seed(seed)
    query_labels = torch.randint(0, classes, (queries,), generator=g)
    reference_labels = torch.randint(0, classes + 2, (references,), generator=g)  # some classes never queried
    if ref_includes_query:
        reference_labels = torch.cat([query_labels, reference_labels])
    knn_labels = reference_labels[torch.randint(0, len(reference_labels), (queries, k), generator=g)]
    return query_labels, reference_labels, knn_labels


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("ref_includes_query", [False, True])
@pytest.mark.parametrize("averaging", ["samples", "avg_of_avgs", "per_class"])
def test_each_metric_equals_pmls(seed, ref_includes_query, averaging):
    avg, per_class = averaging == "avg_of_avgs", averaging == "per_class"
    query_labels, reference_labels, knn_labels = neighbours(seed, ref_includes_query=ref_includes_query)
    ours_counts = dml.get_label_match_counts(query_labels, reference_labels, dml.EQUALITY)
    theirs_counts = pml.get_label_match_counts(query_labels, reference_labels, pml.EQUALITY)
    for a, b in zip(ours_counts, theirs_counts):
        assert torch.equal(a, b)
    gt = query_labels[:, None]
    for name, args in (
        ("r_precision", (ref_includes_query, theirs_counts, avg, per_class, torch.eq)),
        ("mean_average_precision", (ref_includes_query, theirs_counts, avg, per_class, torch.eq)),
        ("mean_reciprocal_rank", (avg, per_class, torch.eq)),
    ):
        ours, theirs = getattr(dml, name)(knn_labels, gt, *args), getattr(pml, name)(knn_labels, gt, *args)
        tolerance = 1e-6 if name == "mean_reciprocal_rank" else 1e-12  # PML's reciprocal ranks are float32
        assert ours == pytest.approx(theirs, abs=tolerance), name
    at_r = (ref_includes_query, theirs_counts, avg, per_class, torch.eq, True)
    assert dml.mean_average_precision(knn_labels, gt, *at_r) == pytest.approx(
        pml.mean_average_precision(knn_labels, gt, *at_r), abs=1e-12)
    for k in (1, 5, 12):
        assert dml.precision_at_k(knn_labels, gt, k, avg, per_class, torch.eq) == pytest.approx(
            pml.precision_at_k(knn_labels, gt, k, avg, per_class, torch.eq), abs=1e-12)


@pytest.mark.parametrize("ref_includes_query", [False, True])
def test_lone_labels_relevance_mask_and_filtering_equal_pmls(ref_includes_query):
    query_labels = torch.tensor([0, 0, 1, 2, 3, 3, 4])
    reference_labels = torch.tensor([0, 0, 1, 3, 3, 3, 5]) if not ref_includes_query else torch.cat(
        [query_labels, torch.tensor([0, 3, 5])])
    counts = pml.get_label_match_counts(query_labels, reference_labels, pml.EQUALITY)
    ours = dml.get_lone_query_labels(query_labels, counts, ref_includes_query, dml.EQUALITY)
    theirs = pml.get_lone_query_labels(query_labels, counts, ref_includes_query, pml.EQUALITY)
    assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1])
    knn_labels = reference_labels[:len(query_labels) * 4].reshape(-1, 4) if len(reference_labels) >= 28 else \
        torch.randint(0, 5, (len(query_labels), 4), generator=torch.Generator().manual_seed(0))
    mask_ours, r_ours = dml.get_relevance_mask(knn_labels.shape, query_labels[:, None], ref_includes_query, counts)
    mask_theirs, r_theirs = pml.get_relevance_mask(knn_labels.shape, query_labels[:, None], ref_includes_query, counts)
    assert torch.equal(mask_ours, mask_theirs)
    assert torch.equal(r_ours, r_theirs.clamp_min(0))  # PML's count of a class with no other reference is -1
    kept_ours = dml.try_getting_not_lone_labels(knn_labels, query_labels, ours[1])
    kept_theirs = pml.try_getting_not_lone_labels(knn_labels, query_labels, theirs[1])
    assert all(torch.equal(a, b) for a, b in zip(kept_ours, kept_theirs))
    assert dml.try_getting_not_lone_labels(knn_labels, query_labels, torch.zeros(7, dtype=torch.bool)) == (None, None)
    assert dml.nan_accuracy(torch.arange(3), True) == pytest.approx([math.nan] * 3, nan_ok=True)
    assert math.isnan(dml.nan_accuracy(torch.arange(3), False))


def test_labels_of_several_components_with_a_custom_comparison_equal_pmls():
    """Multi-label rows compared by 'share the first component': PML calls the function once per unique label."""
    g = torch.Generator().manual_seed(3)
    query_labels = torch.randint(0, 4, (30, 2), generator=g)
    reference_labels = torch.randint(0, 4, (50, 2), generator=g)

    def first_component(a, b):
        return a[..., 0] == b[..., 0]

    ours = dml.get_label_match_counts(query_labels, reference_labels, first_component)
    theirs = pml.get_label_match_counts(query_labels, reference_labels, first_component)
    assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1])
    knn_labels = reference_labels[torch.randint(0, 50, (30, 6), generator=g)]
    gt = query_labels[:, None]
    assert dml.precision_at_k(knn_labels, gt, 3, False, False, first_component) == pytest.approx(
        pml.precision_at_k(knn_labels, gt, 3, False, False, first_component))
    assert dml.mean_reciprocal_rank(knn_labels, gt, True, False, first_component) == pytest.approx(
        pml.mean_reciprocal_rank(knn_labels, gt, True, False, first_component))


def test_values_match_a_float64_reference_from_the_definitions():
    """One query of class 0 with R = 3 others; neighbours 0, 1, 0, 0, 1: MAP@R = (1/1 + 2/3) / 3, MAP over
    k = 5 = (1 + 2/3 + 3/4) / 3, R-precision = 2/3, MRR = 1, precision@2 = 1/2."""
    knn_labels = torch.tensor([[0, 1, 0, 0, 1]])
    gt = torch.tensor([[0]])
    counts = (torch.tensor([0]), torch.tensor([3]))
    assert dml.mean_average_precision(knn_labels, gt, False, counts, False, False, torch.eq, True) == pytest.approx(
        (1 + 2 / 3) / 3, abs=1e-15)
    assert dml.mean_average_precision(knn_labels, gt, False, counts, False, False, torch.eq) == pytest.approx(
        (1 + 2 / 3 + 3 / 4) / 3, abs=1e-15)
    assert dml.r_precision(knn_labels, gt, False, counts, False, False, torch.eq) == pytest.approx(2 / 3, abs=1e-15)
    assert dml.mean_reciprocal_rank(torch.tensor([[1, 1, 0]]), gt, False, False, torch.eq) == pytest.approx(1 / 3)
    assert dml.precision_at_k(knn_labels, gt, 2, False, False, torch.eq) == 0.5


class PrecisionAt2(AccuracyCalculator):
    """PML's documented way to add a metric: a ``calculate_`` method built on the module's functions."""

    def calculate_precision_at_2(self, knn_labels, query_labels, **kwargs):
        return dml.precision_at_k(knn_labels, query_labels[:, None], 2, self.avg_of_avgs, self.return_per_class,
                                  self.label_comparison_fn or dml.EQUALITY)

    def requires_knn(self):
        return super().requires_knn() + ["precision_at_2"]


def test_a_pml_style_custom_metric_built_on_the_functions_runs_in_the_calculator():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(80, 8, generator=g)
    labels = torch.randint(0, 5, (80,), generator=g)
    result = PrecisionAt2(include=("precision_at_1", "precision_at_2"), k=10).get_accuracy(x, labels)
    distances = torch.cdist(x, x).fill_diagonal_(math.inf)
    nearest = labels[distances.topk(2, largest=False).indices]
    assert result["precision_at_2"] == pytest.approx((nearest == labels[:, None]).double().mean().item())
    assert result["precision_at_1"] == pytest.approx((nearest[:, 0] == labels).double().mean().item())
