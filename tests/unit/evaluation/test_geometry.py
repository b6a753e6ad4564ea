"""Geometry diagnostics: k-center covering radius (ASAP A.3.1), inter-class distance, collapse."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from dmlkit.evaluation import class_collapse, covering_radius, geometry_metrics, interclass_distance


def test_covering_radius_worked_example():
    # one class on a line at 0, 1, 3: mean 4/3, so the first center is 1 -> radius 2 (point 3);
    # the farthest point 3 becomes the second center -> radius 1 (point 0); k = 3 -> radius 0.
    # mean over k = 1..3: (2 + 1 + 0) / 3 = 1.  A second class {10, 14}: first center 10 (tie
    # with 14 at the mean resolves to the smaller position) -> radius 4, then 0 -> 2.  Mean 1.5.
    x = torch.tensor([[0.0], [10.0], [1.0], [14.0], [3.0]])
    labels = torch.tensor([5, 9, 5, 9, 5])
    assert covering_radius(x, labels) == pytest.approx((1.0 + 2.0) / 2)


def greedy_kcenter_loop(points):
    """Loop reference of ASAP's averaged greedy k-center radius for one class."""
    mean = points.mean(0)
    centers = [int(np.argmin(np.linalg.norm(points - mean, axis=1)))]
    radii = []
    for _ in range(len(points)):
        d = np.min(np.linalg.norm(points[:, None, :] - points[centers][None], axis=-1), axis=1)
        radii.append(d.max())
        centers.append(int(np.argmax(d)))
    return float(np.mean(radii))


def test_covering_radius_matches_loop_on_uneven_classes():
    g = torch.Generator().manual_seed(0)
    labels = torch.tensor([0] * 7 + [1] * 3 + [2] * 7 + [3] * 1 + [4] * 5)
    labels = labels[torch.randperm(len(labels), generator=g)]
    x = torch.randn(len(labels), 4, generator=g, dtype=torch.float64)
    want = np.mean([greedy_kcenter_loop(x[labels == c].numpy()) for c in range(5)])
    assert covering_radius(x, labels) == pytest.approx(want, rel=1e-12)


def test_interclass_distance_and_collapse_worked_example():
    # class 0 at (0, 0) +- (1, 0); class 1 at (10, 0) +- (0, 1): centroids 10 apart.
    x = torch.tensor([[-1.0, 0.0], [1.0, 0.0], [10.0, -1.0], [10.0, 1.0]])
    labels = torch.tensor([0, 0, 1, 1])
    assert interclass_distance(x, labels) == pytest.approx(10.0)
    # spread 1 for both classes, nearest other centroid 10 -> collapse score 0.1
    assert class_collapse(x, labels) == pytest.approx(0.1)


def test_interclass_distance_matches_pairwise_loop():
    g = torch.Generator().manual_seed(1)
    labels = torch.randint(0, 6, (40,), generator=g)
    x = torch.randn(40, 3, generator=g)
    cents = [x[labels == c].double().mean(0) for c in torch.unique(labels)]
    pairs = [float((a - b).norm()) for a, b in itertools.permutations(cents, 2)]
    assert interclass_distance(x, labels) == pytest.approx(np.mean(pairs), rel=1e-12)
    out = geometry_metrics(x, labels)
    assert set(out) == {"covering_radius", "interclass_distance", "class_collapse"}
    assert all(v >= 0 for v in out.values())
