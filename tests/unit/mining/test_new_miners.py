"""AngularMiner, BatchEasyHardMiner, HDCMiner, UniformHistogramMiner, EmbeddingsAlreadyPackagedAsTriplets:
float64 brute-force loops written from the definitions, and PML on matched settings."""

from __future__ import annotations

import math

import pytest
import torch
from pytorch_metric_learning import distances as pml_distances
from pytorch_metric_learning import miners as pml_miners

from dmlkit.distances import CosineSimilarity, LpDistance
from dmlkit.exceptions import DataError, InvalidParameterError
from dmlkit.mining import (
    AngularMiner,
    BatchEasyHardMiner,
    EmbeddingsAlreadyPackagedAsTriplets,
    HDCMiner,
    PairSelection,
    TripletSelection,
    UniformHistogramMiner,
)


def batch(seed: int, n: int = 24, dim: int = 5, classes: int = 4):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, dim, generator=g, dtype=torch.float64), torch.randint(0, classes, (n,), generator=g)


def dist(x, i, j, normalise=True):
    a, b = x[i], x[j]
    if normalise:
        a, b = a / a.norm(), b / b.norm()
    return float((a - b).norm())


def triplets_of(sel):
    return set(zip(*(t.tolist() for t in sel.to_indices_tuple())))


@pytest.mark.parametrize("angle", [0, 20, 45, 70])
@pytest.mark.parametrize("seed", [0, 1])
def test_angular_miner_matches_the_angle_definition(angle, seed):
    x, labels = batch(seed)
    expected = set()
    for a in range(len(x)):
        for p in range(len(x)):
            if p == a or labels[p] != labels[a]:
                continue
            centre = (x[a] + x[p]) / 2
            for n in range(len(x)):
                if labels[n] == labels[a]:
                    continue
                # Wang et al. (2017) Eq. (5): tan(angle_n) = ||x_a - x_p|| / (2 ||x_n - x_c||), embeddings as given
                theta = math.atan(float((x[a] - x[p]).norm()) / (2 * float((x[n] - centre).norm())))
                if theta > math.radians(angle):
                    expected.add((a, p, n))
    sel = AngularMiner(angle)(x, labels)
    assert isinstance(sel, TripletSelection)
    assert triplets_of(sel) == expected
    pml = pml_miners.AngularMiner(angle)(x, labels)
    assert set(zip(*(t.tolist() for t in pml))) == expected


@pytest.mark.parametrize("angle", [0, 10, 20, 30, 40, 50, 60])
def test_angular_miner_float16_keeps_pmls_triplets_on_the_threshold(angle):  # 10: triplets on the threshold
    """Points on a circle every 1 degree give float16 angles that round onto the thresholds; a
    float16 batch is mined in float16 with PML's formula, so PML's own float16 choice is kept."""
    rad = torch.arange(16, dtype=torch.float64) * math.pi / 180
    x = torch.stack([rad.cos(), rad.sin()], 1).half()
    labels = torch.tensor([0, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 0, 0])
    mined = triplets_of(AngularMiner(angle)(x, labels))
    pml = pml_miners.AngularMiner(angle)(x, labels)
    assert mined == set(zip(*(t.tolist() for t in pml)))


def test_angular_miner_refuses_another_distance():
    with pytest.raises(InvalidParameterError, match="LpDistance"):
        AngularMiner(distance=CosineSimilarity())


def brute_easy_hard(x, labels, pos_strategy, neg_strategy, pos_range, neg_range, normalise=True):
    """Per anchor, the positive and negative picked by the strategies (a loop over candidates)."""
    n = len(x)

    def pick(cands, farthest, bound=None, beyond=None):
        ok = [(dist(x, a, j, normalise), j) for a, j in cands]
        if bound is not None:
            ok = [(d, j) for d, j in ok if (d > bound if beyond else d < bound)]
        if not ok:
            return None
        best = max(d for d, _ in ok) if farthest else min(d for d, _ in ok)
        return best, min(j for d, j in ok if d == best)

    def allowed(d, rng):
        return rng is None or rng[0] <= d <= rng[1]

    pos_pairs, neg_pairs = set(), set()
    for a in range(n):
        P = [(a, j) for j in range(n) if j != a and labels[j] == labels[a] and allowed(dist(x, a, j, normalise), pos_range)]
        N = [(a, j) for j in range(n) if labels[j] != labels[a] and allowed(dist(x, a, j, normalise), neg_range)]
        neg_far = neg_strategy == "easy"
        if pos_strategy == "semihard":
            ng = pick(N, neg_far)
            pp = pick(P, True, ng[0], beyond=False) if ng else None
        elif neg_strategy == "semihard":
            pp = pick(P, pos_strategy != "easy")
            ng = pick(N, False, pp[0], beyond=True) if pp else None
        else:
            pp = pick(P, pos_strategy == "hard") if pos_strategy != "all" else None
            ng = pick(N, neg_far) if neg_strategy != "all" else None
        if pos_strategy == "all":
            pos_pairs |= {(a, j) for j in range(n) if j != a and labels[j] == labels[a]}
        if neg_strategy == "all":
            neg_pairs |= {(a, j) for j in range(n) if labels[j] != labels[a]}
        if pos_strategy != "all" and neg_strategy != "all":
            if pp and ng:
                pos_pairs.add((a, pp[1]))
                neg_pairs.add((a, ng[1]))
        elif pos_strategy != "all" and pp:
            pos_pairs.add((a, pp[1]))
        elif neg_strategy != "all" and ng:
            neg_pairs.add((a, ng[1]))
    return pos_pairs, neg_pairs


