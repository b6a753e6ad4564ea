"""CrossBatchMemory's PML interface: add_to_memory/curr_batch_idx, PML miners' tuples and PML inner
losses, input indices_tuple, supported_losses; checked against brute-force pair lists and PML."""

from __future__ import annotations

import pytest
import torch
from pytorch_metric_learning import losses as pml_losses
from pytorch_metric_learning import miners as pml_miners

from dmlkit.exceptions import InvalidParameterError
from dmlkit.losses.pair import ContrastiveLoss
from dmlkit.memory import CrossBatchMemory
from dmlkit.mining import MultiSimilarityMiner, PairMarginMiner
from dmlkit.mining.selection import PairSelection


def stream(steps, n=8, d=6, classes=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, d, generator=g, dtype=torch.float64), torch.randint(0, classes, (n,), generator=g))
            for _ in range(steps)]


def all_pairs_without_self(labels, mem_labels, own_slots):
    """PML's tuple by a loop: every (row, slot) pair, positives without each row's own slot."""
    a1, p, a2, n = [], [], [], []
    for i in range(len(labels)):
        for j in range(len(mem_labels)):
            if labels[i] == mem_labels[j] and j != int(own_slots[i]):
                a1.append(i)
                p.append(j)
            elif labels[i] != mem_labels[j]:
                a2.append(i)
                n.append(j)
    return tuple(torch.tensor(t, dtype=torch.long) for t in (a1, p, a2, n))


def test_add_to_memory_sets_curr_batch_idx_and_wraps():
    memory = CrossBatchMemory(ContrastiveLoss(), 6, memory_size=10)
    x, y = stream(1)[0]
    before = memory.queue_idx
    memory.add_to_memory(x, y, 8)
    assert memory.curr_batch_idx.tolist() == list(range(8)) and int(before) == 0  # the old value is kept
    memory.add_to_memory(x, y, 5)
    assert memory.curr_batch_idx.tolist() == [8, 9, 0, 1, 2] and int(memory.queue_idx) == 3
    assert torch.equal(memory.embedding_memory[[8, 9, 0, 1, 2]], x[:5].float())
    assert "curr_batch_idx" not in memory.state_dict() and "queue_idx" in memory.state_dict()


def test_pml_inner_loss_gets_pmls_tuple_of_all_pairs_without_self():
    inner = pml_losses.ContrastiveLoss()
    memory = CrossBatchMemory(inner, 6, memory_size=20)
    seen_x, seen_y = [], []
    for x, y in stream(4):
        got = memory(x, y)
        seen_x.append(x)
        seen_y.append(y)
        mem_x, mem_y = memory.memory()
        expected = inner(x, y, all_pairs_without_self(y, mem_y, memory.curr_batch_idx), mem_x, mem_y)
        torch.testing.assert_close(got, expected)


def test_pml_miner_tuples_and_dmlkit_selections_give_the_same_loss():
    with_pml = CrossBatchMemory(ContrastiveLoss(), 6, memory_size=24, miner=pml_miners.MultiSimilarityMiner(0.3))
    with_ours = CrossBatchMemory(ContrastiveLoss(), 6, memory_size=24, miner=MultiSimilarityMiner(0.3))
    for x, y in stream(5, seed=2):
        torch.testing.assert_close(with_pml(x, y), with_ours(x, y))


def test_input_indices_tuple_follows_the_mined_pairs_in_pmls_order():
    memory = CrossBatchMemory(ContrastiveLoss(), 6, memory_size=30)
    (x, y), (x2, y2) = stream(2, seed=3)
    memory(x, y)
    given = PairMarginMiner(0.0, 1.0)(x2, y2).to_indices_tuple()
    memory.add_to_memory(x2, y2)
    mem_x, mem_y = memory.memory()
    combined = memory.create_indices_tuple(x2, y2, mem_x, mem_y, given, True)
    mined = all_pairs_without_self(y2, mem_y, memory.curr_batch_idx)
    for c, m, g in zip(combined, mined, given):
        assert torch.equal(c, torch.cat([m, g]))
    triplets = (torch.tensor([0, 1]), torch.tensor([2, 3]), torch.tensor([4, 5]))
    combined = memory.create_indices_tuple(x2, y2, mem_x, mem_y, triplets, True)
    assert torch.equal(combined[0][-2:], triplets[0]) and torch.equal(combined[2][-2:], triplets[0])
    assert torch.equal(combined[3][-2:], triplets[2])


