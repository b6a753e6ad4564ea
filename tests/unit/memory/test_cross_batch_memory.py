"""CrossBatchMemory: PML agreement, manual reference set, exact state_dict resume, warm-up."""

import pytest
import torch
from pytorch_metric_learning import losses as pml_losses

from dmlkit.exceptions import DataError, InvalidParameterError
from dmlkit.losses.base import LOSSES
from dmlkit.losses.pair import ContrastiveLoss, MultiSimilarityLoss, NPairsLoss, TripletMarginLoss
from dmlkit.memory import MEMORIES, CrossBatchMemory
from dmlkit.mining.selection import PairSelection, TripletSelection


def stream(steps, n=8, d=6, classes=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, d, generator=g), torch.randint(0, classes, (n,), generator=g)) for _ in range(steps)]


@pytest.mark.parametrize(
    "ours, pml",
    [
        (lambda: ContrastiveLoss(), lambda: pml_losses.ContrastiveLoss()),
        (lambda: MultiSimilarityLoss(), lambda: pml_losses.MultiSimilarityLoss()),
        (lambda: TripletMarginLoss(0.2), lambda: pml_losses.TripletMarginLoss(0.2)),
    ],
)
def test_matches_pml_through_wrap_around(ours, pml):
    a = CrossBatchMemory(ours(), 6, memory_size=20)
    b = pml_losses.CrossBatchMemory(pml(), 6, memory_size=20)
    for x, y in stream(6):  # 48 rows through a 20-slot memory
        torch.testing.assert_close(a(x, y), b(x, y), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a.embedding_memory, b.embedding_memory)
    assert int(a.queue_idx) == b.queue_idx and a.has_been_filled


@pytest.mark.parametrize("name", ["contrastive", "triplet_margin", "margin", "multi_similarity", "lifted_structure", "generalized_lifted_structure", "binomial_deviance"])
def test_equals_loss_against_manually_concatenated_reference_set(name):
    memory = CrossBatchMemory(LOSSES.create(name), 6, memory_size=30)
    seen_x, seen_y = [], []
    for x, y in stream(3, seed=1):
        x = x.requires_grad_(True)
        got = memory(x, y)
        seen_x.append(x.detach())
        seen_y.append(y)
        ref, ref_y = torch.cat(seen_x), torch.cat(seen_y)
        pos = (y[:, None] == ref_y[None, :])
        own = torch.zeros_like(pos)
        own[torch.arange(len(y)), torch.arange(len(y)) + len(ref) - len(y)] = True
        pairs = PairSelection(pos & ~own, ~pos & ~own)
        x2 = x.detach().clone().requires_grad_(True)
        expected = LOSSES.create(name)(x2, y, pairs=pairs, ref_emb=ref, ref_labels=ref_y)
        torch.testing.assert_close(got, expected)
        got.backward()
        expected.backward()
        torch.testing.assert_close(x.grad, x2.grad)


def test_state_dict_round_trip_resumes_exactly():
    data = stream(7, seed=2)
    first = CrossBatchMemory(ContrastiveLoss(), 6, memory_size=20)
    for x, y in data[:4]:
        first(x, y)
    state = {k: v.clone() for k, v in first.state_dict().items()}
    assert set(state) == {"embedding_memory", "label_memory", "queue_idx", "num_filled", "num_steps"}
    resumed = CrossBatchMemory(ContrastiveLoss(), 6, memory_size=20)
    resumed.load_state_dict(state)
    for x, y in data[4:]:
        assert torch.equal(first(x, y), resumed(x, y))
    for key, value in first.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[key])


def test_warmup_fills_memory_but_uses_the_batch_only():
    memory = CrossBatchMemory(ContrastiveLoss(), 6, memory_size=40, warmup_steps=2)
    data = stream(3, seed=3)
    for x, y in data[:2]:
        assert torch.equal(memory(x, y), ContrastiveLoss()(x, y))
    assert int(memory.num_filled) == 16 and int(memory.num_steps) == 2
    x, y = data[2]
    assert not torch.equal(memory(x, y), ContrastiveLoss()(x, y))
    assert int(memory.num_filled) == 24


class PairMiner(torch.nn.Module):
    def forward(self, embeddings, labels, ref_emb, ref_labels):
        pos = labels[:, None] == ref_labels[None, :]
        return PairSelection(pos, ~pos)


class TripletMiner(torch.nn.Module):
    def forward(self, embeddings, labels, ref_emb, ref_labels):
        pos = labels[:, None] == ref_labels[None, :]
        a, p = pos.nonzero(as_tuple=True)
        n = (~pos).to(torch.int8).argmax(1)[a]
        keep = (~pos).any(1)[a]
        return TripletSelection(a[keep], p[keep], n[keep])


