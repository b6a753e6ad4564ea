"""The analytic backward of the pair losses (the distances' ``matrix_backward``) against finite differences."""

import pytest
import torch

from dmlkit.distances import CosineSimilarity, DotProductSimilarity, LpDistance
from dmlkit.distances._closed_form import REFERENCE_MAJOR_MIN_REFERENCES, SPARSE_MIN_REFERENCES
from dmlkit.losses.pair import (
    ContrastiveLoss,
    GeneralizedLiftedStructureLoss,
    MultiSimilarityLoss,
    NPairsLoss,
)
from dmlkit.mining.selection import PairSelection

DISTANCES = {
    "cosine": CosineSimilarity,
    "dot": lambda: DotProductSimilarity(normalize_embeddings=False),
    "euclidean_normalised": lambda: LpDistance(power=1, normalize_embeddings=True),
    "squared_euclidean_normalised": lambda: LpDistance(power=2, normalize_embeddings=True),
    "euclidean": lambda: LpDistance(power=1, normalize_embeddings=False),
    "squared_euclidean": lambda: LpDistance(power=2, normalize_embeddings=False),
}
LOSSES = {
    "contrastive": lambda d: ContrastiveLoss(0.1, 0.8, distance=d),
    "contrastive_mean": lambda d: ContrastiveLoss(0.0, 1.2, distance=d, reduction="mean"),
    "multi_similarity": lambda d: MultiSimilarityLoss(distance=d),
    "generalized_lifted_structure": lambda d: GeneralizedLiftedStructureLoss(distance=d),
}


def _batch(n=8, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=torch.float64), torch.arange(n) % 3


@pytest.mark.parametrize("distance", sorted(DISTANCES))
@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_gradcheck_within_the_batch(loss, distance):
    x, y = _batch()
    fn = LOSSES[loss](DISTANCES[distance]())
    assert torch.autograd.gradcheck(lambda e: fn(e, y), (x.requires_grad_(True),))


@pytest.mark.parametrize("distance", sorted(DISTANCES))
@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_gradcheck_against_references_with_gradient(loss, distance):
    """References that need a gradient too (ASAP's pair loss against proxies)."""
    x, y = _batch()
    refs, ref_y = _batch(5, seed=1)
    fn = LOSSES[loss](DISTANCES[distance]())
    assert torch.autograd.gradcheck(
        lambda e, r: fn(e, y, ref_emb=r, ref_labels=ref_y),
        (x.requires_grad_(True), refs.requires_grad_(True)),
    )


@pytest.mark.parametrize("distance", ["cosine", "dot", "euclidean_normalised", "squared_euclidean"])
def test_gradcheck_npairs(distance):
    x, y = _batch(10)
    fn = NPairsLoss(distance=DISTANCES[distance]())
    assert torch.autograd.gradcheck(lambda e: fn(e, y), (x.requires_grad_(True),))


