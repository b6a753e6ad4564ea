"""Distances in PML's terms: LpDistance for any p, SNRDistance, BatchedDistance, the subclassing
hooks (compute_mat, check_shapes), statistics, margin's argument order, and the defaults."""

from __future__ import annotations

import math

import pytest
import torch
from pytorch_metric_learning import distances as pml_distances

from dmlkit.distances import (
    BaseDistance,
    BatchedDistance,
    CosineSimilarity,
    DotProductSimilarity,
    LpDistance,
    SNRDistance,
    as_distance,
    create_distance,
)
from dmlkit.exceptions import InvalidParameterError
from dmlkit.losses import ContrastiveLoss, TripletMarginLoss


def _sets(seed=0, b=5, r=4, d=6):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, d, generator=g, dtype=torch.float64), torch.randn(r, d, generator=g, dtype=torch.float64)


def _lp_loop(x, y, p, power, normalize):
    """``||x_i - y_j||_p ** power`` written out, after ``x / ||x||_p`` when ``normalize``."""
    def norm(v):
        if p == math.inf:
            return max(abs(t) for t in v)
        return sum(abs(t) ** p for t in v) ** (1 / p)

    rows = [[float(t) for t in v] for v in x]
    cols = [[float(t) for t in v] for v in y]
    if normalize:
        rows = [[t / norm(v) for t in v] for v in rows]
        cols = [[t / norm(v) for t in v] for v in cols]
    return torch.tensor([[norm([a - b for a, b in zip(u, v)]) ** power for v in cols] for u in rows], dtype=torch.float64)


@pytest.mark.parametrize("p", [1, 1.5, 2, 3, math.inf])
@pytest.mark.parametrize("power", [1, 2, 0.5])
@pytest.mark.parametrize("normalize", [True, False])
def test_lp_distance_any_p_matches_the_loop_and_pml(p, power, normalize):
    x, y = _sets()
    ours = LpDistance(p=p, power=power, normalize_embeddings=normalize)
    torch.testing.assert_close(ours(x, y), _lp_loop(x, y, p, power, normalize))
    pml = pml_distances.LpDistance(p=p, power=power, normalize_embeddings=normalize)
    torch.testing.assert_close(ours(x, y), pml(x, y))
    torch.testing.assert_close(as_distance(pml)(x, y), pml(x, y))


def test_lp_distance_defaults_to_pml_and_registry_names_stay_raw():
    lp = LpDistance()
    assert (lp.p, lp.power, lp.normalize_embeddings, lp.is_inverted) == (2, 1, True, False)
    assert not create_distance("euclidean").normalize_embeddings
    assert not create_distance("squared_euclidean").normalize_embeddings
    assert not create_distance("dot").normalize_embeddings
    x, y = _sets(1)
    torch.testing.assert_close(ContrastiveLoss(distance=LpDistance())(x, torch.tensor([0, 0, 1, 1, 2])),
                               ContrastiveLoss()(x, torch.tensor([0, 0, 1, 1, 2])))
    with pytest.raises(InvalidParameterError, match="'p' parameter of LpDistance"):
        LpDistance(p=0)
    with pytest.raises(InvalidParameterError, match="'is_inverted' parameter of LpDistance"):
        LpDistance(is_inverted=True)


def test_lp_distance_with_another_p_trains_through_autograd():
    x, _ = _sets(2)
    y = torch.tensor([0, 0, 1, 1, 2])
    loss = TripletMarginLoss(0.5, distance=LpDistance(p=1, normalize_embeddings=False))
    assert not loss.distance.has_closed_form
    assert torch.autograd.gradcheck(lambda e: loss(e, y), (x.clone().requires_grad_(),))


def _snr_loop(x, y):
    """Var(y_j - x_i) / Var(x_i) with unbiased variances, written out (Yuan et al. 2019, Eq. (4))."""
    def var(v):
        m = sum(v) / len(v)
        return sum((t - m) ** 2 for t in v) / (len(v) - 1)

    return torch.tensor([[var([float(b - a) for a, b in zip(u, v)]) / var([float(a) for a in u]) for v in y] for u in x],
                        dtype=torch.float64)


@pytest.mark.parametrize("normalize", [True, False])
def test_snr_distance_matches_the_loop_pml_and_gradcheck(normalize):
    x, y = _sets(3)
    snr = SNRDistance(normalize_embeddings=normalize)
    expected = _snr_loop(torch.nn.functional.normalize(x) if normalize else x,
                         torch.nn.functional.normalize(y) if normalize else y)
    torch.testing.assert_close(snr(x, y), expected)
    torch.testing.assert_close(snr(x, y), pml_distances.SNRDistance(normalize_embeddings=normalize)(x, y))
    torch.testing.assert_close(snr.pairwise_distance(x[:4], y), torch.diagonal(snr.compute_mat(x[:4], y)))
    assert torch.autograd.gradcheck(lambda a, b: snr(a, b), (x.clone().requires_grad_(), y.clone().requires_grad_()))


def test_batched_distance_hands_over_each_block_and_reads_through():
    x, y = _sets(4, b=11)
    blocks = []
    batched = BatchedDistance(CosineSimilarity(), lambda mat, s, e: blocks.append((s, e, mat)), batch_size=4)
    assert batched(x, y) is None
    assert [(s, e) for s, e, _ in blocks] == [(0, 4), (4, 8), (8, 12)]
    torch.testing.assert_close(torch.cat([m for *_, m in blocks]), CosineSimilarity()(x, y))
    assert batched.is_inverted and batched.normalize_embeddings and batched.p == 2


