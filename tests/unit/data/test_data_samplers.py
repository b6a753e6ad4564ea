"""Samplers: batch composition, determinism, mid-epoch resume, distributed parts."""

from __future__ import annotations

import collections

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, TensorDataset

from dmlkit.data.samplers import MPerClassSampler, OnePerClassSampler, ShuffledSampler, create_sampler
from dmlkit.exceptions import CheckpointError, DataError, InvalidParameterError


def _labels(sizes: list[int]) -> torch.Tensor:
    return torch.cat([torch.full((n,), c, dtype=torch.int64) for c, n in enumerate(sizes)])


def _check_m_per_class(batches: torch.Tensor, labels: torch.Tensor, m: int) -> None:
    for batch in batches:
        counts = collections.Counter(labels[batch].tolist())
        assert all(v == m for v in counts.values()), counts
        assert len(counts) * m == batch.numel()
        for c in counts:
            idx = batch[labels[batch] == c]
            n_c = int((labels == c).sum())
            assert idx.unique().numel() == min(m, n_c)


def test_m_per_class_batches_have_m_distinct_images_of_distinct_classes():
    labels = _labels([7, 5, 9, 4, 6, 8, 5, 4, 10, 3])[torch.randperm(61, generator=torch.Generator().manual_seed(0))]
    sampler = MPerClassSampler(labels, m=4, batch_size=16, seed=1, length_before_new_iter=200)
    batches = sampler.batches()
    assert batches.shape == (200 // 16, 16)
    _check_m_per_class(batches, labels, 4)


def test_classes_visited_in_rounds_so_appearances_differ_by_at_most_one():
    labels = _labels([6] * 13)
    sampler = MPerClassSampler(labels, m=2, batch_size=8, seed=5, length_before_new_iter=8 * 40)
    counts = torch.bincount(labels[sampler.batches()[:, ::2].reshape(-1)], minlength=13)
    assert counts.max() - counts.min() <= 1


def test_small_classes_repeat_images_evenly():
    labels = _labels([2, 3, 8])
    sampler = MPerClassSampler(labels, m=4, batch_size=12, seed=0, length_before_new_iter=24)
    for batch in sampler.batches():
        got = collections.Counter(batch.tolist())
        assert sorted(got[i] for i in range(2)) == [2, 2]  # class 0: 2 images x 2
        assert sorted(got[i] for i in range(2, 5)) == [1, 1, 2]  # class 1: 3 images, m=4


def test_images_of_a_class_cycle_without_repeats_within_an_epoch():
    labels = _labels([8, 8])
    sampler = MPerClassSampler(labels, m=4, batch_size=8, seed=3, length_before_new_iter=16)
    flat = sampler.batches().reshape(-1)
    assert sorted(flat.tolist()) == list(range(16))


def test_same_seed_same_order_other_epoch_or_seed_differs():
    labels = _labels([10] * 20)
    a = MPerClassSampler(labels, 4, 32, seed=7)
    b = MPerClassSampler(labels, 4, 32, seed=7)
    assert torch.equal(a.batches(0), b.batches(0))
    assert not torch.equal(a.batches(0), a.batches(1))
    assert not torch.equal(a.batches(0), MPerClassSampler(labels, 4, 32, seed=8).batches(0))


def test_iteration_advances_epoch_and_set_epoch_rewinds():
    labels = _labels([10] * 20)
    sampler = MPerClassSampler(labels, 4, 32, seed=7)
    first = list(sampler)
    second = list(sampler)
    assert first == sampler.batches(0).reshape(-1).tolist()
    assert second == sampler.batches(1).reshape(-1).tolist()
    sampler.set_epoch(0)
    assert list(sampler) == first


def test_resume_mid_epoch_gives_the_remaining_indices():
    labels = _labels([10] * 20)
    sampler = MPerClassSampler(labels, 4, 32, seed=11)
    sampler.set_epoch(3)
    it = iter(sampler)
    consumed = [next(it) for _ in range(70)]
    state = sampler.state_dict()
    assert state["epoch"] == 3 and state["position"] == 70
    resumed = MPerClassSampler(labels, 4, 32, seed=11)
    resumed.load_state_dict(state)
    resumed.set_epoch(3)  # the engine's usual call keeps the pending position
    assert consumed + list(resumed) == sampler.batches(3).reshape(-1).tolist()
    assert resumed.epoch == 4


def test_state_dict_from_batches_done_with_a_dataloader():
    labels = _labels([6] * 12)
    sampler = MPerClassSampler(labels, 3, 12, seed=2)
    loader = DataLoader(TensorDataset(torch.arange(len(labels))), batch_size=sampler.local_batch_size, sampler=sampler)
    seen = []
    for step, (idx,) in enumerate(loader):
        seen.append(idx)
        if step == 2:
            state = sampler.state_dict(batches_done=3)
            break
    resumed = MPerClassSampler(labels, 3, 12, seed=2)
    resumed.load_state_dict(state)
    rest = list(DataLoader(TensorDataset(torch.arange(len(labels))), batch_size=12, sampler=resumed))
    assert torch.equal(torch.cat(seen + [r[0] for r in rest]), sampler.batches(0).reshape(-1))


def test_load_state_dict_rejects_another_configuration():
    labels = _labels([10] * 20)
    state = MPerClassSampler(labels, 4, 32, seed=1).state_dict()
    with pytest.raises(CheckpointError, match="batch_size: checkpoint 32 vs sampler 16"):
        MPerClassSampler(labels, 4, 16, seed=1).load_state_dict(state)


def test_ranks_get_disjoint_parts_of_every_batch():
    labels = _labels([9] * 16)
    world = [MPerClassSampler(labels, 4, 32, seed=4, rank=r, world_size=4) for r in range(4)]
    single = MPerClassSampler(labels, 4, 32, seed=4)
    parts = torch.cat([s.batches(2) for s in world], dim=1)
    assert torch.equal(parts, single.batches(2))
    assert all(len(s) == len(single) // 4 for s in world)
    _check_m_per_class(world[1].batches(2), labels, 4)  # local batch 8 = 2 whole classes


def test_one_per_class_batches_hold_distinct_classes():
    labels = _labels([3, 1, 4, 1, 5, 9, 2, 6])
    sampler = OnePerClassSampler(labels, batch_size=8, seed=0, length_before_new_iter=64)
    for batch in sampler.batches():
        assert labels[batch].unique().numel() == 8


def test_shuffled_sampler_is_a_permutation_per_epoch():
    sampler = ShuffledSampler(23, 5, seed=9, drop_last=False)
    flat = sampler.batches(0).reshape(-1)
    assert flat.numel() == 25 and sorted(flat[:23].tolist()) == list(range(23))
    assert ShuffledSampler(23, 5, seed=9).batches(0).shape == (4, 5)
    assert isinstance(create_sampler("random", num_samples=10, batch_size=2), ShuffledSampler)


def test_parameter_and_data_errors_are_explicit():
    labels = _labels([4] * 3)
    with pytest.raises(InvalidParameterError, match="The 'm' parameter of MPerClassSampler must be an int >= 1. Got 0"):
        MPerClassSampler(labels, 0, 8)
    with pytest.raises(InvalidParameterError, match="not divisible by m 3"):
        MPerClassSampler(labels, 3, 8)
    with pytest.raises(DataError, match="needs 4 distinct classes per batch but labels has 3 classes"):
        MPerClassSampler(labels, 2, 8)
    with pytest.raises(DataError, match="integer class ids"):
        MPerClassSampler(labels.float(), 2, 4)
    with pytest.raises(InvalidParameterError, match="Did you mean 'm_per_class'"):
        create_sampler("m_per_clas", labels=labels, m=2, batch_size=4)


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 9), min_size=2, max_size=12),
    m=st.integers(1, 4),
    classes_per_batch=st.integers(1, 4),
    seed=st.integers(0, 2**31),
)
def test_property_every_batch_is_m_per_class(sizes, m, classes_per_batch, seed):
    classes_per_batch = min(classes_per_batch, len(sizes))
    labels = _labels(sizes)
    sampler = MPerClassSampler(labels, m, m * classes_per_batch, seed=seed,
                               length_before_new_iter=max(len(labels), m * classes_per_batch))
    batches = sampler.batches()
    assert batches.min() >= 0 and batches.max() < len(labels)
    _check_m_per_class(batches, labels, m)


