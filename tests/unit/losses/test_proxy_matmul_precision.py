"""``matmul_precision="medium"``: bf16 proxy-by-batch products, fp32 kernel, fp32 rows for the batch's classes."""

import pytest
import torch

from dmlkit.exceptions import InvalidParameterError
from dmlkit.losses.base import LOSSES
from dmlkit.losses.proxy import ProxyAnchorLoss, ProxyNCALoss, ProxyNCAPlusPlusLoss, SoftTripleLoss
from dmlkit.losses.proxy._fused import fused_proxy_loss

C, D, B = 600, 32, 48

FUSED = [
    (ProxyAnchorLoss, {}),
    (ProxyAnchorLoss, {"proxies_per_class": 3}),
    (ProxyAnchorLoss, {"proxies_per_class": 3, "assignment": "nearest"}),
    (ProxyNCALoss, {}),
    (ProxyNCALoss, {"proxies_per_class": 3}),
    (ProxyNCALoss, {"proxies_per_class": 3, "assignment": "nearest", "exclude_positive": True}),
    (ProxyNCALoss, {"proxies_per_class": 0.5}),
    (ProxyNCAPlusPlusLoss, {}),
    (SoftTripleLoss, {"centers_per_class": 3}),
]


def pair(cls, kwargs):
    exact = cls(C, D, **kwargs)
    fast = cls(C, D, matmul_precision="medium", **kwargs)
    fast.load_state_dict(exact.state_dict())
    return exact, fast


def batch(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, D, generator=g), torch.randint(0, 40, (B,), generator=g)


def value_and_grads(loss, x, y):
    x = x.clone().requires_grad_(True)
    value = loss(x, y)
    grad_x, grad_p = torch.autograd.grad(value, (x, loss.proxies))
    return value, grad_x, grad_p


def relative(a, b):
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("cls,kwargs", FUSED, ids=lambda v: v.__name__ if isinstance(v, type) else str(v))
def test_medium_matches_highest_within_bf16_error(cls, kwargs):
    exact, fast = pair(cls, kwargs)
    x, y = batch(0)
    v0, gx0, gp0 = value_and_grads(exact, x, y)
    v1, gx1, gp1 = value_and_grads(fast, x, y)
    assert v1.dtype == torch.float32
    assert abs(v1.item() - v0.item()) <= 1e-3 * abs(v0.item()) + 1e-4
    assert relative(gx1, gx0) < 2e-2
    assert relative(gp1, gp0) < 2e-2


def test_medium_rounds_the_negatives_only():
    """The bf16 mode is really in use (the result differs from fp32) but the batch's classes are exact."""
    exact, fast = pair(ProxyAnchorLoss, {"proxies_per_class": 2})
    x, y = batch(1)
    v0, _, gp0 = value_and_grads(exact, x, y)
    v1, _, gp1 = value_and_grads(fast, x, y)
    assert v1.item() != v0.item()
    present = exact.bank.present_columns(y)
    absent = torch.ones(exact.proxies.shape[0], dtype=torch.bool)
    absent[present] = False
    # the gradient of a present proxy is mostly its fp32 positive part; an absent proxy's is all bf16
    assert relative(gp1[present], gp0[present]) < 2e-3
    assert relative(gp1[absent], gp0[absent]) > relative(gp1[present], gp0[present])
    assert relative(gp1[absent], gp0[absent]) < 2e-2


@pytest.mark.parametrize("cls", [ProxyAnchorLoss, ProxyNCALoss, SoftTripleLoss])
def test_medium_leaves_float64_exact(cls):
    exact = cls(50, 8).double()
    fast = cls(50, 8, matmul_precision="medium").double()
    fast.load_state_dict(exact.state_dict())
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(10, 8, generator=g, dtype=torch.float64), torch.randint(0, 50, (10,), generator=g)
    for a, b in zip(value_and_grads(exact, x, y), value_and_grads(fast, x, y)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("cls", [ProxyAnchorLoss, ProxyNCALoss, SoftTripleLoss])
def test_medium_reuses_scratch_buffers_safely(cls):
    """Two calls before one backward, then a smaller batch: the same as separate calls."""
    g = torch.Generator().manual_seed(3)
    x1, x2 = torch.randn(12, 8, generator=g, requires_grad=True), torch.randn(7, 8, generator=g, requires_grad=True)
    y1, y2 = torch.randint(0, 30, (12,), generator=g), torch.randint(0, 30, (7,), generator=g)
    loss = cls(30, 8, matmul_precision="medium")
    together = torch.autograd.grad(loss(x1, y1) + loss(x2, y2), (x1, x2, loss.proxies))
    first = torch.autograd.grad(loss(x1, y1), (x1, loss.proxies))
    second = torch.autograd.grad(loss(x2, y2), (x2, loss.proxies))
    torch.testing.assert_close(together[0], first[0])
    torch.testing.assert_close(together[1], second[0])
    torch.testing.assert_close(together[2], first[1] + second[1])


def test_medium_without_exact_rows_is_still_close():
    """The function-level entry point: every row in bf16 when no exact rows are named."""
    g = torch.Generator().manual_seed(4)
    xn = torch.nn.functional.normalize(torch.randn(16, 8, generator=g), dim=1)
    proxies = torch.randn(200, 8, generator=g)

    def kernel(z, need_grad):
        lse = torch.logsumexp(z, dim=0)
        grad = torch.softmax(z, dim=0).div_(z.shape[1]) if need_grad else None
        return lse.mean(), grad, None

    a = fused_proxy_loss(xn, proxies, kernel, 8.0)
    b = fused_proxy_loss(xn, proxies, kernel, 8.0, matmul_precision="medium")
    assert a.item() != b.item() and abs(a.item() - b.item()) < 1e-2 * abs(a.item())


def test_invalid_matmul_precision_is_rejected_with_the_valid_names():
    with pytest.raises(InvalidParameterError, match="ProxyAnchorLoss.*matmul_precision|matmul_precision.*ProxyAnchorLoss"):
        ProxyAnchorLoss(5, 4, matmul_precision="low")
    with pytest.raises(ValueError, match="'highest', 'medium'"):
        fused_proxy_loss(torch.randn(2, 4), torch.randn(3, 4), lambda z, g: (z.sum(), None, None), 1.0,
                         matmul_precision="bf16")


def test_registry_and_repr_carry_matmul_precision():
    loss = LOSSES.create("proxy_nca", num_classes=5, embedding_size=4, matmul_precision="medium")
    assert loss.matmul_precision == "medium" and "matmul_precision='medium'" in repr(loss)
    assert ProxyAnchorLoss(5, 4).matmul_precision == "highest"

