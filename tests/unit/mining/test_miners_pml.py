"""Miners agree with pytorch-metric-learning on matched settings (same selections on random data)."""

from __future__ import annotations

import pytest
import torch
from pytorch_metric_learning import distances as pml_distances
from pytorch_metric_learning import miners as pml_miners
from pytorch_metric_learning.utils import loss_and_miner_utils as lmu

from dmlkit.distances import CosineSimilarity, LpDistance
from dmlkit.mining import (
    BatchHardMiner,
    DistanceWeightedMiner,
    MultiSimilarityMiner,
    PairMarginMiner,
    TripletMarginMiner,
    label_masks,
)


def batch(seed: int, n: int = 32, dim: int = 8, classes: int = 6):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, dim, generator=g, dtype=torch.float64), torch.randint(0, classes, (n,), generator=g)


def as_triplets(sel) -> list[tuple[int, int, int]]:
    return list(zip(sel.anchor.tolist(), sel.positive.tolist(), sel.negative.tolist()))


def masks_from_pml(a1, p, a2, n, shape):
    pos = torch.zeros(shape, dtype=torch.bool)
    neg = torch.zeros(shape, dtype=torch.bool)
    pos[a1, p] = True
    neg[a2, n] = True
    return pos, neg


@pytest.mark.parametrize("kind", ["all", "hard", "semihard", "easy"])
@pytest.mark.parametrize("seed", [0, 1])
def test_triplet_margin_matches_pml(kind, seed):
    x, labels = batch(seed)
    ours = TripletMarginMiner(margin=0.2, type_of_triplets=kind)(x, labels)
    a, p, n = pml_miners.TripletMarginMiner(margin=0.2, type_of_triplets=kind)(x, labels)
    assert as_triplets(ours) == list(zip(a.tolist(), p.tolist(), n.tolist()))
    assert len(ours) > 0


def test_triplet_margin_matches_pml_with_cosine_and_reference_set():
    x, labels = batch(2, n=12)
    mem, mem_labels = batch(3, n=20)
    ours = TripletMarginMiner(0.1, "semihard", distance=CosineSimilarity())(x, labels, mem, mem_labels)
    a, p, n = pml_miners.TripletMarginMiner(0.1, "semihard", distance=pml_distances.CosineSimilarity())(
        x, labels, mem, mem_labels)
    assert as_triplets(ours) == list(zip(a.tolist(), p.tolist(), n.tolist()))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_batch_hard_matches_pml(seed):
    x, labels = batch(seed)
    ours = BatchHardMiner()(x, labels)
    a, p, n = pml_miners.BatchHardMiner()(x, labels)
    assert as_triplets(ours) == list(zip(a.tolist(), p.tolist(), n.tolist()))


@pytest.mark.parametrize("epsilon", [0.05, 0.1, 0.3])
def test_multi_similarity_matches_pml(epsilon):
    x, labels = batch(4)
    ours = MultiSimilarityMiner(epsilon=epsilon)(x, labels)
    pos, neg = masks_from_pml(*pml_miners.MultiSimilarityMiner(epsilon=epsilon)(x, labels), (32, 32))
    assert torch.equal(ours.positive, pos) and torch.equal(ours.negative, neg)
    assert pos.any() and neg.any()


def test_multi_similarity_matches_pml_with_euclidean_distance():
    x, labels = batch(5)
    ours = MultiSimilarityMiner(0.1, distance=LpDistance(normalize_embeddings=True))(x, labels)
    pos, neg = masks_from_pml(*pml_miners.MultiSimilarityMiner(0.1, distance=pml_distances.LpDistance())(x, labels),
                              (32, 32))
    assert torch.equal(ours.positive, pos) and torch.equal(ours.negative, neg)


@pytest.mark.parametrize("margins", [(0.2, 0.8), (0.9, 1.3)])
def test_pair_margin_matches_pml(margins):
    x, labels = batch(6)
    ours = PairMarginMiner(*margins)(x, labels)
    pos, neg = masks_from_pml(*pml_miners.PairMarginMiner(*margins)(x, labels), (32, 32))
    assert torch.equal(ours.positive, pos) and torch.equal(ours.negative, neg)


@pytest.mark.parametrize("dim", [8, 64])
def test_distance_weighted_probabilities_match_pml(dim, monkeypatch):
    """PML samples from ``weights``; capture them and compare with our per-anchor probabilities."""
    g = torch.Generator().manual_seed(dim)
    x = torch.randn(24, dim, generator=g, dtype=torch.float64)
    labels = torch.arange(24) % 4
    captured = {}
    original = lmu.get_random_triplet_indices

    def capture(labels, ref_labels=None, t_per_anchor=None, weights=None):
        captured["weights"] = weights
        return original(labels, ref_labels=ref_labels, t_per_anchor=t_per_anchor, weights=weights)

    monkeypatch.setattr(lmu, "get_random_triplet_indices", capture)
    pml_miners.DistanceWeightedMiner(cutoff=0.5, nonzero_loss_cutoff=1.4)(x, labels)
    _, negative = label_masks(labels)
    ours, has_neg = DistanceWeightedMiner(cutoff=0.5, nonzero_loss_cutoff=1.4).negative_probabilities(x, x, negative)
    theirs = captured["weights"]
    assert torch.allclose(ours[has_neg], theirs[has_neg], rtol=1e-6, atol=1e-9)
    assert has_neg.any()


@pytest.mark.parametrize("seed", [0, 1])
def test_easy_positives_match_pml_easiest_positive(seed):
    """EPS's positive is PML BatchEasyHardMiner's "easy" positive (nearest same-class sample)."""
    from dmlkit.mining import EasyPositiveMiner

    x, labels = batch(seed)
    a, p, _, _ = pml_miners.BatchEasyHardMiner(pos_strategy="easy", neg_strategy="hard")(x, labels)
    ours = EasyPositiveMiner(negative="multi_similarity", epsilon=10.0,
                             distance=LpDistance(normalize_embeddings=True))(x, labels)
    anchor, positive = ours.positive.nonzero(as_tuple=True)
    assert anchor.tolist() == a.tolist() and positive.tolist() == p.tolist()
