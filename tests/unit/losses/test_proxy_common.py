"""Contract tests over every proxy loss: registry, layout, K>1, dtype, properties."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dmlkit.losses.base import LOSSES, MetricLoss
from dmlkit.losses.proxy import (
    ProxyAnchorLoss,
    ProxyNCALoss,
    ProxyNCAPlusPlusLoss,
    ProxyPairLoss,
    ProxyTripletLoss,
    SoftTripleLoss,
)


class MeanCosinePair(torch.nn.Module):
    """A tiny pair loss: mean (1 - cos) over positive pairs plus mean relu(cos) over negatives."""

    def forward(self, embeddings, labels, ref_emb=None, ref_labels=None):
        s = torch.nn.functional.normalize(embeddings, dim=1) @ torch.nn.functional.normalize(ref_emb, dim=1).T
        pos = labels[:, None] == ref_labels[None, :]
        return (1 - s)[pos].mean() + torch.relu(s)[~pos].mean()


def make(name, C, D, K):
    if name == "soft_triple":
        return SoftTripleLoss(C, D, centers_per_class=K)
    if name == "proxy_pair":
        return ProxyPairLoss(MeanCosinePair(), C, D, proxies_per_class=K)
    return LOSSES.create(name, num_classes=C, embedding_size=D, proxies_per_class=K)


NAMES = ["proxy_anchor", "proxy_nca", "proxy_nca_plus_plus", "proxy_triplet", "soft_triple", "proxy_pair"]


def test_every_proxy_loss_is_registered():
    classes = {ProxyAnchorLoss, ProxyNCALoss, ProxyNCAPlusPlusLoss, ProxyTripletLoss, SoftTripleLoss, ProxyPairLoss}
    assert classes <= {LOSSES.get(n) for n in LOSSES.names()}
    import dmlkit.losses.proxy as package

    assert set(package.__all__) >= {c.__name__ for c in classes}


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("K", [1, 3])
def test_layout_backward_and_half_inputs(name, K):
    loss = make(name, 4, 5, K)
    assert isinstance(loss, MetricLoss)
    assert isinstance(loss.proxies, torch.nn.Parameter) and loss.proxies.shape == (4 * K, 5)
    assert loss.proxy_labels.tolist() == [c for c in range(4) for _ in range(K)]
    x = torch.randn(8, 5, generator=torch.Generator().manual_seed(K), requires_grad=True)  # seeded: hinge losses jump
    y = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    value = loss(x, y)
    value.backward()
    assert value.dim() == 0 and value.dtype == torch.float32 and torch.isfinite(value)
    assert torch.isfinite(loss.proxies.grad).all() and loss.proxies.grad.abs().sum() > 0
    half = loss(x.detach().half(), y)  # PML's contract: the loss and the proxies take the batch's dtype
    assert half.dtype == torch.float16 and half.item() == pytest.approx(value.item(), rel=1e-2, abs=1e-3)
    assert loss.proxies.dtype == torch.float16
    bf16 = loss(x.detach().bfloat16(), y)
    assert bf16.dtype == torch.bfloat16 and torch.isfinite(bf16) and loss.proxies.dtype == torch.bfloat16
    assert loss(x.detach(), y).dtype == torch.float32 and loss.proxies.dtype == torch.float32


@pytest.mark.parametrize("name", NAMES)
def test_init_proxies_from_then_state_dict_roundtrip(name):
    loss = make(name, 3, 4, 2)
    emb = torch.randn(9, 4)
    labels = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2])
    loss.init_proxies_from(emb, labels, seed=1)
    for p in range(6):
        assert any(torch.equal(loss.proxies[p], e) for e in emb[labels == p // 2])
    clone = make(name, 3, 4, 2)
    clone.load_state_dict(loss.state_dict())
    assert torch.equal(clone.proxies, loss.proxies)
    assert clone(emb, labels).item() == pytest.approx(loss(emb, labels).item())


@settings(max_examples=15, deadline=None)
@given(
    name=st.sampled_from(NAMES), K=st.integers(1, 2), B=st.integers(1, 12), seed=st.integers(0, 1000),
    scale=st.floats(0.01, 100.0),
)
def test_finite_nonnegative_and_invariant_to_batch_order_and_relabelling(name, K, B, seed, scale):
    C, D = 4, 3
    g = torch.Generator().manual_seed(seed)
    x = scale * torch.randn(B, D, generator=g, dtype=torch.float64)
    y = torch.randint(0, C, (B,), generator=g)
    loss = make(name, C, D, K).double()
    value = loss(x, y)
    assert torch.isfinite(value) and value.item() >= -1e-12
    order = torch.randperm(B, generator=g)
    assert loss(x[order], y[order]).item() == pytest.approx(value.item(), rel=1e-9, abs=1e-12)
    # relabel classes with a permutation and move the proxies along: same loss
    perm = torch.randperm(C, generator=g)
    relabelled = make(name, C, D, K).double()
    with torch.no_grad():
        relabelled.bank.per_class()[perm] = loss.bank.per_class()
    assert relabelled(x, perm[y]).item() == pytest.approx(value.item(), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("name", ["proxy_anchor", "proxy_nca", "proxy_triplet"])
def test_fractional_proxies(name):
    """Half a proxy per class (Proxy-NCA Sec. 6.5): every class is pre-assigned one of 5 shared proxies, and the
    loss is the same loss over the 5 proxy groups as classes (labels mapped through the assignment)."""
    loss = LOSSES.create(name, num_classes=10, embedding_size=4, proxies_per_class=0.5).double()
    assert loss.proxies.shape == (5, 4)
    mapping = loss.bank.class_to_proxy
    assert torch.bincount(mapping, minlength=5).tolist() == [2] * 5  # two classes share each proxy
    groups = LOSSES.create(name, num_classes=5, embedding_size=4, proxies_per_class=1).double()
    with torch.no_grad():
        groups.proxies.copy_(loss.proxies)
    g = torch.Generator().manual_seed(3)
    labels = torch.tensor([0, 1, 2, 7, 8, 9, 0, 7])
    x = torch.randn(8, 4, generator=g, dtype=torch.float64, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    value, expected = loss(x, labels), groups(x_ref, mapping[labels])
    (value + expected).backward()
    assert value.item() == pytest.approx(expected.item(), rel=1e-12)
    assert torch.allclose(x.grad, x_ref.grad, rtol=1e-10, atol=1e-12)
    assert torch.allclose(loss.proxies.grad, groups.proxies.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", [n for n in NAMES if n != "proxy_pair"])
def test_unsupported_keyword_arguments_are_rejected(name):
    loss = make(name, 3, 4, 1)
    with pytest.raises(ValueError, match="unsupported keyword argument"):
        loss(torch.randn(2, 4), torch.tensor([0, 1]), ref_emb=torch.randn(2, 4))


@pytest.mark.parametrize("cls", [ProxyAnchorLoss, ProxyNCALoss, SoftTripleLoss])
def test_reused_scratch_buffers_keep_calls_independent(cls):
    """Two calls before one backward (and a changed batch size) give the sum of separate gradients."""
    g = torch.Generator().manual_seed(11)
    x1 = torch.randn(12, 8, generator=g, dtype=torch.float64, requires_grad=True)
    x2 = torch.randn(7, 8, generator=g, dtype=torch.float64, requires_grad=True)
    y1, y2 = torch.randint(0, 5, (12,), generator=g), torch.randint(0, 5, (7,), generator=g)
    loss = cls(5, 8).double()
    together = torch.autograd.grad(loss(x1, y1) + loss(x2, y2), (x1, x2, loss.proxies))
    fresh = cls(5, 8).double()
    fresh.load_state_dict(loss.state_dict())
    first = torch.autograd.grad(fresh(x1, y1), (x1, fresh.proxies))
    second = torch.autograd.grad(fresh(x2, y2), (x2, fresh.proxies))
    torch.testing.assert_close(together[0], first[0])
    torch.testing.assert_close(together[1], second[0])
    torch.testing.assert_close(together[2], first[1] + second[1])
