"""NMI and AMI without scikit-learn: equal to scikit-learn's scores (float64), limit cases included, and
scoring a run never imports scikit-learn."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from sklearn.metrics import adjusted_mutual_info_score, normalized_mutual_info_score

from dmlkit.evaluation.information import (
    adjusted_mutual_information,
    expected_mutual_information,
    normalized_mutual_information,
)


def labelings(seed: int):
    """Random class and cluster ids of a random size; every third pair mostly agrees."""
    rng = np.random.default_rng(seed)
    n, classes, clusters = int(rng.integers(2, 300)), int(rng.integers(1, 10)), int(rng.integers(1, 10))
    x, y = rng.integers(0, classes, n), rng.integers(0, clusters, n)
    if seed % 3 == 0:
        y = np.where(rng.random(n) < 0.8, x, y)
    return x, y


@pytest.mark.parametrize("seed", range(40))
def test_nmi_and_ami_are_scikit_learns(seed):
    x, y = labelings(seed)
    assert normalized_mutual_information(torch.from_numpy(x), torch.from_numpy(y)) == pytest.approx(
        normalized_mutual_info_score(x, y), abs=1e-12)
    assert adjusted_mutual_information(torch.from_numpy(x), torch.from_numpy(y)) == pytest.approx(
        adjusted_mutual_info_score(x, y), abs=1e-12)


def test_many_classes_and_sparse_clusters_agree_with_scikit_learn():
    """SOP-like: 1,500 classes of 2-8 images, clusters half right; E[I] summed over distinct sizes in blocks."""
    rng = np.random.default_rng(1)
    x = np.repeat(np.arange(1500), rng.integers(2, 9, 1500))
    y = np.where(rng.random(x.size) < 0.5, x, rng.integers(0, 1500, x.size))
    ours = adjusted_mutual_information(x, y)
    assert ours == pytest.approx(adjusted_mutual_info_score(x, y), abs=1e-9)
    assert normalized_mutual_information(x, y) == pytest.approx(normalized_mutual_info_score(x, y), abs=1e-12)


@pytest.mark.parametrize(("x", "y"), [
    ([0, 0, 0], [1, 1, 1]),  # one class, one cluster: 1 by convention
    ([0, 0, 0], [0, 1, 2]),  # one class: no information
    ([0, 1, 2], [5, 5, 5]),
    ([0, 0, 1, 1], [1, 1, 0, 0]),  # the same partition, renamed
    ([0, 1, 2, 3], [0, 1, 2, 3]),  # every sample its own class and cluster: E[I] = I
])
def test_limit_cases_are_scikit_learns(x, y):
    assert normalized_mutual_information(torch.tensor(x), torch.tensor(y)) == pytest.approx(
        normalized_mutual_info_score(x, y), abs=1e-12)
    assert adjusted_mutual_information(torch.tensor(x), torch.tensor(y)) == pytest.approx(
        adjusted_mutual_info_score(x, y), abs=1e-12)


def test_expected_mutual_information_by_enumeration():
    """E[I] against the mean of I over every relabeling of 6 samples into groups of sizes (3, 3) and (2, 4)."""
    import itertools
    import math

    a, b = torch.tensor([3, 3]), torch.tensor([2, 4])
    classes = [0, 0, 0, 1, 1, 1]
    values = []
    for cluster_of_first_group in itertools.combinations(range(6), 2):
        clusters = [0 if k in cluster_of_first_group else 1 for k in range(6)]
        n = 6
        mi = 0.0
        for i in (0, 1):
            for j in (0, 1):
                n_ij = sum(1 for c, k in zip(classes, clusters) if c == i and k == j)
                if n_ij:
                    mi += n_ij / n * math.log(n * n_ij / (int(a[i]) * int(b[j])))
        values.append(mi)
    assert expected_mutual_information(a, b) == pytest.approx(sum(values) / len(values), rel=1e-12)


def test_clustering_metrics_do_not_import_scikit_learn():
    code = ("import sys, torch\n"
            "from dmlkit.evaluation import clustering_metrics\n"
            "g = torch.Generator().manual_seed(0)\n"
            "m = clustering_metrics(torch.randn(60, 4, generator=g), torch.arange(6).repeat_interleave(10))\n"
            "assert 0 <= m['nmi'] <= 1 and -1 <= m['ami'] <= 1, m\n"
            "print('sklearn' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
