"""PML's sampler calls: MPerClassSampler's positional order and defaults, HierarchicalSampler,
FixedSetOfTriplets, TuplesToWeightsSampler (composition, seeding, resume, weights by brute force)."""

from __future__ import annotations

import collections
import itertools

import pytest
import torch
from torch.utils.data import TensorDataset

from dmlkit.data import FixedSetOfTriplets, HierarchicalSampler, MPerClassSampler, TuplesToWeightsSampler
from dmlkit.exceptions import BatchCompositionError, CheckpointError, DataError, InvalidParameterError
from dmlkit.mining import TripletMarginMiner


def _labels(sizes: list[int]) -> torch.Tensor:
    return torch.cat([torch.full((n,), c, dtype=torch.int64) for c, n in enumerate(sizes)])


def test_m_per_class_takes_pml_positional_arguments_and_defaults():
    labels = _labels([7] * 10)
    sampler = MPerClassSampler(labels, 4, 32, 1000)  # PML: (labels, m, batch_size, length_before_new_iter)
    assert sampler.length_before_new_iter == 1000 and sampler.seed == 0
    assert len(sampler) == 1000 - 1000 % 32
    default = MPerClassSampler(labels, 4, 32)
    assert len(default) == 100000 - 100000 % 32  # PML's default length
    assert MPerClassSampler(labels, 4, 32, None).length_before_new_iter == len(labels)
    with pytest.raises(TypeError):
        MPerClassSampler(labels, 4, 32, 1000, 7)  # seed is keyword-only


def test_m_per_class_without_batch_size_yields_whole_passes_over_the_classes():
    labels = _labels([3, 9, 5, 6])
    sampler = MPerClassSampler(labels, 2, length_before_new_iter=50)
    assert sampler.batch_size is None
    assert len(sampler) == 50 - 50 % 8  # whole passes of m * classes = 8 images (as PML)
    flat = torch.tensor(list(sampler))
    for chunk in flat.reshape(-1, 8):
        counts = collections.Counter(labels[chunk].tolist())
        assert sorted(counts) == [0, 1, 2, 3] and set(counts.values()) == {2}


@pytest.mark.parametrize("args", [(_labels([5] * 3), 3, 8, 100), (_labels([5] * 3), 2, 8, 100),
                                  (_labels([5] * 3), 2, 4, 3)])
def test_impossible_m_per_class_settings_raise_pmls_assertion_type_too(args):
    with pytest.raises(AssertionError) as err:
        MPerClassSampler(*args)
    assert isinstance(err.value, BatchCompositionError) and isinstance(err.value, InvalidParameterError)


