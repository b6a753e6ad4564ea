"""Per-query AP@R (for paired model selection) against a float64 loop and retrieval_metrics."""

from __future__ import annotations

import math

import pytest
import torch

from dmlkit.evaluation import map_at_r_per_query, retrieval_metrics
from dmlkit.evaluation.retrieval import paired_gain


def reference_ap_at_r(x: torch.Tensor, y: torch.Tensor) -> list[float]:
    x = x.double()
    out = []
    for i in range(len(y)):
        others = [j for j in range(len(y)) if j != i]
        dist = [(float(((x[i] - x[j]) ** 2).sum()), j) for j in others]
        ranked = [j for _, j in sorted(dist)]
        r = sum(1 for j in others if y[j] == y[i])
        if r == 0:
            out.append(math.nan)
            continue
        hits, total = 0, 0.0
        for rank, j in enumerate(ranked[:r], start=1):
            if y[j] == y[i]:
                hits += 1
                total += hits / rank
        out.append(total / r)
    return out


def test_per_query_ap_at_r_matches_a_loop_and_averages_to_map_at_r():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 5, generator=g)
    y = torch.randint(0, 6, (40,), generator=g)
    y[0] = 99  # a query with no true reference: NaN, left out of the mean
    got = map_at_r_per_query(x, y)
    want = reference_ap_at_r(x, y)
    assert math.isnan(float(got[0])) and math.isnan(want[0])
    assert got[1:].tolist() == pytest.approx(want[1:], abs=1e-12)
    assert float(got[~got.isnan()].mean()) == pytest.approx(retrieval_metrics(x, y)["map_at_r"], abs=1e-12)


def test_paired_gain_is_the_mean_difference_and_its_standard_error():
    a = torch.tensor([0.5, 0.7, float("nan"), 0.9], dtype=torch.float64)
    b = torch.tensor([0.4, 0.7, 0.1, 0.6], dtype=torch.float64)
    gain, error = paired_gain(a, b)
    d = [0.1, 0.0, 0.3]
    mean = sum(d) / 3
    sd = math.sqrt(sum((v - mean) ** 2 for v in d) / 2)
    assert gain == pytest.approx(mean) and error == pytest.approx(sd / math.sqrt(3))
