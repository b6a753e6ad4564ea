"""ProxyAnchorLoss against a float64 transcription of Proxy-Anchor Eq. (4)/(6) and against PML."""

import math

import pytest
import torch

from dmlkit.exceptions import InvalidParameterError
from dmlkit.losses.proxy import ProxyAnchorLoss


def reference_loss(x, y, proxies, proxy_labels, alpha, delta, nearest=False):
    """Eq. (4) with explicit loops; every proxy is an anchor; float64."""
    x = x.double()
    proxies = proxies.double()
    cos = torch.nn.functional.normalize(x, dim=1) @ torch.nn.functional.normalize(proxies, dim=1).T
    B, P = cos.shape
    pos_sets = [[] for _ in range(P)]
    neg_sets = [[] for _ in range(P)]
    for i in range(B):
        own = [p for p in range(P) if proxy_labels[p] == y[i]]
        best = max(own, key=lambda p: cos[i, p].item())
        for p in range(P):
            if proxy_labels[p] == y[i]:
                if not nearest or p == best:
                    pos_sets[p].append(i)
            else:
                neg_sets[p].append(i)
    with_pos = [p for p in range(P) if pos_sets[p]]
    pos = sum(math.log(1 + sum(math.exp(-alpha * (cos[i, p] - delta)) for i in pos_sets[p])) for p in with_pos)
    neg = sum(math.log(1 + sum(math.exp(alpha * (cos[i, p] + delta)) for i in neg_sets[p])) for p in range(P))
    return pos / len(with_pos) + neg / P


def batch(seed, B=12, C=5, D=6):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, D, generator=g, dtype=torch.float64), torch.randint(0, C, (B,), generator=g)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("K,assignment,C", [(1, "static", 5), (3, "static", 5), (3, "nearest", 5), (2, "nearest", 30)])
def test_matches_equation_4(seed, K, assignment, C):
    """C=30 > B: most proxies take the fused path for classes absent from the batch."""
    x, y = batch(seed, C=C)
    loss = ProxyAnchorLoss(C, 6, margin=0.1, alpha=32, proxies_per_class=K, assignment=assignment, seed=seed).double()
    got = loss(x, y).item()
    ref = reference_loss(x, y, loss.proxies.detach(), loss.proxy_labels.tolist(), 32.0, 0.1, assignment == "nearest")
    assert got == pytest.approx(ref, rel=1e-10)


@pytest.mark.parametrize("C,K,B", [(4, 1, 10), (20, 1, 6), (9, 2, 5)])
def test_gradient_matches_equation_6(C, K, B):
    """Gradients w.r.t. normalised embeddings/proxies equal (Eq. (6) dl/ds) chained through s = xn pn^T.

    C=20 with B=6 exercises the fused path for proxies of classes absent from the batch.
    """
    x, y = batch(3, B=B, C=C)
    loss = ProxyAnchorLoss(C, 6, margin=0.1, alpha=16, proxies_per_class=K).double()
    alpha, delta = 16.0, 0.1
    xn = torch.nn.functional.normalize(x, dim=1).requires_grad_(True)
    pn = torch.nn.functional.normalize(loss.proxies.detach(), dim=1).requires_grad_(True)
    value = fused(loss, xn, pn, y, "static")  # unit-norm proxies: d pn/d p is the identity on the tangent
    grad_xn, grad_pn = torch.autograd.grad(value, (xn, pn))
    cos = xn.detach() @ pn.detach().T
    pos = y[:, None] == loss.proxy_labels[None, :]
    num_pos_proxies = pos.any(0).sum().item()
    h_pos = torch.exp(-alpha * (cos - delta)) * pos
    h_neg = torch.exp(alpha * (cos + delta)) * ~pos
    eq6 = torch.where(
        pos,
        -alpha * h_pos / (1 + h_pos.sum(0, keepdim=True)) / num_pos_proxies,
        alpha * h_neg / (1 + h_neg.sum(0, keepdim=True)) / (C * K),
    )
    torch.testing.assert_close(grad_xn, eq6 @ pn.detach(), rtol=1e-10, atol=1e-12)
    grad_wrt_unit_proxies = eq6.T @ xn.detach()
    p = pn.detach()  # unit-norm input: the normalisation's Jacobian is the tangent projection
    expected = grad_wrt_unit_proxies - p * (p * grad_wrt_unit_proxies).sum(1, keepdim=True)
    torch.testing.assert_close(grad_pn, expected, rtol=1e-10, atol=1e-12)
    ref = reference_loss(x, y, loss.proxies.detach(), loss.proxy_labels.tolist(), alpha, delta)
    assert value.item() == pytest.approx(ref, rel=1e-10)


