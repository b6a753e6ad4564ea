"""Retrieval metrics: worked examples, PML's AccuracyCalculator, both modes and both backends."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

from dmlkit.evaluation import retrieval_metrics, true_reference_counts
from dmlkit.exceptions import DataError, InvalidParameterError

BACKENDS = ("torch", "faiss")


def line(*xs):
    return torch.tensor(xs, dtype=torch.float32).unsqueeze(1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_leave_one_out_worked_example(backend):
    # x = 0, 1, 2, 10 with labels 0, 1, 0, 0.  Label 0 has R = 2, the single label-1 sample R = 0.
    # q0 (x=0):  neighbours 1 (lbl 1), 2 (lbl 0), 10 (lbl 0) -> hits 0 1 1: P@1 0, RP 1/2, MAP (0 + 1/2)/2 = 1/4
    # q2 (x=2):  neighbours 1 (lbl 1), 0 (lbl 0), 10 (lbl 0) -> hits 0 1 1: P@1 0, RP 1/2, MAP 1/4
    # q3 (x=10): neighbours 2 (lbl 0), 1 (lbl 1), 0 (lbl 0)  -> hits 1 0 1: P@1 1, RP 1/2, MAP (1 + 0)/2 = 1/2
    # q1 is excluded (no true reference). Means over 3 queries.
    out = retrieval_metrics(line(0, 1, 2, 10), torch.tensor([0, 1, 0, 0]), ks=(1, 2), backend=backend)
    assert out["num_queries_excluded"] == 1
    assert out["precision_at_1"] == pytest.approx(1 / 3)
    assert out["recall_at_1"] == pytest.approx(1 / 3)
    assert out["recall_at_2"] == pytest.approx(1.0)
    assert out["r_precision"] == pytest.approx(1 / 2)
    assert out["map_at_r"] == pytest.approx((1 / 4 + 1 / 4 + 1 / 2) / 3)
    assert all(isinstance(v, float) for key, v in out.items() if key != "num_queries_excluded")
    assert isinstance(out["num_queries_excluded"], int)


@pytest.mark.parametrize("backend", BACKENDS)
def test_query_to_gallery_worked_example(backend):
    # q0 (x=0, lbl 0): gallery 1 (lbl 0), 2 (lbl 1), 4 (lbl 0); R = 2 -> hits 1 0 1: P@1 1, RP 1/2, MAP 1/2
    # q1 (x=5, lbl 2): no gallery sample has label 2 -> excluded.
    out = retrieval_metrics(
        line(0, 5), torch.tensor([0, 2]), reference=line(1, 2, 4), reference_labels=torch.tensor([0, 1, 0]),
        ks=(1, 8), backend=backend,
    )
    assert out["num_queries_excluded"] == 1
    assert out["precision_at_1"] == 1.0 and out["recall_at_8"] == 1.0
    assert out["r_precision"] == pytest.approx(0.5) and out["map_at_r"] == pytest.approx(0.5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_distance_ties_favour_no_class_by_index_order(backend):
    # 200 identical embeddings listed class by class (as data sets list their images): a class of 60,
    # then 20 classes of 7. Every other sample is a tied nearest neighbour, so P@1 must be what chance
    # gives, (60*59 + 20*7*6) / (200*199) = 0.110; ties by the smaller index gave 0.30 (the big first
    # class always found itself at index 0).
    x = torch.zeros(200, 4)
    labels = torch.cat([torch.zeros(60, dtype=torch.int64), torch.arange(1, 21).repeat_interleave(7)])
    out = retrieval_metrics(x, labels, ks=(1,), backend=backend)
    assert abs(out["precision_at_1"] - (60 * 59 + 20 * 7 * 6) / (200 * 199)) < 0.08
    assert retrieval_metrics(x, labels, ks=(1,), backend=backend) == out  # a fixed order: deterministic
    # query -> gallery: 50 queries of the first class and 50 of the others; chance 0.1675, index order 0.5
    queries = torch.cat([torch.zeros(50, dtype=torch.int64), torch.arange(1, 21).repeat(3)[:50]])
    gallery_out = retrieval_metrics(torch.zeros(100, 4), queries, reference=x, reference_labels=labels,
                                    ks=(1,), backend=backend)
    assert abs(gallery_out["precision_at_1"] - (0.3 * 50 + 0.035 * 50) / 100) < 0.1


def test_a_single_class_warns_that_the_metrics_mean_nothing():
    x = torch.randn(6, 3, generator=torch.Generator().manual_seed(0))
    with pytest.warns(UserWarning, match=r"single class .* 1 by construction"):
        out = retrieval_metrics(x, torch.zeros(6, dtype=torch.int64), ks=(1,))
    assert out["precision_at_1"] == 1.0


def clustered(n_classes, per_class, dim, seed, spread=1.2):
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n_classes).repeat_interleave(per_class)
    labels = labels[torch.randperm(len(labels), generator=g)]
    x = torch.randn(n_classes, dim, generator=g)[labels] + spread * torch.randn(len(labels), dim, generator=g)
    return x, labels


PML_KEYS = {"precision_at_1": "precision_at_1", "r_precision": "r_precision", "map_at_r": "mean_average_precision_at_r"}


def pml(query, labels, reference=None, reference_labels=None):
    calc = AccuracyCalculator(include=tuple(PML_KEYS.values()), k="max_bin_count", device=torch.device("cpu"))
    if reference is None:
        return calc.get_accuracy(query, labels)
    return calc.get_accuracy(query, labels, reference, reference_labels, ref_includes_query=False)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("normalized", [False, True])
def test_leave_one_out_matches_pml(backend, normalized):
    x, labels = clustered(150, 5, 16, seed=3)
    labels[:7] = 1000 + torch.arange(7)  # a few singleton classes -> excluded queries
    if normalized:
        x = torch.nn.functional.normalize(x, dim=1)
    ours = retrieval_metrics(x, labels, backend=backend, metric="cosine" if normalized else "euclidean")
    ref = pml(x, labels)
    for ours_key, pml_key in PML_KEYS.items():
        assert ours[ours_key] == pytest.approx(ref[pml_key], abs=1e-6)
    assert ours["num_queries_excluded"] == 7


@pytest.mark.parametrize("backend", BACKENDS)
def test_query_to_gallery_matches_pml(backend):
    x, labels = clustered(100, 8, 12, seed=4)
    q, ql, g, gl = x[:300], labels[:300], x[300:], labels[300:]
    ours = retrieval_metrics(q, ql, reference=g, reference_labels=gl, backend=backend)
    ref = pml(q, ql, g, gl)
    for ours_key, pml_key in PML_KEYS.items():
        assert ours[ours_key] == pytest.approx(ref[pml_key], abs=1e-6)


@pytest.mark.parametrize("leave_one_out", [True, False])
def test_multi_tile_search_matches_pml(monkeypatch, leave_one_out):
    # tiny tiles: many blocks above the diagonal, threshold filtering, per-worker tops and their union
    import importlib

    knn_module = importlib.import_module("dmlkit.evaluation.knn")
    monkeypatch.setattr(knn_module, "TILE_ROWS", 32)
    monkeypatch.setattr(knn_module, "TILE_COLS", 64)
    monkeypatch.setattr(knn_module, "FILTER_GROUP", 8)
    x, labels = clustered(120, 5, 16, seed=7)
    x = torch.nn.functional.normalize(x, dim=1)
    if leave_one_out:
        ours, ref = retrieval_metrics(x, labels), pml(x, labels)
    else:
        q, ql, g, gl = x[:250], labels[:250], x[250:], labels[250:]
        ours, ref = retrieval_metrics(q, ql, reference=g, reference_labels=gl), pml(q, ql, g, gl)
    for ours_key, pml_key in PML_KEYS.items():
        assert ours[ours_key] == pytest.approx(ref[pml_key], abs=1e-6)


def test_recall_at_k_matches_loop_definition():
    x, labels = clustered(40, 4, 8, seed=5, spread=2.0)
    out = retrieval_metrics(x, labels, ks=(1, 3, 5))
    d = torch.cdist(x.double(), x.double())
    d.fill_diagonal_(float("inf"))
    order = d.argsort(dim=1, stable=True)
    for k in (1, 3, 5):
        hit = [(labels[order[i, :k]] == labels[i]).any().item() for i in range(len(x))]
        assert out[f"recall_at_{k}"] == pytest.approx(sum(hit) / len(hit))


def test_backends_agree_and_metrics_in_unit_interval():
    x, labels = clustered(60, 6, 10, seed=6, spread=3.0)
    a = retrieval_metrics(x, labels, backend="torch", metric="dot")
    b = retrieval_metrics(x, labels, backend="faiss", metric="dot")
    assert a == b
    assert all(0.0 <= v <= 1.0 for key, v in a.items() if key != "num_queries_excluded")


@settings(max_examples=20, deadline=None)
@given(
    labels=st.lists(st.integers(0, 4), min_size=2, max_size=25),
    seed=st.integers(0, 2**16),
)
def test_invariant_to_relabelling_and_bounded(labels, seed):
    labels = torch.tensor(labels)
    x = torch.randn(len(labels), 3, generator=torch.Generator().manual_seed(seed))
    out = retrieval_metrics(x, labels)
    relabelled = retrieval_metrics(x, labels * 7 + 100)
    assert out == relabelled or all(
        (v != v and relabelled[k] != relabelled[k]) or v == relabelled[k] for k, v in out.items()
    )
    r = true_reference_counts(labels, labels, leave_one_out=True)
    assert out["num_queries_excluded"] == int((r == 0).sum())
    assert all(v != v or 0.0 <= v <= 1.0 for key, v in out.items() if key != "num_queries_excluded")


def test_bad_input_errors():
    x, labels = torch.randn(5, 3), torch.tensor([0, 0, 1, 1, 2])
    bad = x.clone()
    bad[2, 0] = float("inf")
    with pytest.raises(DataError, match="NaN or infinite"):
        retrieval_metrics(bad, labels)
    with pytest.raises(DataError, match="embeddings has 5 rows but labels has 4"):
        retrieval_metrics(x, labels[:4])
    with pytest.raises(DataError, match="at least two samples"):
        retrieval_metrics(x[:1], labels[:1])
    with pytest.raises(InvalidParameterError, match="reference was given without reference_labels"):
        retrieval_metrics(x, labels, reference=x)
    with pytest.raises(InvalidParameterError, match="'ks' parameter"):
        retrieval_metrics(x, labels, ks=(0,))
    with pytest.raises(InvalidParameterError, match="'metric' parameter of retrieval_metrics"):
        retrieval_metrics(x, labels, metric="manhattan")