def test_same_batch_structure_as_pml_m_per_class():
    from pytorch_metric_learning.samplers import MPerClassSampler as PMLSampler

    labels = _labels([6] * 10)
    pml = list(PMLSampler(labels.numpy(), m=3, batch_size=12, length_before_new_iter=120))
    ours = MPerClassSampler(labels, 3, 12, seed=0, length_before_new_iter=120)
    assert len(pml) == len(ours)
    pml_batches = torch.tensor(pml).reshape(-1, 12)
    for batches in (pml_batches, ours.batches()):
        for batch in batches:
            assert sorted(collections.Counter(labels[batch].tolist()).values()) == [3, 3, 3, 3]


@settings(max_examples=20, deadline=None)
@given(position=st.integers(0, 96), epoch=st.integers(0, 5), world_size=st.sampled_from([1, 2, 4]), seed=st.integers(0, 99))
def test_property_resume_at_any_position_continues_the_epoch(position, epoch, world_size, seed):
    labels = _labels([5] * 10)
    rank = world_size - 1
    make = lambda: MPerClassSampler(labels, 2, 8, seed=seed, rank=rank, world_size=world_size)  # noqa: E731
    sampler = make()
    sampler.set_epoch(epoch)
    position = min(position, len(sampler))
    it = iter(sampler)
    head = [next(it) for _ in range(position)]
    resumed = make()
    resumed.load_state_dict(sampler.state_dict())
    assert head + list(resumed) == sampler.batches(epoch).reshape(-1).tolist()


def test_shuffled_sampler_ranks_split_each_batch():
    parts = [ShuffledSampler(40, 8, seed=1, rank=r, world_size=2).batches(0) for r in range(2)]
    assert torch.equal(torch.cat(parts, dim=1), ShuffledSampler(40, 8, seed=1).batches(0))
    with pytest.raises(InvalidParameterError, match="not divisible by world_size 3"):
        ShuffledSampler(40, 8, rank=0, world_size=3)
    with pytest.raises(InvalidParameterError, match=r"'rank' parameter of ShuffledSampler must be an int in the range \[0, 1\]"):
        ShuffledSampler(40, 8, rank=2, world_size=2)
