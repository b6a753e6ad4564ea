"""Ensemble concatenation and the merged evaluate() dictionary."""

from __future__ import annotations

import pytest
import torch

from dmlkit.evaluation import (
    clustering_metrics,
    concatenate_embeddings,
    ensemble_retrieval_metrics,
    evaluate,
    retrieval_metrics,
    verification_metrics,
)
from dmlkit.exceptions import DataError, InvalidParameterError


def test_concatenation_normalises_each_model():
    g = torch.Generator().manual_seed(0)
    parts = [torch.randn(10, 4, generator=g) * 5, torch.randn(10, 3, generator=g)]
    joint = concatenate_embeddings(parts)
    assert joint.shape == (10, 7)
    assert torch.allclose(joint[:, :4].norm(dim=1), torch.ones(10))
    assert torch.allclose(joint.norm(dim=1), torch.full((10,), 2.0**0.5))
    with pytest.raises(DataError, match="part 0 has 10 rows but part 1 has 9"):
        concatenate_embeddings([parts[0], parts[1][:9]])


def test_ensemble_metrics_equal_metrics_of_the_concatenation():
    g = torch.Generator().manual_seed(1)
    labels = torch.arange(30) % 6
    parts = [torch.randn(30, 4, generator=g) + labels.unsqueeze(1) for _ in range(4)]
    want = retrieval_metrics(torch.cat([torch.nn.functional.normalize(p, dim=1) for p in parts], 1), labels)
    assert ensemble_retrieval_metrics(parts, labels) == want
    half = ensemble_retrieval_metrics(
        [p[:15] for p in parts], labels[:15], reference_parts=[p[15:] for p in parts], reference_labels=labels[15:]
    )
    assert 0.0 <= half["map_at_r"] <= 1.0


def test_evaluate_merges_retrieval_verification_and_clustering():
    g = torch.Generator().manual_seed(2)
    labels = torch.arange(40) % 5
    x = 10.0 * torch.eye(5, 8)[labels] + 0.1 * torch.randn(40, 8, generator=g)
    out = evaluate(x, labels)
    assert set(out) == {
        "precision_at_1", "recall_at_1", "recall_at_2", "recall_at_4", "recall_at_8",
        "r_precision", "map_at_r", "num_queries_excluded", "nmi", "roc_auc", "eer",
        "fnmr_at_fmr_1e-2", "fnmr_at_fmr_1e-3", "threshold_at_fmr_1e-2", "threshold_at_fmr_1e-3",
        "num_genuine_pairs", "num_impostor_pairs",
    }
    assert out["precision_at_1"] == 1.0 and out["map_at_r"] == 1.0
    assert out["roc_auc"] == verification_metrics(x, labels)["roc_auc"] == 1.0
    assert out["nmi"] == clustering_metrics(x, labels)["nmi"]
    more = evaluate(x, labels, metrics=("clustering", "geometry"), over_cluster=2, ami=True)
    assert {"nmi", "nmi_plus", "ami", "covering_radius"} <= set(more) and "map_at_r" not in more
    assert "roc_auc" not in more
    with pytest.raises(InvalidParameterError, match="'metrics' parameter of evaluate"):
        evaluate(x, labels, metrics=("retrival",))
