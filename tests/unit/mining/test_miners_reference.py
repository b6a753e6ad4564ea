"""Miners against brute-force loop references written from the papers' definitions (float64)."""

from __future__ import annotations

import math

import pytest
import torch

from dmlkit.distances import CosineSimilarity, LpDistance
from dmlkit.mining import (
    BatchHardMiner,
    DistanceWeightedMiner,
    EasyPositiveMiner,
    MultiSimilarityMiner,
    PairMarginMiner,
    PairSelection,
    TripletMarginMiner,
    TripletSelection,
)


def make_batch(seed: int, n: int = 18, dim: int = 6, classes: int = 4):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g, dtype=torch.float64)
    labels = torch.randint(0, classes, (n,), generator=g)
    return x, labels


_CACHE: dict = {}


def unit_dist(x: torch.Tensor, i: int, j: int, y: torch.Tensor | None = None) -> float:
    """Euclidean distance between the L2-normalised rows, by the formula (memoised per tensor pair)."""
    y = x if y is None else y
    key = (id(x), id(y), i, j)
    if key not in _CACHE:
        a, b = (x[i] / x[i].norm()).tolist(), (y[j] / y[j].norm()).tolist()
        _CACHE[key] = math.sqrt(sum((u - v) ** 2 for u, v in zip(a, b)))
    return _CACHE[key]


@pytest.fixture(autouse=True)
def _clear_cache():
    _CACHE.clear()
    yield
    _CACHE.clear()


def cos_sim(x: torch.Tensor, i: int, j: int, y: torch.Tensor | None = None) -> float:
    y = x if y is None else y
    return float((x[i] @ y[j]) / (x[i].norm() * y[j].norm()))


def triplet_set(sel: TripletSelection) -> set[tuple[int, int, int]]:
    return set(zip(sel.anchor.tolist(), sel.positive.tolist(), sel.negative.tolist()))


def pair_sets(sel: PairSelection) -> tuple[set, set]:
    return (set(map(tuple, sel.positive.nonzero().tolist())), set(map(tuple, sel.negative.nonzero().tolist())))


def loop_triplets(x, labels, rule):
    out = set()
    n = len(labels)
    for a in range(n):
        for p in range(n):
            if p == a or labels[p] != labels[a]:
                continue
            for q in range(n):
                if labels[q] == labels[a]:
                    continue
                if rule(unit_dist(x, a, p), unit_dist(x, a, q)):
                    out.add((a, p, q))
    return out


RULES = {
    "all": lambda dap, dan: dan - dap < 0.2,
    "hard": lambda dap, dan: dan <= dap,
    "semihard": lambda dap, dan: dap < dan < dap + 0.2,
    "easy": lambda dap, dan: dan - dap >= 0.2,
}


@pytest.mark.parametrize("kind", sorted(RULES))
@pytest.mark.parametrize("seed", [0, 1])
def test_triplet_margin_matches_loop(kind, seed):
    x, labels = make_batch(seed)
    sel = TripletMarginMiner(margin=0.2, type_of_triplets=kind)(x, labels)
    assert triplet_set(sel) == loop_triplets(x, labels, RULES[kind])
    assert len(triplet_set(sel)) == len(sel)  # no duplicates
    keys = list(zip(sel.anchor.tolist(), sel.positive.tolist(), sel.negative.tolist()))
    assert keys == sorted(keys)


def test_triplet_margin_all_and_easy_partition_every_triplet():
    x, labels = make_batch(3)
    every = loop_triplets(x, labels, lambda dap, dan: True)
    hard = triplet_set(TripletMarginMiner(0.3, "all")(x, labels))
    easy = triplet_set(TripletMarginMiner(0.3, "easy")(x, labels))
    assert hard | easy == every and not hard & easy


def test_triplet_margin_with_similarity_flips_sign():
    x, labels = make_batch(4)
    sel = TripletMarginMiner(0.1, "semihard", distance=CosineSimilarity())(x, labels)
    ref = set()
    for a in range(len(labels)):
        for p in range(len(labels)):
            for q in range(len(labels)):
                if p != a and labels[p] == labels[a] and labels[q] != labels[a]:
                    t = cos_sim(x, a, p) - cos_sim(x, a, q)
                    if 0 < t < 0.1:
                        ref.add((a, p, q))
    assert triplet_set(sel) == ref and ref


