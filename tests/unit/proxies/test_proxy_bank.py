"""ProxyBank: class-major layout, assignment rules, initialisation from samples."""

import pytest
import torch

from dmlkit.exceptions import DataError, InvalidParameterError
from dmlkit.proxies import ProxyBank, dynamic_triplets, sample_rows_per_class


def test_layout_labels_and_per_class_view():
    bank = ProxyBank(3, 2, proxies_per_class=4)
    assert bank.proxies.shape == (12, 2)
    assert bank.proxy_labels.dtype == torch.int64
    assert bank.proxy_labels.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    view = bank.per_class()
    assert view.shape == (3, 4, 2)
    assert view.data_ptr() == bank.proxies.data_ptr()
    assert torch.equal(view[1, 2], bank.proxies[1 * 4 + 2])


def test_seeded_initialisation_is_reproducible_and_reset():
    a, b = ProxyBank(5, 3, seed=11), ProxyBank(5, 3, seed=11)
    assert torch.equal(a.proxies, b.proxies)
    assert not torch.equal(a.proxies, ProxyBank(5, 3, seed=12).proxies)
    before = a.proxies.detach().clone()
    with torch.no_grad():
        a.proxies.zero_()
    a.reset_parameters()
    assert torch.equal(a.proxies, before)
    uniform = ProxyBank(5, 3, proxy_init="uniform")
    assert uniform.proxies.abs().max() <= 1.0


def test_fractional_mapping_is_balanced_and_saved():
    bank = ProxyBank(10, 4, proxies_per_class=0.3, seed=5)
    assert bank.num_proxies == 3
    counts = torch.bincount(bank.class_to_proxy, minlength=3)
    assert counts.max() - counts.min() <= 1 and counts.sum() == 10
    assert "class_to_proxy" in bank.state_dict()
    restored = ProxyBank(10, 4, proxies_per_class=0.3, seed=99)
    restored.load_state_dict(bank.state_dict())
    assert torch.equal(restored.class_to_proxy, bank.class_to_proxy)


def test_assignment_rules():
    bank = ProxyBank(2, 2, proxies_per_class=2)
    labels = torch.tensor([0, 1])
    sim = torch.tensor([[0.1, 0.9, 0.95, 0.0], [0.5, 0.2, 0.3, 0.4]])
    pos, neg = bank.assign(sim, labels, "static")
    assert pos.tolist() == [[True, True, False, False], [False, False, True, True]]
    assert torch.equal(neg, ~pos)
    pos, neg = bank.assign(sim, labels, "nearest")
    assert pos.tolist() == [[False, True, False, False], [False, False, False, True]]
    assert neg.tolist() == [[False, False, True, True], [True, True, False, False]]
    with pytest.raises(InvalidParameterError, match="dynamic_triplets"):
        bank.assign(sim, labels, "dynamic")
    with pytest.raises(InvalidParameterError):
        bank.assign(sim, labels, "random")


@pytest.mark.parametrize("K", [1, 3, 0.5])
def test_batch_columns_hold_the_present_proxies_once_each_in_a_static_shape(K):
    bank = ProxyBank(20, 2, proxies_per_class=K)
    labels = torch.tensor([17, 2, 17, 17, 0])
    columns, first = bank.batch_columns(labels)
    width = 1 if K < 1 else K
    assert columns.shape == first.shape == (labels.numel() * width,)  # sized by the batch, not by its values
    assert torch.equal(columns[first], bank.present_columns(labels))
    assert torch.equal(columns, columns.sort().values)
    sim = torch.randn(5, columns.numel())
    pos, neg = bank.assign(sim, labels, "static", columns=columns, first=first)
    assert not (pos | neg)[:, ~first].any()  # repeats are neither positive nor negative
    unique_pos, unique_neg = bank.assign(sim[:, first], labels, "static", columns=columns[first])
    assert torch.equal(pos[:, first], unique_pos) and torch.equal(neg[:, first], unique_neg)
    assert bank.batch_columns(torch.arange(20)) == (None, None)  # as many candidates as proxies