def fused(loss, xn, pn, y, assignment, unique=False):
    """The module's fused kernel applied to explicit normalised embeddings and raw proxies.

    ``unique``: the block of present proxies is ``torch.unique``'s (each proxy once, sized by the labels'
    values) instead of the static-shape block the loss uses (repeats masked).
    """
    from functools import partial

    from dmlkit.losses.proxy._fused import fused_proxy_loss
    from dmlkit.losses.proxy.proxy_anchor import proxy_anchor_kernel

    cols, first = (loss.bank.present_columns(y), None) if unique else loss.bank.batch_columns(y)

    def assign(present_z):
        return loss.bank.assign(present_z, y, assignment, columns=cols, first=first)

    kernel = partial(proxy_anchor_kernel, columns=cols, assign=assign, alpha=loss.alpha, margin=loss.margin)
    return fused_proxy_loss(xn, pn, kernel, loss.alpha)


@pytest.mark.parametrize("K,assignment", [(1, "static"), (2, "static"), (2, "nearest")])
def test_gradcheck(K, assignment):
    """gradcheck of the fused function (embeddings and proxies) and of the whole module."""
    from dmlkit.distances import l2_normalize

    x, y = batch(4, B=5, C=6, D=4)
    loss = ProxyAnchorLoss(6, 4, alpha=4, proxies_per_class=K, assignment=assignment).double()
    x.requires_grad_(True)
    proxies = loss.proxies.detach().clone().requires_grad_(True)

    def of_inputs(e, p):
        return fused(loss, l2_normalize(e), p, y, assignment)

    assert torch.autograd.gradcheck(of_inputs, (x, proxies))
    assert torch.autograd.gradcheck(lambda e: loss(e, y), (x,))
    assert loss(x, y).item() == pytest.approx(of_inputs(x, proxies).item(), rel=1e-12)


@pytest.mark.parametrize("K,assignment,C,B", [(1, "static", 40, 16), (2, "static", 40, 16), (3, "nearest", 40, 16),
                                               (1, "static", 12, 8), (1, "static", 3, 16)])