class _FlatDot(BaseDistance):
    """A PML-style subclass: its own matrix, and any input shape."""

    def compute_mat(self, query_emb, ref_emb):
        return query_emb.flatten(1) @ ref_emb.flatten(1).T

    def check_shapes(self, query_emb, ref_emb):
        pass


def test_losses_let_the_distance_check_shapes():
    emb = torch.randn(8, 3, 4)
    labels = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    with pytest.raises(ValueError, match="2-D"):
        TripletMarginLoss(distance=LpDistance())(emb, labels)
    value = TripletMarginLoss(distance=_FlatDot(normalize_embeddings=False))(emb, labels)
    flat = TripletMarginLoss(distance=_FlatDot(normalize_embeddings=False))(emb.flatten(1), labels)
    torch.testing.assert_close(value, flat)
    manual = emb.flatten(1) @ emb.flatten(1).T  # the measure itself, larger = farther
    same = labels[:, None] == labels[None, :]
    terms = [max(float(manual[a, p] - manual[a, n]) + 0.05, 0.0) for a in range(8) for p in range(8) for n in range(8)
             if a != p and same[a, p] and not same[a, n]]
    positive = [t for t in terms if t > 0]
    assert value.item() == pytest.approx(sum(positive) / len(positive), rel=1e-5)


def test_a_subclass_overriding_compute_mat_gets_pmls_recipe():
    class Squared(LpDistance):
        def compute_mat(self, query_emb, ref_emb):
            return super().compute_mat(query_emb, ref_emb) ** 2

    x, y = _sets(5)
    d = Squared(normalize_embeddings=False)
    assert not d.has_closed_form
    torch.testing.assert_close(d(x, y), LpDistance(power=2, normalize_embeddings=False)(x, y))


def test_collected_statistics_as_pml():
    x, y = _sets(6)
    quiet = LpDistance()
    quiet(x, y)
    assert not hasattr(quiet, "initial_avg_query_norm")
    d = LpDistance(collect_stats=True)
    d(x * 3, y)
    assert d.initial_avg_query_norm == pytest.approx(float((x * 3).norm(dim=1).mean()))
    assert d.initial_avg_ref_norm == pytest.approx(float(y.norm(dim=1).mean()))
    assert d.final_avg_query_norm == pytest.approx(1.0) and d.final_avg_ref_norm == pytest.approx(1.0)


def test_margin_smallest_and_largest_follow_pml():
    a, b = torch.tensor([1.0, 4.0]), torch.tensor([3.0, 2.0])
    for ours, pml in ((LpDistance(), pml_distances.LpDistance()), (CosineSimilarity(), pml_distances.CosineSimilarity())):
        assert torch.equal(ours.margin(a, b), pml.margin(a, b))
        assert torch.equal(ours.smallest_dist(a), pml.smallest_dist(a))
        assert torch.equal(ours.largest_dist(a), pml.largest_dist(a))


def test_dot_product_defaults_to_pml_and_normalises():
    x, y = _sets(7)
    torch.testing.assert_close(DotProductSimilarity()(x, y), CosineSimilarity()(x, y))
    torch.testing.assert_close(DotProductSimilarity(normalize_embeddings=False)(x, y), x @ y.T)
    assert DotProductSimilarity(normalize_embeddings=False).has_closed_form
    assert not DotProductSimilarity().has_closed_form


def test_snr_distance_of_an_anchor_without_signal_is_finite():
    """An anchor whose features are all equal (variance 0) gives finite distances, not inf/NaN (PML: division by 0)."""
    from dmlkit.distances import SNRDistance

    flat = torch.ones(1, 4, dtype=torch.float64)
    others = torch.tensor([[1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 1.0, 1.0]], dtype=torch.float64)
    mat = SNRDistance(normalize_embeddings=False)(flat, others)
    assert torch.isfinite(mat).all()
    assert mat[0, 1] == 0  # no noise either: identical rows are at distance 0
    assert mat[0, 0] > 1e6  # noise over (almost) no signal: far


@pytest.mark.parametrize("power", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_euclidean_distance_of_a_half_precision_batch_is_the_float32_value_rounded_once(dtype, power):
    """``|x|^2 + |y|^2 - 2<x, y>`` in float16 cancels (0.044 between a row and itself formerly; PML's
    float16 recipe, row-by-row differences, gives 0): a half batch is computed in float32 and rounded once."""
    angles = torch.arange(64, dtype=torch.float64) * math.pi / 180  # rows one degree apart, as PML's miner tests
    x = torch.stack([angles.cos(), angles.sin()], 1).to(dtype)
    got = LpDistance(power=power)(x)
    assert got.dtype == dtype
    rows = [[float(t) for t in v] for v in x]
    expected = _lp_loop(rows, rows, 2, power, True)
    unit = torch.finfo(dtype).eps  # a unit in the last place of a distance in [1, 2)
    torch.testing.assert_close(got.double(), expected, rtol=unit, atol=4e-4 if power == 1 else 2e-7)
    assert (got.diagonal().double() < 4e-4).all()  # float32's own rounding of a zero distance, not half's