STRATEGY_PAIRS = [(p, n) for p in ("easy", "hard", "semihard", "all") for n in ("easy", "hard", "semihard", "all")
                  if {p, n} not in ({"semihard"}, {"semihard", "all"})]


@pytest.mark.parametrize("pos_strategy, neg_strategy", STRATEGY_PAIRS)
@pytest.mark.parametrize("ranges", [(None, None), ((0.2, 1.2), (0.5, 1.6))])
def test_batch_easy_hard_matches_a_loop_and_pml(pos_strategy, neg_strategy, ranges):
    x, labels = batch(3)
    sel = BatchEasyHardMiner(pos_strategy, neg_strategy, *ranges)(x, labels)
    a1, p, a2, n = sel.to_indices_tuple()
    pos, neg = brute_easy_hard(x, labels, pos_strategy, neg_strategy, *ranges)
    assert set(zip(a1.tolist(), p.tolist())) == pos and set(zip(a2.tolist(), n.tolist())) == neg
    pml = pml_miners.BatchEasyHardMiner(pos_strategy, neg_strategy, *ranges)(x, labels)
    assert all(torch.equal(o, q) for o, q in zip(sel.to_indices_tuple(), pml))


def test_batch_easy_hard_with_a_similarity_agrees_with_pml():
    x, labels = batch(4)
    for pos_strategy, neg_strategy in STRATEGY_PAIRS:
        ours = BatchEasyHardMiner(pos_strategy, neg_strategy, distance=CosineSimilarity())(x, labels)
        pml = pml_miners.BatchEasyHardMiner(pos_strategy, neg_strategy, distance=pml_distances.CosineSimilarity())(x, labels)
        assert all(torch.equal(o, q) for o, q in zip(ours.to_indices_tuple(), pml)), (pos_strategy, neg_strategy)


@pytest.mark.parametrize("fraction", [0.1, 0.3, 0.5, 1.0])
def test_hdc_keeps_the_hardest_share_over_the_batch(fraction):
    x, labels = batch(5)
    sel = HDCMiner(filter_percentage=fraction)(x, labels)
    assert isinstance(sel, PairSelection)
    a1, p, a2, n = sel.to_indices_tuple()
    pos = [(dist(x, i, j), i, j) for i in range(len(x)) for j in range(len(x)) if i != j and labels[i] == labels[j]]
    neg = [(dist(x, i, j), i, j) for i in range(len(x)) for j in range(len(x)) if labels[i] != labels[j]]
    k_pos, k_neg = math.ceil(fraction * len(pos)), math.ceil(fraction * len(neg))
    assert len(a1) == k_pos and len(a2) == k_neg
    cut_pos = sorted((d for d, _, _ in pos), reverse=True)[k_pos - 1]
    cut_neg = sorted(d for d, _, _ in neg)[k_neg - 1]
    assert all(dist(x, i, j) >= cut_pos - 1e-12 for i, j in zip(a1.tolist(), p.tolist()))
    assert all(dist(x, i, j) <= cut_neg + 1e-12 for i, j in zip(a2.tolist(), n.tolist()))
    pml = pml_miners.HDCMiner(filter_percentage=fraction)(x, labels)
    assert all(torch.equal(o, q) for o, q in zip(sel.to_indices_tuple(), pml))
    assert int(sel.positive.sum()) == k_pos and int(sel.negative.sum()) == k_neg  # masks hold the same set