def test_miners_are_used_and_self_pairs_removed():
    x, y = stream(1, seed=4)[0]
    with_pair_miner = CrossBatchMemory(ContrastiveLoss(), 6, memory_size=16, miner=PairMiner())
    without = CrossBatchMemory(ContrastiveLoss(), 6, memory_size=16)
    torch.testing.assert_close(with_pair_miner(x, y), without(x, y))
    triplets = CrossBatchMemory(TripletMarginLoss(0.3, reduction="sum"), 6, memory_size=16, miner=TripletMiner())
    got = triplets(x, y)
    sel = TripletMiner()(x, y, x, y)
    keep = (sel.anchor != sel.positive) & (sel.anchor != sel.negative)
    expected = TripletMarginLoss(0.3, reduction="sum")(x, y, pairs=TripletSelection(sel.anchor[keep], sel.positive[keep], sel.negative[keep]), ref_emb=x, ref_labels=y)
    torch.testing.assert_close(got, expected)


def test_enqueue_mask_splits_queue_and_anchors():
    x, y = stream(1, seed=5)[0]
    mask = torch.arange(8) >= 4
    memory = CrossBatchMemory(ContrastiveLoss(), 6, memory_size=16)
    got = memory(x, y, enqueue_mask=mask)
    assert int(memory.num_filled) == 4
    torch.testing.assert_close(got, ContrastiveLoss()(x[:4], y[:4], ref_emb=x[4:], ref_labels=y[4:]))


def test_errors_and_registry():
    assert MEMORIES.get("cross_batch_memory") is CrossBatchMemory
    with pytest.raises(InvalidParameterError, match="'memory_size' parameter of CrossBatchMemory"):
        CrossBatchMemory(ContrastiveLoss(), 6, memory_size=0)
    with pytest.raises(InvalidParameterError, match="cannot wrap NPairsLoss"):
        CrossBatchMemory(NPairsLoss(), 6)
    memory = CrossBatchMemory(ContrastiveLoss(), 6, memory_size=4)
    with pytest.raises(DataError, match="enqueues 8 rows but memory_size is 4"):
        memory(*stream(1)[0])
    with pytest.raises(DataError, match="embeddings has 5 columns but the memory's embedding_size is 6"):
        memory(torch.randn(2, 5), torch.zeros(2, dtype=torch.long))


def test_class_ids_beyond_int32_give_the_same_loss():
    small = CrossBatchMemory(ContrastiveLoss(), 6, memory_size=20)
    large = CrossBatchMemory(ContrastiveLoss(), 6, memory_size=20)
    for x, y in stream(4, seed=5):
        torch.testing.assert_close(large(x, y + 2**40), small(x, y))


def test_large_memory_gradient_matches_the_dense_reference(monkeypatch):
    """A memory past the column-sparse threshold gives the gradient of the full pair set."""
    import dmlkit.distances._closed_form as closed_form

    g = torch.Generator().manual_seed(6)
    memory = CrossBatchMemory(ContrastiveLoss(), 64, memory_size=5000)
    memory.embedding_memory.copy_(torch.randn(5000, 64, generator=g))
    memory.label_memory.copy_(torch.randint(0, 300, (5000,), generator=g))
    memory.num_filled.fill_(5000)
    x, y = torch.randn(6, 64, generator=g), torch.randint(0, 300, (6,), generator=g)
    a = x.clone().requires_grad_(True)
    memory(a, y).backward()
    mem_x, mem_y = memory.memory()
    own = torch.zeros(6, 5000, dtype=torch.bool)
    own[torch.arange(6), torch.arange(6)] = True  # the batch went to slots 0..5
    pos = (y[:, None] == mem_y[None, :]) & ~own
    b = x.clone().requires_grad_(True)
    monkeypatch.setattr(closed_form, "SPARSE_MIN_REFERENCES", 10**9)  # the dense backward
    ContrastiveLoss()(b, y, pairs=PairSelection(pos, ~pos & ~own), ref_emb=mem_x.clone(), ref_labels=mem_y).backward()
    torch.testing.assert_close(a.grad, b.grad)


def test_large_memory_masks_are_reference_major_with_the_same_pairs():
    """Past the reference-major threshold the label masks share the distance matrix's layout."""
    from dmlkit.distances._closed_form import REFERENCE_MAJOR_MIN_REFERENCES
    from dmlkit.memory.cross_batch import _same_label

    g = torch.Generator().manual_seed(9)
    mem_y = torch.randint(0, 40, (REFERENCE_MAJOR_MIN_REFERENCES + 5,), generator=g)
    y = torch.randint(0, 40, (7,), generator=g)
    mask = _same_label(y, mem_y, torch.float32)
    assert mask.stride() == (1, 7)
    torch.testing.assert_close(mask, (y[:, None] == mem_y[None, :]).float())
    torch.testing.assert_close(_same_label(y + 2**40, mem_y + 2**40, torch.float64), (y[:, None] == mem_y[None, :]).double())
