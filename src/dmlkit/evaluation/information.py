"""Agreement of two labelings from their contingency table, in float64: mutual information, NMI and AMI.

With ``n_ij`` the samples in class ``i`` and cluster ``j``, ``a_i`` / ``b_j`` the class / cluster sizes and
``N`` the samples:

* ``I = sum_ij (n_ij / N) log(N n_ij / (a_i b_j))`` and ``H = -sum_i (a_i / N) log(a_i / N)``;
* NMI (Proxy-NCA, Eq. 8) ``= 2 I / (H(classes) + H(clusters))``, the arithmetic normalisation;
* AMI ``= (I - E[I]) / ((H(classes) + H(clusters)) / 2 - E[I])`` with ``E[I]`` the mutual information
  expected of two random labelings with the same sizes (the hypergeometric model of Vinh, Epps and
  Bailey, JMLR 2010): ``E[I] = sum_ij sum_n (n / N) log(N n / (a_i b_j)) P(n_ij = n)``, ``n`` from
  ``max(1, a_i + b_j - N)`` to ``min(a_i, b_j)``.

They are the values of scikit-learn's ``normalized_mutual_info_score`` and ``adjusted_mutual_info_score``
(``average_method="arithmetic"``, their limit cases included), computed here so that scoring does not pay
scikit-learn's import (about 2 s, longer than the MNIST default's whole evaluation on a GPU). Only the
table's non-zero cells are formed, and ``E[I]`` is summed over the distinct class and cluster sizes, so
SOP's 11,316 classes x 11,316 clusters cost a few thousand cells, not a dense table.
"""

from __future__ import annotations

import math

import torch

_EPS = torch.finfo(torch.float64).eps
#: Entries of one block of the ``E[I]`` sum (distinct class sizes x distinct cluster sizes x cell counts).
_BLOCK = 1 << 22


def _sizes_and_cells(classes: torch.Tensor, clusters: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Class sizes ``a [R]``, cluster sizes ``b [C]`` and the non-zero cells ``(i, j, n_ij)`` as ``[3, K]``."""
    _, i = torch.unique(torch.as_tensor(classes).reshape(-1).cpu(), return_inverse=True)
    _, j = torch.unique(torch.as_tensor(clusters).reshape(-1).cpu(), return_inverse=True)
    if i.numel() != j.numel():
        raise ValueError(f"classes has {i.numel()} entries but clusters has {j.numel()}")
    a, b = torch.bincount(i), torch.bincount(j)
    cells, counts = torch.unique(i * b.numel() + j, return_counts=True)
    return a, b, torch.stack([cells // b.numel(), cells % b.numel(), counts])


def entropy(sizes: torch.Tensor) -> float:
    """``H = -sum_k (s_k / N) log(s_k / N)`` of a labeling with group sizes ``sizes [K]`` (nats)."""
    p = sizes[sizes > 0].double()
    n = p.sum()
    return float(-(p / n * (p.log() - n.log())).sum()) if p.numel() > 1 else 0.0


def mutual_information(a: torch.Tensor, b: torch.Tensor, cells: torch.Tensor) -> float:
    """``I = sum_ij (n_ij / N) log(N n_ij / (a_i b_j))`` over the non-zero cells (nats, clipped at 0)."""
    if a.numel() == 1 or b.numel() == 1:
        return 0.0
    i, j, n_ij = cells[0], cells[1], cells[2].double()
    n = float(a.sum())
    terms = n_ij / n * (n_ij.log() + math.log(n) - a[i].double().log() - b[j].double().log())
    return max(float(torch.where(terms.abs() < _EPS, 0.0, terms).sum()), 0.0)


def expected_mutual_information(a: torch.Tensor, b: torch.Tensor) -> float:
    """``E[I]`` of random labelings with class sizes ``a`` and cluster sizes ``b`` (hypergeometric model)."""
    if a.numel() == 1 or b.numel() == 1:
        return 0.0
    n = float(a.sum())
    size_a, count_a = torch.unique(a, return_counts=True)
    size_b, count_b = torch.unique(b, return_counts=True)
    big_b, weight_b = size_b.double()[None, :, None], count_b.double()[None, :]
    low = torch.clamp(size_a.double()[:, None] + size_b.double()[None, :] - n, min=1.0)
    high = torch.minimum(size_a.double()[:, None], size_b.double()[None, :])
    length = int((high - low).max()) + 1
    rows = max(1, _BLOCK // max(size_b.numel() * length, 1))
    constant = math.lgamma(n + 1)
    total = 0.0
    for start in range(0, size_a.numel(), rows):  # blocks of distinct class sizes: memory stays bounded
        big_a = size_a[start:start + rows].double()[:, None, None]
        cell = low[start:start + rows, :, None] + torch.arange(length, dtype=torch.float64)
        valid = cell <= high[start:start + rows, :, None]
        cell = torch.where(valid, cell, 1.0)
        rest = torch.where(valid, n - big_a - big_b + cell, 1.0)
        log_p = (torch.lgamma(big_a + 1) + torch.lgamma(big_b + 1) + torch.lgamma(n - big_a + 1)
                 + torch.lgamma(n - big_b + 1) - constant - torch.lgamma(cell + 1) - torch.lgamma(big_a - cell + 1)
                 - torch.lgamma(big_b - cell + 1) - torch.lgamma(rest + 1))
        terms = cell / n * (math.log(n) + cell.log() - big_a.log() - big_b.log()) * log_p.exp()
        per_pair = torch.where(valid, terms, 0.0).sum(-1)
        total += float((count_a[start:start + rows].double()[:, None] * weight_b * per_pair).sum())
    return total


def normalized_mutual_information(classes: torch.Tensor, clusters: torch.Tensor) -> float:
    """NMI ``= 2 I / (H(classes) + H(clusters))`` (Proxy-NCA, Eq. 8); 1 when both are one group, 0 when I = 0."""
    a, b, cells = _sizes_and_cells(classes, clusters)
    if a.numel() == b.numel() == 1 or a.numel() == b.numel() == 0:
        return 1.0
    mi = mutual_information(a, b, cells)
    if abs(mi) < _EPS:
        return 0.0
    return mi / ((entropy(a) + entropy(b)) / 2)


def adjusted_mutual_information(classes: torch.Tensor, clusters: torch.Tensor) -> float:
    """AMI ``= (I - E[I]) / (mean(H(classes), H(clusters)) - E[I])``; 1 when both are one group."""
    a, b, cells = _sizes_and_cells(classes, clusters)
    if a.numel() == b.numel() == 1 or a.numel() == b.numel() == 0:
        return 1.0
    mi = mutual_information(a, b, cells)
    emi = expected_mutual_information(a, b)
    denominator = (entropy(a) + entropy(b)) / 2 - emi
    denominator = min(denominator, -_EPS) if denominator < 0 else max(denominator, _EPS)
    return (mi - emi) / denominator
