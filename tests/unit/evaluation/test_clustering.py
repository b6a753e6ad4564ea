"""Clustering metrics: NMI (Proxy-NCA Eq. 8) transcription, NMI+, AMI, seeding, PML agreement."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

from dmlkit.evaluation import clustering_metrics, kmeans_assignments
from dmlkit.exceptions import DataError, InvalidParameterError


def separated(n_classes=6, per_class=10, dim=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n_classes).repeat_interleave(per_class)
    centers = 20.0 * torch.eye(n_classes, dim) if n_classes <= dim else 20.0 * torch.randn(n_classes, dim, generator=g)
    return centers[labels] + 0.1 * torch.randn(len(labels), dim, generator=g), labels


def nmi_eq8(clusters, classes):
    """Float64 loop transcription of NMI = 2 I(Omega, C) / (H(Omega) + H(C))."""
    n = len(classes)
    pc, pk, joint = Counter(classes), Counter(clusters), Counter(zip(clusters, classes))
    h_c = -sum(c / n * math.log(c / n) for c in pc.values())
    h_k = -sum(c / n * math.log(c / n) for c in pk.values())
    mi = sum(c / n * math.log((c / n) / ((pk[a] / n) * (pc[b] / n))) for (a, b), c in joint.items())
    return 2 * mi / (h_c + h_k)


def test_perfectly_separated_classes_give_nmi_one():
    x, labels = separated()
    out = clustering_metrics(x, labels, n_redo=10)
    assert out["nmi"] == pytest.approx(1.0) and out["ami"] == pytest.approx(1.0)
    assert "nmi_plus" not in out


def test_nmi_matches_equation_8_for_the_same_assignment():
    x, labels = separated(n_classes=8, dim=3, seed=1)
    x = x + 8.0 * torch.randn(x.shape, generator=torch.Generator().manual_seed(9))  # overlapping classes
    out = clustering_metrics(x, labels, seed=3)
    assign = kmeans_assignments(x, 8, seed=3)
    assert out["nmi"] == pytest.approx(nmi_eq8(assign.tolist(), labels.tolist()), abs=1e-12)
    assert out["nmi"] < 1.0


def test_over_clustering_reports_nmi_plus_with_more_clusters():
    x, labels = separated(n_classes=4, per_class=12, dim=4, seed=2)
    out = clustering_metrics(x, labels, over_cluster=3, seed=0, n_redo=10)
    assign = kmeans_assignments(x, 12, seed=0, n_redo=10)
    assert out["nmi_plus"] == pytest.approx(nmi_eq8(assign.tolist(), labels.tolist()), abs=1e-12)
    # splitting each true class into 3 pieces costs NMI, so NMI+ is below the regular NMI of 1
    assert out["nmi"] == pytest.approx(1.0) and out["nmi_plus"] < 1.0


def test_seeded_kmeans_is_reproducible():
    x = torch.randn(200, 6, generator=torch.Generator().manual_seed(5))
    labels = torch.arange(200) % 7
    assert clustering_metrics(x, labels, seed=11) == clustering_metrics(x, labels, seed=11)
    assert torch.equal(kmeans_assignments(x, 7, seed=4), kmeans_assignments(x, 7, seed=4))


def test_matches_pml_on_clustered_data():
    x, labels = separated(n_classes=10, per_class=15, dim=16, seed=6)
    pml = AccuracyCalculator(include=("NMI", "AMI"), device=torch.device("cpu")).get_accuracy(x, labels)
    ours = clustering_metrics(x, labels)
    assert ours["nmi"] == pytest.approx(pml["NMI"], abs=1e-6)
    assert ours["ami"] == pytest.approx(pml["AMI"], abs=1e-6)


def test_bad_input():
    x, labels = torch.randn(6, 2), torch.tensor([0, 0, 1, 1, 2, 2])
    with pytest.raises(InvalidParameterError, match="'over_cluster' parameter of clustering_metrics"):
        clustering_metrics(x, labels, over_cluster=0)
    with pytest.raises(DataError, match="embeddings has 6 rows but labels has 5"):
        clustering_metrics(x, labels[:5])
    bad = x.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(DataError, match="NaN"):
        clustering_metrics(bad, labels)
    with pytest.raises(DataError, match="at least as many samples as clusters"):
        kmeans_assignments(x, 7)
