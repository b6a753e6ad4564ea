"""Queries that are also gallery items (a CSV's is_query/is_gallery): a hand-computed example, per-category metrics."""

import pytest
import torch

from dmlkit.evaluation import (
    own_reference_rows,
    query_gallery_union,
    retrieval_metrics,
    retrieval_metrics_per_group,
)

# Six rows on a line: (position, label, is_query, is_gallery, category). Worked by hand (MAP@R, P@1, R-precision):
#   row 0 (A, 0.0) excludes itself; gallery order 1(A) 2(B) 4(A) 3(B), R=2: AP=(1/1)/2=0.5,  P@1=1, RP=1/2
#   row 1 (A, 1.0) excludes itself; 2(B) 0(A) 4(A) 3(B),          R=2: AP=(1/2)/2=0.25, P@1=0, RP=1/2
#   row 3 (B, 3.0) excludes itself; 4(A) 2(B) 1(A) 0(A),          R=1: AP=0,            P@1=0, RP=0
#   row 5 (B, 3.5) not in the gallery; 3(B) 4(A) 2(B) 1(A) 0(A),  R=2: AP=(1/1)/2=0.5,  P@1=1, RP=1/2
ROWS = [(0.0, 0, 1, 1, "shoes"), (1.0, 0, 1, 1, "shoes"), (1.6, 1, 0, 1, "bags"), (3.0, 1, 1, 1, "bags"),
        (2.1, 0, 0, 1, "shoes"), (3.5, 1, 1, 0, "bags")]
EXPECTED = {"map_at_r": (0.5 + 0.25 + 0 + 0.5) / 4, "precision_at_1": 2 / 4, "r_precision": 1.5 / 4, "recall_at_2": 1.0}
PER_CATEGORY = {"shoes": {"map_at_r": 0.375, "precision_at_1": 0.5}, "bags": {"map_at_r": 0.25, "precision_at_1": 0.5}}


def split(rows=ROWS):
    queries = [i for i, r in enumerate(rows) if r[2]]
    gallery = [i for i, r in enumerate(rows) if r[3]]
    x = torch.tensor([[r[0]] for r in rows], dtype=torch.float64)
    y = torch.tensor([r[1] for r in rows])
    own = own_reference_rows(queries, gallery)  # row numbers as the identity (the trainer uses image paths)
    return x[queries], y[queries], x[gallery], y[gallery], own, [rows[i][4] for i in queries]


def test_own_reference_rows_names_each_querys_gallery_row():
    assert own_reference_rows(["a", "b", "z"], ["b", "c", "a"]).tolist() == [2, 0, -1]


def test_hand_computed_example_excludes_each_querys_own_image():
    q, ql, g, gl, own, _ = split()
    metrics = retrieval_metrics(q, ql, reference=g, reference_labels=gl, ks=(1, 2), own_reference=own)
    for name, value in EXPECTED.items():
        assert metrics[name] == pytest.approx(value), name
    assert metrics["num_queries_excluded"] == 0
    naive = retrieval_metrics(q, ql, reference=g, reference_labels=gl, ks=(1, 2))  # each query finds itself first
    assert naive["precision_at_1"] == pytest.approx(1.0)


def test_per_category_metrics_are_the_overall_metric_on_that_categorys_queries():
    q, ql, g, gl, own, categories = split()
    per = retrieval_metrics_per_group(q, ql, categories, reference=g, reference_labels=gl, ks=(1, 2),
                                      own_reference=own)
    assert list(per) == ["bags", "shoes"]
    for name, expected in PER_CATEGORY.items():
        for key, value in expected.items():
            assert per[name][key] == pytest.approx(value), (name, key)
        rows = torch.tensor([c == name for c in categories])
        alone = retrieval_metrics(q[rows], ql[rows], reference=g, reference_labels=gl, ks=(1, 2),
                                  own_reference=own[rows])
        assert per[name]["map_at_r"] == pytest.approx(alone["map_at_r"])


def test_leave_one_out_per_group_means_match_the_overall_metric():
    torch.manual_seed(0)
    x, y = torch.randn(40, 4), torch.arange(40) % 5
    groups = ["even" if int(c) % 2 == 0 else "odd" for c in y]
    per = retrieval_metrics_per_group(x, y, groups)
    overall = retrieval_metrics(x, y)
    n_even = sum(g == "even" for g in groups)
    mean = (per["even"]["map_at_r"] * n_even + per["odd"]["map_at_r"] * (40 - n_even)) / 40
    assert mean == pytest.approx(overall["map_at_r"])


def test_union_counts_an_image_both_query_and_gallery_once():
    q, ql, g, gl, own, _ = split()
    both, labels = query_gallery_union(q, ql, g, gl, own)
    assert sorted(both.flatten().tolist()) == sorted(r[0] for r in ROWS) and len(labels) == 6