@pytest.mark.parametrize("distance", [None, CosineSimilarity()])
def test_hdc_pml_tuple_is_the_selection_list_and_pmls(distance):
    """``as_pml()`` builds the hardest-first list alone; it is the selection's list (same pairs as
    its masks, same order) and PML's tuple up to the order of the two directions of one pair, whose
    values tie (PML's distance differs from dmlkit's in the last bit, which decides that order)."""
    x, labels = batch(7, n=40)
    miner = HDCMiner(filter_percentage=0.5, distance=distance)
    sel = miner(x, labels)
    listed = miner.as_pml()(x, labels)
    assert all(torch.equal(a, b) for a, b in zip(listed, sel.to_indices_tuple()))
    pml_distance = None if distance is None else pml_distances.CosineSimilarity()
    pml = pml_miners.HDCMiner(filter_percentage=0.5, **({} if pml_distance is None else {"distance": pml_distance}))
    pml_listed = pml(x, labels)
    for i in (0, 2):
        undirected = [{a, b} for a, b in zip(listed[i].tolist(), listed[i + 1].tolist())]
        assert undirected == [{a, b} for a, b in zip(pml_listed[i].tolist(), pml_listed[i + 1].tolist())]
    a1, p, a2, n = listed
    assert torch.equal(sel.positive.nonzero(as_tuple=True)[0].sort().values, a1.sort().values)
    assert sel.positive[a1, p].all() and sel.negative[a2, n].all()
    assert int(sel.positive.sum()) == len(a1) and int(sel.negative.sum()) == len(a2)


def test_uniform_histogram_draws_per_bin_counts_and_is_seeded():
    x, labels = batch(6, n=40)
    miner = UniformHistogramMiner(num_bins=7, pos_per_bin=3, neg_per_bin=5, seed=1)
    a1, p, a2, n = miner(x, labels).to_indices_tuple()
    for (anc, oth, per_bin, same) in ((a1, p, 3, True), (a2, n, 5, False)):
        assert all((labels[i] == labels[j]) == same for i, j in zip(anc.tolist(), oth.tolist()))
        allv = [dist(x, i, j) for i in range(40) for j in range(40) if i != j and (labels[i] == labels[j]) == same]
        lo, hi = min(allv), max(allv)
        width = (hi - lo) / 7

        def bin_of(d):
            return min(int((d - lo) / width), 6)
        filled = {bin_of(d) for d in allv}
        drawn = [bin_of(dist(x, i, j)) for i, j in zip(anc.tolist(), oth.tolist())]
        assert {b: drawn.count(b) for b in set(drawn)} == {b: per_bin for b in filled}
    again = UniformHistogramMiner(num_bins=7, pos_per_bin=3, neg_per_bin=5, seed=1)(x, labels).to_indices_tuple()
    assert all(torch.equal(u, v) for u, v in zip((a1, p, a2, n), again))
    assert not torch.equal(a2, UniformHistogramMiner(7, 3, 5, seed=2)(x, labels).to_indices_tuple()[2])


def test_uniform_histogram_bins_match_pmls_on_a_shared_distance():
    # same bins as PML (not the same draws: each has its own generator): per-bin counts agree
    x, labels = batch(7, n=30)
    for ours_d, pml_d in ((LpDistance(normalize_embeddings=False), pml_distances.LpDistance(normalize_embeddings=False)),
                          (CosineSimilarity(), pml_distances.CosineSimilarity())):
        ours = UniformHistogramMiner(5, 2, 4, distance=ours_d)(x, labels).to_indices_tuple()
        torch.manual_seed(0)
        pml = pml_miners.UniformHistogramMiner(5, 2, 4, distance=pml_d)(x, labels)
        assert [len(t) for t in ours] == [len(t) for t in pml]


def test_packaged_triplets_reads_rows_in_threes():
    x, labels = batch(8, n=9)
    sel = EmbeddingsAlreadyPackagedAsTriplets()(x, labels)
    assert triplets_of(sel) == {(0, 1, 2), (3, 4, 5), (6, 7, 8)}
    with pytest.raises(DataError, match="multiple of 3"):
        EmbeddingsAlreadyPackagedAsTriplets()(x[:8], labels[:8])


def test_pml_style_mine_reads_the_batch_passed_as_its_own_reference_as_one_set():
    x, labels = batch(9)
    miner = BatchEasyHardMiner("hard", "hard").as_pml()
    via_mine = miner.mine(x, labels, x, labels)
    assert all(torch.equal(a, b) for a, b in zip(via_mine, miner(x, labels)))
    assert not any(i == j for i, j in zip(via_mine[0].tolist(), via_mine[1].tolist()))  # no self-pairs
    other = x.clone()  # a distinct reference tensor is a reference set: the anchor's own copy is a positive
    a1, p, _, _ = BatchEasyHardMiner("easy", "hard").as_pml().mine(x, labels, other, labels.clone())
    assert torch.equal(a1, p)  # the easiest (closest) positive of each anchor is its own copy, at distance 0


def test_distance_weighted_miner_takes_pmls_asserted_distance_only():
    from pytorch_metric_learning.distances import LpDistance as PMLLpDistance

    from dmlkit.mining import DistanceWeightedMiner

    assert DistanceWeightedMiner(0.5, 1.4, LpDistance(normalize_embeddings=True)).distance.normalize_embeddings
    assert DistanceWeightedMiner(distance=PMLLpDistance()).distance.power == 1
    with pytest.raises(InvalidParameterError, match="'distance' parameter of DistanceWeightedMiner"):
        DistanceWeightedMiner(distance=CosineSimilarity())