def test_gradcheck_weighted_contrastive():
    x, y = _batch()
    w = torch.rand(8, 8, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    pos = (y[:, None] == y[None, :]) & ~torch.eye(8, dtype=torch.bool)
    sel = PairSelection(pos, ~pos & ~torch.eye(8, dtype=torch.bool), w, w)
    fn = ContrastiveLoss(0.1, 0.9)
    assert torch.autograd.gradcheck(lambda e: fn(e, y, pairs=sel), (x.requires_grad_(True),))


@pytest.mark.parametrize("distance", ["cosine", "euclidean_normalised"])
def test_large_memory_backward_equals_autograd(distance):
    """A memory past SPARSE_MIN_REFERENCES takes the column-sparse backward product."""
    x, y = _batch(6, d=64)  # in 64 dimensions few random pairs are within the margin
    g = torch.Generator().manual_seed(3)
    memory = torch.randn(SPARSE_MIN_REFERENCES + 10, 64, generator=g, dtype=torch.float64)
    mem_y = torch.randint(0, 500, (memory.shape[0],), generator=g)
    mem_y[:6] = y
    fn = ContrastiveLoss(distance=DISTANCES[distance]())
    e = x.clone().requires_grad_(True)
    fn(e, y, ref_emb=memory, ref_labels=mem_y).backward()
    # Reference: the same loss written with autograd.
    xr = x.clone().requires_grad_(True)
    xn, mn = torch.nn.functional.normalize(xr, dim=1), torch.nn.functional.normalize(memory, dim=1)
    mat = xn @ mn.T if distance == "cosine" else torch.cdist(xn, mn)
    pos = y[:, None] == mem_y[None, :]
    if distance == "cosine":
        pos_t, neg_t = (0.0 - mat).clamp_min(0) * pos, (mat - 1.0).clamp_min(0) * ~pos
    else:
        pos_t, neg_t = mat * pos, (1.0 - mat).clamp_min(0) * ~pos
    ref = pos_t.sum() / (pos_t > 0).sum().clamp_min(1) + neg_t.sum() / (neg_t > 0).sum().clamp_min(1)
    ref.backward()
    torch.testing.assert_close(e.grad, xr.grad)


def test_npairs_label_path_equals_the_selection_path():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(24, 5, generator=g, dtype=torch.float64)
    y = torch.randint(0, 7, (24,), generator=g)
    pos = (y[:, None] == y[None, :]) & ~torch.eye(24, dtype=torch.bool)
    a = x.clone().requires_grad_(True)
    b = x.clone().requires_grad_(True)
    fast, general = NPairsLoss()(a, y), NPairsLoss()(b, y, pairs=PairSelection(pos, ~pos))
    torch.testing.assert_close(fast, general)
    fast.backward()
    general.backward()
    torch.testing.assert_close(a.grad, b.grad)


@pytest.mark.parametrize("distance", sorted(DISTANCES))
def test_reference_major_product_equals_the_distance(distance):
    """Against a large reference set the matrix is built reference-major ([R, B] in memory)."""
    from dmlkit.losses.pair.terms import Pairwise

    x, _ = _batch(5, d=16)
    refs = torch.randn(REFERENCE_MAJOR_MIN_REFERENCES + 3, 16, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    dist = DISTANCES[distance]()
    pairs = Pairwise(dist, x, refs, same_set=False)
    assert pairs.mat.shape == (5, refs.shape[0]) and pairs.mat.stride() == (1, 5)
    torch.testing.assert_close(pairs.mat, dist(x, refs))


@pytest.mark.parametrize("distance", sorted(DISTANCES))
def test_reference_major_backward_equals_autograd(distance):
    """Every measure's gradient through a large (reference-major, column-sparse) reference set."""
    x, y = _batch(4, d=3)  # in 3 dimensions many pairs are within the margin: a dense backward too
    g = torch.Generator().manual_seed(8)
    refs = torch.randn(REFERENCE_MAJOR_MIN_REFERENCES + 1, 3, generator=g, dtype=torch.float64)
    ref_y = torch.randint(0, 50, (refs.shape[0],), generator=g)
    dist = DISTANCES[distance]()
    fn = ContrastiveLoss(0.1, 0.8, distance=dist, reduction="sum")
    e = x.clone().requires_grad_(True)
    value = fn(e, y, ref_emb=refs, ref_labels=ref_y)
    value.backward()
    xr = x.clone().requires_grad_(True)
    mat = dist(xr, refs)
    pos = y[:, None] == ref_y[None, :]
    if dist.is_inverted:
        pos_t, neg_t = (0.1 - mat).clamp_min(0) * pos, (mat - 0.8).clamp_min(0) * ~pos
    else:
        pos_t, neg_t = (mat - 0.1).clamp_min(0) * pos, (0.8 - mat).clamp_min(0) * ~pos
    ref = pos_t.sum() + neg_t.sum()
    ref.backward()
    torch.testing.assert_close(value, ref.detach())
    torch.testing.assert_close(e.grad, xr.grad)


@pytest.mark.parametrize("cls", [ContrastiveLoss, MultiSimilarityLoss])
def test_unknown_distance_falls_back_to_autograd_with_the_same_gradient(cls):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(16, 8, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 4, (16,), generator=g)
    distance = {ContrastiveLoss: LpDistance, MultiSimilarityLoss: CosineSimilarity}[cls]
    user = type("User" + distance.__name__, (distance,), {})  # a subclass keeps autograd
    assert not user().has_closed_form and distance().has_closed_form
    known, fallback = cls(distance=distance()), cls(distance=user())
    a, b = known(x, y), fallback(x, y)
    assert a.item() == pytest.approx(b.item(), rel=1e-12)
    (ga,), (gb,) = torch.autograd.grad(a, x), torch.autograd.grad(b, x)
    torch.testing.assert_close(ga, gb)


def test_each_distance_owns_its_matrix_and_its_closed_form_gradient():
    g = torch.Generator().manual_seed(3)
    x, r = torch.randn(6, 5, generator=g, dtype=torch.float64), torch.randn(9, 5, generator=g, dtype=torch.float64)
    r[2] = 0.0  # a zero row maps to the origin on both routes
    for distance in [CosineSimilarity(), DotProductSimilarity(normalize_embeddings=False), LpDistance(power=1, normalize_embeddings=True),
                     LpDistance(power=2, normalize_embeddings=True), LpDistance(power=1, normalize_embeddings=False)]:
        assert distance.has_closed_form
        torch.testing.assert_close(distance.matrix(x, r), distance(x, r))
        torch.testing.assert_close(distance.matrix_forward(x, r).mat, distance(x, r))
