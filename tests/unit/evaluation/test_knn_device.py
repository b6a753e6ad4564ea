"""The k-NN path for embeddings on a GPU, run on the CPU (``knn.DEVICE_SEARCH = "always"``).

The device path is the same code whatever the device: here it searches CPU tensors and is held to
a float64 brute force (ties by the smaller index, self-exclusion), to the CPU path, and, through
the retrieval metrics and ``AccuracyCalculator``, to the CPU path's numbers bit for bit. Tile
sizing is checked against a reported amount of free GPU memory (``torch.cuda.mem_get_info``
monkeypatched: nothing touches a GPU).
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch

from dmlkit.evaluation import AccuracyCalculator, knn, knn_device, map_at_r_per_query, retrieval_metrics
from dmlkit.exceptions import InvalidParameterError

knn_module = importlib.import_module("dmlkit.evaluation.knn")

METRICS = ("euclidean", "cosine", "dot")


def float64_ranking(query, reference, k, metric, exclude_self):
    """Every pair's float64 key (``-|q - r|^2``, or the product of the unit vectors / the vectors), then a
    stable sort: larger key first, equal keys in the order of the references' indices."""
    q, r = query.double(), reference.double()
    if metric == "cosine":
        q, r = (x / x.norm(dim=1, keepdim=True).clamp_min(1e-300) for x in (q, r))
    keys = -(q[:, None] - r[None]).square().sum(-1) if metric == "euclidean" else (q[:, None] * r[None]).sum(-1)
    if exclude_self:
        keys.fill_diagonal_(float("-inf"))
    return keys.sort(dim=1, descending=True, stable=True).indices[:, :k].numpy()


def with_ties(n=150, d=6, seed=0):
    """Random points with exact duplicates (a pair, a run of 12) and points equidistant from a query."""
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(seed))
    x[7] = x[3]
    x[40:52] = x[40]
    x[60], x[61], x[62] = x[59] + 0.5, x[59] - 0.5, x[59]
    return x


@pytest.fixture
def device_path(monkeypatch):
    """Every search takes the device path (on the CPU), with tiny tiles: many strips and reference chunks."""
    monkeypatch.setattr(knn_module, "DEVICE_SEARCH", "always")
    monkeypatch.setattr(knn_device, "HOST_TILE_BYTES", knn_device.BYTES_PER_ENTRY * 40 * 32)


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("exclude_self", [True, False])
def test_device_path_matches_brute_force_and_the_cpu_path_ties_included(device_path, monkeypatch, metric, exclude_self):
    x = with_ties()
    ref = x if exclude_self else torch.cat([with_ties(90, seed=1), x[:20]])
    values, idx = knn(x, ref, 9, exclude_self=exclude_self, metric=metric)
    np.testing.assert_array_equal(idx.numpy(), float64_ranking(x, ref, 9, metric, exclude_self))
    monkeypatch.setattr(knn_module, "DEVICE_SEARCH", "never")
    cpu_values, cpu_idx = knn(x, ref, 9, exclude_self=exclude_self, metric=metric)
    assert torch.equal(idx, cpu_idx) and torch.equal(values, cpu_values)
    if exclude_self:
        assert not (idx == torch.arange(len(x)).unsqueeze(1)).any()


def test_a_run_of_duplicates_longer_than_the_shortlist_is_certified_exactly(device_path):
    # 60 copies of one point: every shortlist ends inside the tie, so the search widens until exact
    x = torch.cat([torch.ones(60, 3), torch.zeros(5, 3)])
    values, idx = knn(x, x, 50, exclude_self=True)
    np.testing.assert_array_equal(idx.numpy(), float64_ranking(x, x, 50, "euclidean", True))
    assert torch.equal(values[:59, :50], torch.zeros(59, 50, dtype=torch.float64))


@pytest.mark.parametrize("shape", [(7, 11), (64, 1000), (1, 13)])
def test_tiles_keep_each_querys_top_m_scores(shape):
    g = torch.Generator().manual_seed(3)
    q, r = torch.randn(50, 8, generator=g), torch.randn(120, 8, generator=g)
    rows = torch.tensor([5, 0, 49, 17, 3, 3])
    v, i = knn_device.topm_scores(q, r, 10, rows=rows, shape=shape)
    scores = q[rows] @ r.T
    want_v, want_i = scores.topk(10, dim=1)
    assert torch.equal(i.sort(1).values, want_i.sort(1).values)  # random data: no tie at the 10th score
    # each score is its pair's float32 product (a tile's product may round differently: the certificate's bound)
    torch.testing.assert_close(v.sort(1).values, want_v.sort(1).values, rtol=0, atol=1e-5)
    torch.testing.assert_close(v, scores.gather(1, i), rtol=0, atol=1e-5)


def test_tiles_leave_out_each_querys_own_reference():
    x = torch.randn(40, 4, generator=torch.Generator().manual_seed(4))
    rows = torch.tensor([0, 9, 10, 39])
    _, i = knn_device.topm_scores(x, x, 39, rows=rows, exclude_self=True, shape=(3, 10))
    for row, found in zip(rows.tolist(), i.tolist()):
        assert sorted(found) == [j for j in range(40) if j != row]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_products_are_ieee_float32_inside_and_the_users_setting_is_restored(device):
    backend = torch.backends.cuda.matmul if device == "cuda" else torch.backends.mkldnn.matmul
    before = backend.fp32_precision
    backend.fp32_precision = "tf32" if device == "cuda" else "bf16"  # a user's faster, coarser products
    try:
        with knn_device.ieee_float32_products(torch.device(device)):
            assert backend.fp32_precision == "ieee"
        assert backend.fp32_precision == ("tf32" if device == "cuda" else "bf16")
    finally:
        backend.fp32_precision = before


