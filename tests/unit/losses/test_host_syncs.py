"""Host synchronisations of the losses' hot paths.

Counted on the CPU with ``_host_syncs.count_host_syncs`` while ``dmlkit.core.validation.reads_on_host``
answers False, so every branch an accelerator takes is the one measured. A forward + backward of the
losses below makes no synchronisation but the documented ones:

* TripletMarginLoss: one ``nonzero`` listing the positive pairs (the triplets are enumerated per pair
  in chunks; the list's length is the data's).

Under ``DMLKIT_TEST_DEVICE=cuda`` (``scripts/gpu_check.sh``) the same calls run on that device.
"""

from collections import Counter

import pytest
import torch

import dmlkit.core.validation as validation
import dmlkit.losses as L
import dmlkit.mining as M
from dmlkit.exceptions import DataError

from ._host_syncs import count_host_syncs

B, D, C = 64, 16, 40
MANY = 200

#: ``name: (factory, the syncs a forward + backward may make)``.
HOT_PATH_LOSSES = {
    "NormalizedSoftmaxLoss": (lambda: L.NormalizedSoftmaxLoss(C, D), {}),
    "SubCenterArcFaceLoss": (lambda: L.SubCenterArcFaceLoss(num_classes=C, embedding_size=D), {}),
    "ArcFaceLoss": (lambda: L.ArcFaceLoss(C, D), {}),
    "ArcFaceLoss (chunks of 16 classes)": (lambda: L.ArcFaceLoss(C, D, chunk_size=16), {}),
    "CosFaceLoss": (lambda: L.CosFaceLoss(C, D), {}),
    "SoftTripleLoss": (lambda: L.SoftTripleLoss(C, D), {}),
    "ProxyNCALoss": (lambda: L.ProxyNCALoss(C, D), {}),
    "ProxyAnchorLoss": (lambda: L.ProxyAnchorLoss(C, D), {}),
    # more proxies than the batch has candidates: the static block of the batch's proxies, repeats masked
    "ProxyAnchorLoss (200 classes)": (lambda: L.ProxyAnchorLoss(MANY, D), {}),
    "ProxyAnchorLoss (K=2, nearest)": (lambda: L.ProxyAnchorLoss(MANY, D, proxies_per_class=2, assignment="nearest"), {}),
    "ProxyAnchorLoss (fractional)": (lambda: L.ProxyAnchorLoss(MANY, D, proxies_per_class=0.5), {}),
    "ProxyAnchorLoss (medium)": (lambda: L.ProxyAnchorLoss(MANY, D, matmul_precision="medium"), {}),
    "ProxyNCALoss (medium)": (lambda: L.ProxyNCALoss(MANY, D, matmul_precision="medium"), {}),
    "SoftTripleLoss (medium)": (lambda: L.SoftTripleLoss(MANY, D, matmul_precision="medium"), {}),
    "TripletMarginLoss": (lambda: L.TripletMarginLoss(), {"aten.nonzero.default": 1}),
    # the reducer's count and "anything to contrast?" stay on the device
    "CircleLoss": (lambda: L.CircleLoss(), {}),
    "NTXentLoss": (lambda: L.NTXentLoss(), {}),
    "SupConLoss": (lambda: L.SupConLoss(), {}),
    "LiftedStructureLoss": (lambda: L.LiftedStructureLoss(), {}),
    "GeneralizedLiftedStructureLoss": (lambda: L.GeneralizedLiftedStructureLoss(), {}),
    "ContrastiveLoss": (lambda: L.ContrastiveLoss(), {}),
    "MultiSimilarityLoss": (lambda: L.MultiSimilarityLoss(), {}),
}


@pytest.fixture
def as_on_an_accelerator(monkeypatch):
    """Every tensor is treated as device memory: checks of data take their no-sync branch."""
    monkeypatch.setattr(validation, "reads_on_host", lambda tensor: False)


@pytest.fixture
def batch(test_device):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, D, generator=g).to(test_device)
    y = (torch.arange(B) // 4 % C).to(test_device)  # 4 samples of each of 16 classes
    return x, y


def test_the_counter_sees_each_kind_of_synchronisation():
    x = torch.randn(6)
    with count_host_syncs() as counts:
        x.sum().item()
        bool((x > 0).any())
        x[x > 0]
        (x > 0).nonzero()
        torch.unique(x)
        x.tolist()
        x.cpu()
    assert counts == Counter({"aten._local_scalar_dense.default": 2, "aten.index.Tensor (boolean mask)": 1,
                              "aten.nonzero.default": 1, "aten._unique2.default": 1, "Tensor.tolist": 1,
                              "Tensor.cpu": 1})
    with count_host_syncs() as counts:
        x[torch.tensor([0, 2])].exp().sum()
    assert not counts
    assert torch.Tensor.tolist is not None and x.tolist() == x.tolist()  # methods restored


@pytest.mark.parametrize("name", list(HOT_PATH_LOSSES))
def test_forward_and_backward_make_only_the_documented_synchronisations(name, batch, test_device, as_on_an_accelerator):
    factory, expected = HOT_PATH_LOSSES[name]
    loss = factory().to(test_device)
    x, y = batch
    loss(x.requires_grad_(True), y).backward()  # first call: lazy buffers, warm caches
    x = x.detach().requires_grad_(True)
    with count_host_syncs() as counts:
        value = loss(x, y)
        value.backward()
    assert dict(counts) == expected
    assert torch.isfinite(value) and x.grad is not None and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("labels", [[0, 5, C], [-1, 2, 3]])
def test_out_of_range_labels_still_raise_on_both_branches(labels, monkeypatch):
    loss = L.ArcFaceLoss(C, D)
    x, y = torch.randn(3, D), torch.tensor(labels)
    with pytest.raises(DataError, match=rf"labels must lie in \[0, {C}\) for num_classes={C}; got labels in"):
        loss(x, y)  # host memory: read and reported with the range found
    monkeypatch.setattr(validation, "reads_on_host", lambda tensor: False)
    with pytest.raises(RuntimeError, match=rf"labels must lie in \[0, {C}\) for num_classes={C}"):
        loss(x, y)  # the queued assertion (on a GPU it fires at the next synchronisation)


#: Miners list index tuples sized by the data, so each makes at least one read; ``name: (factory, syncs)``.
MINERS = {
    "BatchHardMiner": (lambda: M.BatchHardMiner(), {"aten.nonzero.default": 1}),
    # the positive pairs, then the kept (pair, negative) entries: two lists, memory O(pairs x B), not O(B^3)
    "TripletMarginMiner": (lambda: M.TripletMarginMiner(type_of_triplets="semihard"), {"aten.nonzero.default": 2}),
    "BatchEasyHardMiner": (lambda: M.BatchEasyHardMiner(), {"aten.nonzero.default": 1}),
}


@pytest.mark.parametrize("name", list(MINERS))
def test_miners_make_one_read_per_index_list(name, batch, test_device, as_on_an_accelerator):
    factory, expected = MINERS[name]
    miner = factory()
    x, y = batch
    reference = miner(x, y).to_indices_tuple()
    with count_host_syncs() as counts:
        mined = miner(x, y)
    assert dict(counts) == expected
    mined = mined.to_indices_tuple()
    assert all(torch.equal(a, b) for a, b in zip(mined, reference)) and mined[0].numel() > 0