def test_forward_with_indices_tuple_uses_the_concatenated_pairs():
    inner = pml_losses.ContrastiveLoss()
    memory = CrossBatchMemory(inner, 6, memory_size=30)
    (x, y), (x2, y2) = stream(2, seed=4)
    memory(x, y)
    given = pml_miners.PairMarginMiner(0.0, 1.0)(x2, y2)
    got = memory(x2, y2, given)
    mem_x, mem_y = memory.memory()
    mined = all_pairs_without_self(y2, mem_y, memory.curr_batch_idx)
    expected = inner(x2, y2, tuple(torch.cat([m, g]) for m, g in zip(mined, given)), mem_x, mem_y)
    torch.testing.assert_close(got, expected)
    with pytest.raises(InvalidParameterError, match="indices_tuple or enqueue_mask"):
        memory(x2, y2, given, torch.ones(8, dtype=torch.bool))


def test_supported_losses_is_pmls_list():
    assert CrossBatchMemory.supported_losses() == pml_losses.CrossBatchMemory.supported_losses()
    CrossBatchMemory.check_loss_support("ContrastiveLoss")
    with pytest.raises(InvalidParameterError, match="ProxyAnchorLoss"):
        CrossBatchMemory.check_loss_support("ProxyAnchorLoss")


def test_float64_batches_get_a_float64_memory_matching_pml():
    ours = CrossBatchMemory(ContrastiveLoss(), 6, memory_size=20)
    pml = pml_losses.CrossBatchMemory(pml_losses.ContrastiveLoss(), 6, memory_size=20)
    for x, y in stream(4, seed=5):
        torch.testing.assert_close(ours(x, y), pml(x, y), rtol=1e-12, atol=1e-12)
    assert ours.embedding_memory.dtype == torch.float64
    assert torch.equal(ours.embedding_memory, pml.embedding_memory)


def test_resume_from_state_dict_continues_identically():
    a = CrossBatchMemory(ContrastiveLoss(), 6, memory_size=12, miner=pml_miners.MultiSimilarityMiner(0.2))
    batches = stream(6, seed=6)
    for x, y in batches[:3]:
        a(x, y)
    b = CrossBatchMemory(ContrastiveLoss(), 6, memory_size=12, miner=pml_miners.MultiSimilarityMiner(0.2))
    b(*batches[0])  # same dtype as a's memory
    b.load_state_dict(a.state_dict())
    for x, y in batches[3:]:
        torch.testing.assert_close(a(x, y), b(x, y))



def test_a_float16_batch_gets_a_memory_of_its_dtype_as_pmls():
    """PML casts the memory to the embeddings' dtype, so a PML loss inside meets one dtype (a float32 memory
    beside float16 embeddings raised ``Index put requires the source and destination dtypes match``)."""
    ours = CrossBatchMemory(pml_losses.ContrastiveLoss(), 6, memory_size=20)
    pml = pml_losses.CrossBatchMemory(pml_losses.ContrastiveLoss(), 6, memory_size=20)
    for x, y in stream(3, seed=7):
        x = x.half()
        got = ours(x, y)
        assert got.dtype == torch.float16 and ours.embedding_memory.dtype == torch.float16
        torch.testing.assert_close(got, pml(x, y), rtol=0, atol=0)  # the same half-precision arithmetic
    assert torch.equal(ours.embedding_memory, pml.embedding_memory)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_dmlkit_losses_in_a_half_precision_memory_accumulate_in_float32(dtype):
    memory = CrossBatchMemory(ContrastiveLoss(), 6, memory_size=8)
    (x1, y1), (x2, y2) = stream(2, seed=8)
    memory(x1.to(dtype), y1)
    got = memory(x2.to(dtype), y2)  # the second batch against the first (the memory is full)
    assert got.dtype == dtype and memory.embedding_memory.dtype == dtype
    own = torch.arange(8, 16) % 8  # the second batch's own slots (they replaced the first batch's)
    positive = (y2[:, None] == y2[None, :]) & (own[:, None] != torch.arange(8)[None, :])
    negative = y2[:, None] != y2[None, :]
    reference = ContrastiveLoss()(x2.to(dtype).float(), y2, ref_emb=x2.to(dtype).float(), ref_labels=y2,
                                  pairs=PairSelection(positive, negative))
    torch.testing.assert_close(got, reference.to(dtype), rtol=0, atol=0)  # the float32 loss, rounded once