def test_products_are_ieee_also_under_the_legacy_switch(monkeypatch):
    monkeypatch.setattr(torch.backends, "mkldnn", type("NoMatmul", (), {})())  # a PyTorch without the newer API
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    try:
        with knn_device.ieee_float32_products(torch.device("cpu")):
            assert torch.get_float32_matmul_precision() == "highest"
        assert torch.get_float32_matmul_precision() == "medium"
    finally:
        torch.set_float32_matmul_precision(before)


def test_tile_budget_follows_the_gpus_free_memory_up_to_a_cap(monkeypatch):
    free = {"bytes": 80 * 2**30}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free["bytes"], 80 * 2**30))
    cuda = torch.device("cuda", 0)
    assert knn_device.tile_budget(cuda) == knn_device.TILE_BYTES_CAP
    free["bytes"] = 2 * 2**30
    assert knn_device.tile_budget(cuda) == int(knn_device.FREE_MEMORY_SHARE * 2 * 2**30)
    assert knn_device.tile_budget(torch.device("cpu")) == knn_device.HOST_TILE_BYTES


@pytest.mark.parametrize(("n_q", "n_r", "m", "budget"), [
    (1_000_000, 1_000_000, 12, 2**30),  # 1M x 512 on a large card
    (50_000, 50_000, 14, 2**30),
    (1_000_000, 1_000_000, 12, 64 * 2**20),  # little free memory
    (100, 30, 5, 2**30),
])
def test_tile_shape_stays_within_the_budget(n_q, n_r, m, budget):
    rows, cols = knn_device.tile_shape(n_q, n_r, m, budget)
    assert 1 <= rows <= min(n_q, knn_device.MAX_TILE_ROWS) and m <= cols <= n_r
    assert rows * cols * knn_device.BYTES_PER_ENTRY <= max(budget, 256 * m * knn_device.BYTES_PER_ENTRY)
    if n_r <= 50_000 and budget >= 2**30:
        assert cols == n_r  # every reference in one tile: one top-k per strip, nothing to merge


def test_embeddings_off_the_cpu_are_searched_where_they_are(monkeypatch):
    cpu, elsewhere = torch.zeros(2, 2), torch.zeros(2, 2, device="meta")
    assert not knn_module.searches_on_device(cpu) and knn_module.searches_on_device(elsewhere)
    assert not knn_module.searches_on_device(elsewhere, backend="faiss")  # faiss searches on the CPU
    monkeypatch.setattr(knn_module, "DEVICE_SEARCH", "never")
    assert not knn_module.searches_on_device(elsewhere)
    monkeypatch.setattr(knn_module, "DEVICE_SEARCH", "gpu")
    with pytest.raises(InvalidParameterError, match="DEVICE_SEARCH must be 'auto', 'always' or 'never'. Got 'gpu'"):
        knn_module.searches_on_device(cpu)


def clustered_with_duplicates(seed=0):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 40, (400,), generator=g)
    x = torch.nn.functional.normalize(torch.randn(40, 16, generator=g)[labels] + torch.randn(400, 16, generator=g), dim=1)
    x[10:30] = x[10]  # identical embeddings of several classes: the tie shuffling decides their order
    return x, labels


def metrics_on_both_paths(monkeypatch, compute):
    out = {}
    for mode in ("never", "always"):
        monkeypatch.setattr(knn_module, "DEVICE_SEARCH", mode)
        out[mode] = compute()
    return out["never"], out["always"]


def test_retrieval_metrics_are_the_cpu_paths_bit_for_bit(monkeypatch):
    monkeypatch.setattr(knn_device, "HOST_TILE_BYTES", knn_device.BYTES_PER_ENTRY * 64 * 50)
    x, labels = clustered_with_duplicates()
    own = torch.full((150,), -1, dtype=torch.int64)
    own[:50] = torch.arange(50)  # the first 50 queries are also the first gallery rows

    def compute():
        return (retrieval_metrics(x, labels, ks=(1, 2, 4, 8)),
                retrieval_metrics(x[:150], labels[:150], reference=x[:300], reference_labels=labels[:300],
                                  own_reference=own),
                map_at_r_per_query(x, labels))

    (cpu_loo, cpu_qg, cpu_ap), (dev_loo, dev_qg, dev_ap) = metrics_on_both_paths(monkeypatch, compute)
    assert dev_loo == cpu_loo and dev_qg == cpu_qg
    assert torch.equal(dev_ap.isnan(), cpu_ap.isnan()) and torch.equal(dev_ap.nan_to_num(), cpu_ap.nan_to_num())
    assert 0 < dev_loo["map_at_r"] < 1 and dev_ap.device.type == "cpu"


def test_accuracy_calculator_is_the_cpu_paths_bit_for_bit(monkeypatch):
    x, labels = clustered_with_duplicates(seed=1)
    include = ("precision_at_1", "r_precision", "mean_average_precision_at_r", "mean_average_precision")

    def compute():
        calc = AccuracyCalculator(include=include, k="max_bin_count")
        per_class = AccuracyCalculator(include=include, k=20, return_per_class=True)
        return (calc.get_accuracy(x, labels), per_class.get_accuracy(x[:100], labels[:100], x, labels, True))

    cpu, dev = metrics_on_both_paths(monkeypatch, compute)
    assert dev == cpu and 0 < dev[0]["mean_average_precision_at_r"] < 1