def test_dynamic_triplets_use_the_positive_and_negative_samples_nearest_proxies():
    """Proxy-NCA Sec. 4.1: (x, p(y), p(Z)) with p = nearest proxy of that sample (Eq. (5))."""
    sim = torch.tensor([[0.9, 0.1, 0.0],   # sample 0 (label 0): nearest proxy 0
                        [0.0, 0.2, 0.8],   # sample 1 (label 0): nearest proxy 2
                        [0.1, 0.7, 0.3],   # sample 2 (label 1): nearest proxy 1
                        [0.0, 0.6, 0.5]])  # sample 3 (label 2): nearest proxy 1
    triplets = dynamic_triplets(sim, torch.tensor([0, 0, 1, 2]))
    # the only same-label pairs are (0, 1) and (1, 0): positives' proxies 2 and 0
    assert triplets.anchors.tolist() == [0, 1] and triplets.positive_proxies.tolist() == [2, 0]
    # negatives of samples 0 and 1 are samples 2 and 3 (both nearest to proxy 1); samples 2 and 3
    # have the other three as negatives (proxies 0, 2, 1)
    assert triplets.negative_proxies.tolist() == [[False, True, False], [False, True, False],
                                                  [True, True, True], [True, True, True]]
    none = dynamic_triplets(sim, torch.tensor([0, 1, 2, 3]))
    assert none.anchors.numel() == 0


def test_init_from_samples_and_set_proxies():
    bank = ProxyBank(3, 2, proxies_per_class=2, seed=0)
    emb = torch.arange(10, dtype=torch.float32).view(5, 2)
    labels = torch.tensor([0, 0, 2, 0, 2])
    before = bank.per_class()[1].detach().clone()
    present = bank.init_from(emb, labels)
    assert present.tolist() == [True, False, True]
    assert torch.equal(bank.per_class()[1], before)  # absent class keeps its proxies
    for c in (0, 2):
        rows = {tuple(r) for r in emb[labels == c].tolist()}
        chosen = [tuple(r) for r in bank.per_class()[c].tolist()]
        assert set(chosen) <= rows and len(set(chosen)) == 2
    centers = torch.randn(3, 2, 2)
    bank.set_proxies(centers)
    assert torch.equal(bank.per_class(), centers)
    bank.set_proxies(torch.zeros(1, 2, 2), classes=torch.tensor([1]))
    assert torch.equal(bank.per_class()[1], torch.zeros(2, 2))
    with pytest.raises(DataError, match="centers has shape"):
        bank.set_proxies(torch.zeros(2, 2, 2))


def test_init_from_fractional_uses_class_means():
    bank = ProxyBank(4, 1, proxies_per_class=0.5, seed=1)
    emb = torch.tensor([[1.0], [3.0], [5.0], [7.0]])
    bank.init_from(emb, torch.arange(4))
    for p in range(2):
        classes = (bank.class_to_proxy == p).nonzero().flatten()
        assert bank.proxies[p, 0].item() == pytest.approx(emb[classes, 0].mean().item())


def test_sample_rows_reuses_rows_of_small_classes():
    g = torch.Generator().manual_seed(0)
    rows, present = sample_rows_per_class(torch.tensor([1, 1, 1, 0]), 3, 2, g)
    assert present.tolist() == [True, True, False]
    assert rows[0].tolist() == [3, 3]
    assert set(rows[1].tolist()) <= {0, 1, 2} and rows[1, 0] != rows[1, 1]


def test_validation_messages():
    with pytest.raises(InvalidParameterError, match="The 'num_classes' parameter of ProxyBank must be an int >= 1. Got 0 instead."):
        ProxyBank(0, 3)
    with pytest.raises(InvalidParameterError, match="proxy_init"):
        ProxyBank(2, 3, proxy_init="xavier")
    with pytest.raises(InvalidParameterError, match="proxies_per_class"):
        ProxyBank(2, 3, proxies_per_class=0)
    bank = ProxyBank(2, 3)
    with pytest.raises(DataError, match="embeddings has 4 columns but the proxies have 3"):
        bank.init_from(torch.randn(2, 4), torch.tensor([0, 1]))
    with pytest.raises(DataError, match="labels must lie in"):
        bank.candidate_mask(torch.tensor([-1]))