def test_static_block_equals_the_unique_columns(K, assignment, C, B):
    """The static-shape block (sorted candidates, repeats masked; or every proxy when the batch's candidates are
    as many as the proxies) gives the value and gradients of the route over ``torch.unique``'s columns."""
    g = torch.Generator().manual_seed(K * 100 + C)
    x = torch.nn.functional.normalize(torch.randn(B, 6, generator=g, dtype=torch.float64), dim=1)
    y = torch.randint(0, min(C, B // 2), (B,), generator=g)  # classes repeat in the batch
    loss = ProxyAnchorLoss(C, 6, alpha=16, proxies_per_class=K, assignment=assignment).double()
    results = []
    for unique in (True, False):
        xn, pn = x.clone().requires_grad_(True), loss.proxies.detach().clone().requires_grad_(True)
        value = fused(loss, xn, pn, y, assignment, unique=unique)
        results.append((value, *torch.autograd.grad(value, (xn, pn))))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-15)
    assert results[0][2].abs().sum() > 0


@pytest.mark.parametrize("seed", [0, 1])
def test_matches_pml(seed):
    from pytorch_metric_learning.losses import ProxyAnchorLoss as PMLProxyAnchor

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(64, 16, generator=g, requires_grad=True)
    y = torch.randint(0, 30, (64,), generator=g)
    ours = ProxyAnchorLoss(30, 16, margin=0.2, alpha=20, seed=seed)
    theirs = PMLProxyAnchor(30, 16, margin=0.2, alpha=20)
    theirs.proxies.data.copy_(ours.proxies.data)
    a, b = ours(x, y), theirs(x, y)
    assert a.item() == pytest.approx(b.item(), rel=1e-5)
    ga = torch.autograd.grad(a, (x, ours.proxies))
    gb = torch.autograd.grad(b, (x, theirs.proxies))
    torch.testing.assert_close(ga[0], gb[0], rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(ga[1], gb[1], rtol=1e-4, atol=1e-6)


def test_raw_embeddings_give_paper_value_regardless_of_scale():
    x, y = batch(5)
    loss = ProxyAnchorLoss(5, 6).double()
    assert loss(x, y).item() == pytest.approx(loss(7.5 * x, y).item(), rel=1e-12)


def test_extreme_similarities_are_finite():
    """alpha=1e4 makes every exponent huge; log-sum-exp keeps the loss and gradients finite."""
    x, y = batch(6)
    loss = ProxyAnchorLoss(5, 6, alpha=1e4)
    x = x.float().requires_grad_(True)
    value = loss(x, y)
    value.backward()
    assert torch.isfinite(value) and torch.isfinite(x.grad).all() and torch.isfinite(loss.proxies.grad).all()


def test_single_sample_and_single_class():
    loss = ProxyAnchorLoss(3, 4)
    x = torch.randn(1, 4, requires_grad=True)
    value = loss(x, torch.tensor([2]))
    value.backward()
    assert torch.isfinite(value) and torch.isfinite(x.grad).all()
    one_class = ProxyAnchorLoss(1, 4)
    value = one_class(torch.randn(5, 4), torch.zeros(5, dtype=torch.int64))
    assert torch.isfinite(value) and value.item() > 0


def test_proxy_layout_is_class_major():
    loss = ProxyAnchorLoss(4, 3, proxies_per_class=2)
    assert loss.proxies.shape == (8, 3)
    assert isinstance(loss.proxies, torch.nn.Parameter)
    assert loss.proxy_labels.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert "bank.proxies" in loss.state_dict()


def test_parameter_validation_message():
    with pytest.raises(InvalidParameterError, match=r"The 'alpha' parameter of ProxyAnchorLoss must be a float > 0. Got -1 instead."):
        ProxyAnchorLoss(3, 4, alpha=-1)
    with pytest.raises(InvalidParameterError, match=r"The 'margin' parameter of ProxyAnchorLoss must be a float >= 0. Got -1 instead."):
        ProxyAnchorLoss(3, 4, margin=-1)
    with pytest.raises(InvalidParameterError, match="proxies_per_class"):
        ProxyAnchorLoss(3, 4, proxies_per_class=1.5)
    with pytest.raises(ValueError, match="labels must lie in"):
        ProxyAnchorLoss(3, 4)(torch.randn(2, 4), torch.tensor([0, 3]))


@pytest.mark.parametrize("alpha", [32.0, 200.0])
def test_float32_large_alpha_uses_a_safe_shift(alpha):
    """alpha=200 would underflow exp(alpha (s - 1)) in fp32; the column-max shift keeps it exact."""
    x, y = batch(9, B=8, C=50)
    loss = ProxyAnchorLoss(50, 6, alpha=alpha)
    ref = reference_loss(x, y, loss.proxies.detach(), loss.proxy_labels.tolist(), alpha, 0.1)
    assert loss(x.float(), y).item() == pytest.approx(ref, rel=1e-4)


def test_zero_margin_of_figure_6_matches_equation_4():
    """Proxy-Anchor Fig. 6 studies delta = 0; Eq. (4) is defined there."""
    x, y = batch(4)
    loss = ProxyAnchorLoss(5, 6, margin=0.0, alpha=32).double()
    ref = reference_loss(x, y, loss.proxies.detach(), loss.proxy_labels.tolist(), 32.0, 0.0, False)
    assert loss(x, y).item() == pytest.approx(ref, rel=1e-10)
