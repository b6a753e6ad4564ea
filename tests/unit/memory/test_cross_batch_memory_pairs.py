"""Every pair CrossBatchMemory builds is positive or negative, never both: PML 2.9's pair losses assert it.

PML's suite on a card hit that assertion ("Each pair should be either positive or negative") in
``test_cross_batch_memory.py::test_loss`` with only the memory swapped in. The pairs there are the test's own:
it mines pairs among the *batch* (``outer_miner(embeddings, labels)``: indices 0..B-1 of the batch) and passes
them as ``indices_tuple``, which PML's memory (and dmlkit's, as PML's) reads as (batch row, memory slot) and
concatenates to the mined pairs. Memory slot ``j`` holds another image than batch row ``j``, so a given
"positive" can be a mined negative. Whether the test meets such a pair depends on the values (which pairs the
multi-similarity miner keeps), so it showed on the card's rounding; on the CPU it shows with float16 too
(``SWAP=CrossBatchMemory TEST_DTYPES=float16``), and PML's own memory fails the same way (the suite's README
lists the file as failing with PML alone). The memory's own pairs are consistent on any device: checked here with
the memory built on the CPU and the batches on the (emulated) card, through a wrapped-around queue.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from pytorch_metric_learning import losses as pml_losses
from pytorch_metric_learning import miners as pml_miners

from dmlkit.memory import CrossBatchMemory
from dmlkit.mining import MultiSimilarityMiner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from device_emulation import DeviceEmulator  # noqa: E402


def assert_no_pair_both(indices: tuple, labels: torch.Tensor, mem_labels: torch.Tensor) -> None:
    a1, p, a2, n = indices
    positive = {(int(a), int(b)) for a, b in zip(a1, p)}
    negative = {(int(a), int(b)) for a, b in zip(a2, n)}
    assert not positive & negative
    assert all(labels[a] == mem_labels[b] for a, b in positive)
    assert all(labels[a] != mem_labels[b] for a, b in negative)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("miner", [None, "dmlkit", "pml"])
def test_the_memorys_own_pairs_are_never_both_on_a_card(dtype, miner):
    g = torch.Generator().manual_seed(0)
    chosen = {None: None, "dmlkit": MultiSimilarityMiner(0.3), "pml": pml_miners.MultiSimilarityMiner(0.3)}[miner]
    memory = CrossBatchMemory(pml_losses.ContrastiveLoss(), embedding_size=8, memory_size=40, miner=chosen)
    with DeviceEmulator() as emu:
        emu.park(memory)  # built on the CPU; the batches come from the card
        for _ in range(7):  # 7 x 16 rows through 40 slots: the queue wraps twice
            embeddings = torch.randn(16, 8, generator=g).to(dtype)
            labels = torch.randint(0, 5, (16,), generator=g)
            memory(embeddings, labels)
            mem_emb, mem_labels = memory.memory()
            indices = memory.create_indices_tuple(embeddings, labels, mem_emb, mem_labels, None, True)
            if len(indices) == 3:
                indices = (indices[0], indices[1], indices[0], indices[2])
            assert_no_pair_both(indices, labels, mem_labels)


@pytest.mark.parametrize("memory_class", [CrossBatchMemory, pml_losses.CrossBatchMemory])
def test_batch_indices_given_as_memory_slots_make_a_pair_both(memory_class):
    """PML's test's construction: a pair mined in the batch, given as (row, slot), against a memory whose slot holds
    another class. PML's memory and dmlkit's pass it on alike; a PML >= 2.9 pair loss then refuses it."""
    memory = memory_class(pml_losses.MultiSimilarityLoss(), embedding_size=4, memory_size=16)
    first = torch.tensor([0, 1, 2, 3])
    memory(torch.randn(4, 4), first)  # slots 0..3: classes 0, 1, 2, 3
    labels = torch.tensor([0, 0, 1, 1])  # rows 0 and 1 are a positive pair of the batch
    given = (torch.tensor([0]), torch.tensor([1]), torch.tensor([], dtype=torch.long), torch.tensor([], dtype=torch.long))
    with pytest.raises(AssertionError, match="either be positive or negative"):
        memory(torch.randn(4, 4), labels, given)  # slot 1 holds class 1: a mined negative of row 0 (class 0)