def test_triplet_margin_with_reference_set():
    x, labels = make_batch(5, n=8)
    mem, mem_labels = make_batch(6, n=12)
    sel = TripletMarginMiner(0.2, "all")(x, labels, mem, mem_labels)
    ref = set()
    for a in range(8):
        for p in range(12):
            for q in range(12):
                if labels[a] == mem_labels[p] and labels[a] != mem_labels[q]:
                    if unit_dist(x, a, q, mem) - unit_dist(x, a, p, mem) < 0.2:
                        ref.add((a, p, q))
    assert triplet_set(sel) == ref and ref


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_batch_hard_matches_loop(seed):
    x, labels = make_batch(seed)
    sel = BatchHardMiner()(x, labels)
    ref = set()
    for a in range(len(labels)):
        pos = [p for p in range(len(labels)) if p != a and labels[p] == labels[a]]
        neg = [q for q in range(len(labels)) if labels[q] != labels[a]]
        if pos and neg:
            ref.add((a, max(pos, key=lambda p: unit_dist(x, a, p)), min(neg, key=lambda q: unit_dist(x, a, q))))
    assert triplet_set(sel) == ref


@pytest.mark.parametrize("distance", [None, CosineSimilarity()])
def test_pair_margin_matches_loop(distance):
    x, labels = make_batch(7)
    pos_margin, neg_margin = (0.9, 1.1) if distance is None else (0.3, 0.0)
    sel = PairMarginMiner(pos_margin, neg_margin, distance=distance)(x, labels)
    pos, neg = set(), set()
    for a in range(len(labels)):
        for b in range(len(labels)):
            if a == b:
                continue
            if distance is None:
                d = unit_dist(x, a, b)
                if labels[a] == labels[b] and d > pos_margin:
                    pos.add((a, b))
                if labels[a] != labels[b] and d < neg_margin:
                    neg.add((a, b))
            else:
                s = cos_sim(x, a, b)
                if labels[a] == labels[b] and s < pos_margin:
                    pos.add((a, b))
                if labels[a] != labels[b] and s > neg_margin:
                    neg.add((a, b))
    assert pair_sets(sel) == (pos, neg)
    assert pos and neg


@pytest.mark.parametrize("epsilon", [0.0, 0.1, 0.5])
def test_multi_similarity_matches_loop(epsilon):
    x, labels = make_batch(8)
    sel = MultiSimilarityMiner(epsilon=epsilon)(x, labels)
    n = len(labels)
    pos, neg = set(), set()
    for a in range(n):
        ps = [cos_sim(x, a, p) for p in range(n) if p != a and labels[p] == labels[a]]
        ns = [cos_sim(x, a, q) for q in range(n) if labels[q] != labels[a]]
        for b in range(n):
            if b == a:
                continue
            s = cos_sim(x, a, b)
            if labels[b] == labels[a] and ns and s - epsilon < max(ns):
                pos.add((a, b))
            if labels[b] != labels[a] and ps and s + epsilon > min(ps):
                neg.add((a, b))
    assert pair_sets(sel) == (pos, neg)


def loop_easy_positive(x, labels, a):
    pos = [p for p in range(len(labels)) if p != a and labels[p] == labels[a]]
    return min(pos, key=lambda p: unit_dist(x, a, p)) if pos else None


@pytest.mark.parametrize("seed", [0, 1])
def test_easy_positive_semihard_matches_loop(seed):
    x, labels = make_batch(seed, n=20)
    sel = EasyPositiveMiner(negative="semihard", margin=0.3)(x, labels)
    ref = set()
    for a in range(len(labels)):
        p = loop_easy_positive(x, labels, a)
        if p is None:
            continue
        for q in range(len(labels)):
            if labels[q] != labels[a] and unit_dist(x, a, p) < unit_dist(x, a, q) < unit_dist(x, a, p) + 0.3:
                ref.add((a, p, q))
    assert triplet_set(sel) == ref and ref


def test_easy_positive_multi_similarity_matches_loop():
    x, labels = make_batch(9, n=20)
    sel = EasyPositiveMiner(negative="multi_similarity", epsilon=0.1)(x, labels)
    n = len(labels)
    pos, neg = set(), set()
    for a in range(n):
        p = loop_easy_positive(x, labels, a)
        if p is None:
            continue
        pos.add((a, p))
        hardest = min(cos_sim(x, a, j) for j in range(n) if j != a and labels[j] == labels[a])
        for q in range(n):
            if labels[q] != labels[a] and cos_sim(x, a, q) + 0.1 > hardest:
                neg.add((a, q))
    assert pair_sets(sel) == (pos, neg)