def _hierarchy(num_super: int = 4, classes_per_super: int = 5, n: int = 400, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    classes = torch.randint(0, num_super * classes_per_super, (n,), generator=g)
    return torch.stack([classes, classes // classes_per_super], dim=1)


@pytest.mark.parametrize("samples_per_class", [3, "all"])
def test_hierarchical_batches_cover_every_super_tuple_with_whole_classes(samples_per_class):
    labels = _hierarchy(n=400 if samples_per_class == 3 else 160)  # "all": classes of ~8 images fit a half of 12
    sampler = HierarchicalSampler(labels, batch_size=24, samples_per_class=samples_per_class,
                                  batches_per_super_tuple=3, super_classes_per_batch=2)
    batches = list(sampler)
    assert len(batches) == len(sampler) == 3 * len(list(itertools.combinations(range(4), 2)))
    tuples = collections.Counter()
    for batch in batches:
        supers = collections.Counter(labels[batch, 1].tolist())
        tuples[tuple(sorted(supers))] += 1
        assert len(supers) == 2
        per_class = collections.Counter(labels[batch, 0].tolist())
        if samples_per_class == "all":
            assert all(v == int((labels[:, 0] == c).sum()) for c, v in per_class.items())
            assert all(v <= 12 for v in supers.values())
        else:
            assert len(batch) == 24 and set(per_class.values()) == {3} and set(supers.values()) == {12}
            assert int(torch.bincount(labels[:, 0]).min()) > 3
            assert len(set(batch)) == len(batch)  # every class has more than 3 images: no repeat
    assert set(tuples.values()) == {3}


def test_hierarchical_is_seeded_resumable_and_leaves_global_rng_alone():
    labels = _hierarchy()
    state = torch.get_rng_state()
    a = HierarchicalSampler(labels, 24, 3, seed=5)
    first = list(a)
    assert torch.equal(state, torch.get_rng_state())
    assert first == list(HierarchicalSampler(labels, 24, 3, seed=5))
    assert first != list(HierarchicalSampler(labels, 24, 3, seed=6))
    second_epoch = a.batches(1)
    it = iter(a)  # epoch 1
    next(it), next(it)
    saved = a.state_dict()
    resumed = HierarchicalSampler(labels, 24, 3, seed=5)
    resumed.load_state_dict(saved)
    assert list(resumed) == second_epoch[2:]
    with pytest.raises(CheckpointError):
        HierarchicalSampler(labels, 24, 3, seed=9).load_state_dict(saved)


def test_hierarchical_checks_its_settings():
    labels = _hierarchy()
    with pytest.raises(AssertionError, match="not a multiple of super_classes_per_batch 2"):
        HierarchicalSampler(labels, 25, 5)
    with pytest.raises(AssertionError, match="not a multiple of samples_per_class 5"):
        HierarchicalSampler(labels, 24, 5)
    with pytest.raises(InvalidParameterError, match="'samples_per_class' parameter of HierarchicalSampler"):
        HierarchicalSampler(labels, 24, "some")
    with pytest.raises(DataError, match=r"\[N, levels\]"):
        HierarchicalSampler(labels[:, 0], 24, 3)


def test_fixed_set_of_triplets_relations_and_draw_frequencies():
    labels = _labels([1, 4, 30, 2, 13])
    sampler = FixedSetOfTriplets(labels, 20000, seed=3)
    t = sampler.fixed_set_of_triplets
    assert t.shape == (20000, 3) and len(sampler) == 60000
    a, p, n = labels[t[:, 0]], labels[t[:, 1]], labels[t[:, 2]]
    assert torch.equal(a, p) and (a != n).all()
    big = labels[t[:, 0]] != 0  # classes with 2+ images give two distinct images
    assert (t[big, 0] != t[big, 1]).all()
    # brute force: classes are drawn uniformly (not by size), negatives uniformly among the others
    freq = torch.bincount(a, minlength=5).double() / len(a)
    assert torch.allclose(freq, torch.full((5,), 0.2, dtype=torch.float64), atol=0.015)
    pair = torch.bincount(a * 5 + n, minlength=25).double().reshape(5, 5) / len(a)
    expected = torch.full((5, 5), 0.2 / 4, dtype=torch.float64).fill_diagonal_(0)
    assert torch.allclose(pair, expected, atol=0.01)
    # within the 30-image class, anchors are uniform over its images
    inside = t[a == 2, 0]
    assert torch.bincount(inside - int((labels < 2).sum()), minlength=30).min() > 0


def test_fixed_set_of_triplets_yields_whole_triplets_in_a_new_order_each_epoch():
    labels = _labels([3, 3, 3])
    sampler = FixedSetOfTriplets(labels, 50, seed=1)
    e0, e1 = torch.tensor(list(sampler)).reshape(-1, 3), torch.tensor(list(sampler)).reshape(-1, 3)
    as_set = {tuple(r) for r in sampler.fixed_set_of_triplets.tolist()}
    assert {tuple(r) for r in e0.tolist()} == as_set == {tuple(r) for r in e1.tolist()}
    assert not torch.equal(e0, e1)
    assert torch.equal(FixedSetOfTriplets(labels, 50, seed=1).fixed_set_of_triplets, sampler.fixed_set_of_triplets)
    with pytest.raises(AssertionError):
        FixedSetOfTriplets(torch.zeros(5, dtype=torch.long), 10)


def test_tuples_to_weights_sampler_weights_are_mined_counts_over_their_maximum():
    g = torch.Generator().manual_seed(0)
    x, labels = torch.randn(40, 6, generator=g), torch.arange(40) % 4
    model = torch.nn.Linear(6, 5)
    miner = TripletMarginMiner(margin=0.1)
    sampler = TuplesToWeightsSampler(model, miner, TensorDataset(x, labels), seed=2)
    drawn = list(sampler)
    assert len(drawn) == 40
    with torch.no_grad():
        triplets = miner(model(x), labels)
    counts = torch.zeros(40)
    for i in torch.cat([triplets.anchor, triplets.positive, triplets.negative]).tolist():
        counts[i] += 1
    assert torch.allclose(sampler.weights, counts / counts.max(), atol=1e-6)
    assert all(sampler.weights[i] > 0 for i in drawn)


def test_tuples_to_weights_sampler_subset_and_pml_miner_tuples():
    from pytorch_metric_learning.miners import MultiSimilarityMiner

    g = torch.Generator().manual_seed(1)
    x, labels = torch.randn(60, 4, generator=g), torch.arange(60) % 3
    state = torch.get_rng_state()
    sampler = TuplesToWeightsSampler(torch.nn.Identity(), MultiSimilarityMiner(epsilon=-0.2),
                                     TensorDataset(x, labels), subset_size=20, seed=4)
    drawn = list(sampler)
    assert len(drawn) == len(sampler) == 20
    assert int((sampler.weights > 0).sum()) <= 20 and all(sampler.weights[i] > 0 for i in drawn)
    assert torch.equal(state, torch.get_rng_state())