@pytest.mark.parametrize("negative", ["random", "distance_weighted"])
def test_easy_positive_sampled_negatives_use_the_nearest_positive(negative):
    x, labels = make_batch(10, n=20)
    sel = EasyPositiveMiner(negative=negative, negatives_per_anchor=3, nonzero_loss_cutoff=2.0)(x, labels)
    anchors_with_pos = [a for a in range(20) if loop_easy_positive(x, labels, a) is not None]
    assert sorted(set(sel.anchor.tolist())) == anchors_with_pos
    assert len(sel) == 3 * len(anchors_with_pos)
    for a, p, q in zip(sel.anchor.tolist(), sel.positive.tolist(), sel.negative.tolist()):
        assert p == loop_easy_positive(x, labels, a)
        assert labels[q] != labels[a]


def test_easy_positive_random_negatives_are_uniform():
    labels = torch.tensor([0, 0, 1, 2, 3])
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))
    miner = EasyPositiveMiner(negative="random", negatives_per_anchor=3000, seed=1)
    sel = miner(x, labels)
    for a in (0, 1):
        counts = torch.bincount(sel.negative[sel.anchor == a], minlength=5)[2:].double()
        assert counts.sum() == 3000
        assert (counts / 3000 - 1 / 3).abs().max() < 0.04


def loop_dws_probabilities(x, labels, cutoff, nonzero_cutoff):
    """Wu et al. Sec. 4: p(n | a) ∝ 1/q(d) for negatives with d < nonzero cutoff, d clipped at cutoff."""
    n, dim = x.shape
    probs = torch.zeros(n, n, dtype=torch.float64)
    for a in range(n):
        logs = {}
        for q in range(n):
            if labels[q] == labels[a]:
                continue
            d = unit_dist(x, a, q)
            if d >= nonzero_cutoff:
                continue
            d = max(d, cutoff)
            logs[q] = -((dim - 2) * math.log(d) + (dim - 3) / 2 * math.log(1 - d * d / 4))
        if logs:
            top = max(logs.values())
            total = sum(math.exp(v - top) for v in logs.values())
            for q, v in logs.items():
                probs[a, q] = math.exp(v - top) / total
    return probs


@pytest.mark.parametrize("dim", [3, 16, 256])
def test_distance_weighted_probabilities_match_formula(dim):
    g = torch.Generator().manual_seed(dim)
    x = torch.randn(14, dim, generator=g, dtype=torch.float64)
    labels = torch.arange(14) % 3
    miner = DistanceWeightedMiner(cutoff=0.5, nonzero_loss_cutoff=1.4)
    from dmlkit.mining.selection import label_masks

    _, negative = label_masks(labels)
    probs, _ = miner.negative_probabilities(x, x, negative)
    ref = loop_dws_probabilities(x, labels, 0.5, 1.4)
    assert torch.allclose(probs, ref, atol=1e-10)
    assert torch.isfinite(probs).all()


def test_distance_weighted_samples_follow_probabilities():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(12, 5, generator=g, dtype=torch.float64)
    labels = torch.arange(12) % 3
    copies = 200  # a reference set holding every sample 200 times: 800 draws per anchor
    memory, memory_labels = x.repeat(copies, 1), labels.repeat(copies)
    sel = DistanceWeightedMiner(nonzero_loss_cutoff=2.0, seed=3)(x, labels, memory, memory_labels)
    assert len(sel) == 12 * 4 * copies  # one triplet per positive pair
    counts = torch.zeros(12, 12, dtype=torch.float64)
    counts.index_put_((sel.anchor, sel.negative % 12), torch.ones(len(sel), dtype=torch.float64), accumulate=True)
    freq = counts / counts.sum(1, keepdim=True)
    ref = loop_dws_probabilities(x, labels, 0.5, 2.0)
    assert (freq - ref).abs().max() < 0.06


def test_distance_weighted_keeps_every_positive_pair():
    x, labels = make_batch(11, n=16, dim=8)
    sel = DistanceWeightedMiner(nonzero_loss_cutoff=2.0)(x, labels)
    pairs = sorted(zip(sel.anchor.tolist(), sel.positive.tolist()))
    ref = sorted((a, p) for a in range(16) for p in range(16) if a != p and labels[a] == labels[p])
    assert pairs == ref
    assert all(labels[a] != labels[q] for a, q in zip(sel.anchor.tolist(), sel.negative.tolist()))


def test_lp_distance_with_similarity_is_consistent_for_batch_hard():
    x, labels = make_batch(12)
    by_dist = triplet_set(BatchHardMiner(LpDistance(normalize_embeddings=True))(x, labels))
    by_sim = triplet_set(BatchHardMiner(CosineSimilarity())(x, labels))
    assert by_dist == by_sim
