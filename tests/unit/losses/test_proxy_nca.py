"""ProxyNCALoss / ProxyNCAPlusPlusLoss against float64 Proxy-NCA equations and PML."""

import math

import pytest
import torch

from dmlkit.losses.proxy import ProxyNCALoss, ProxyNCAPlusPlusLoss


def batch(seed, B=10, C=5, D=6):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, D, generator=g, dtype=torch.float64), torch.randint(0, C, (B,), generator=g)


def sq_dists(x, proxies):
    xn = torch.nn.functional.normalize(x.double(), dim=1)
    pn = torch.nn.functional.normalize(proxies.double(), dim=1)
    return [[((xn[i] - pn[p]) ** 2).sum().item() for p in range(len(pn))] for i in range(len(xn))]


def reference(x, y, proxies, groups_of_proxy, group_of_sample, scale, exclude_positive, rule="static"):
    """Proxy-NCA Eq. (4) with proxies, loops, float64; mean over the batch."""
    d = sq_dists(x, proxies)
    total = 0.0
    for i in range(len(d)):
        P = range(len(d[i]))
        own = [p for p in P if groups_of_proxy[p] == group_of_sample[i]]
        if rule == "nearest":
            pos, neg = [min(own, key=lambda p: d[i][p])], [p for p in P if p not in own]
        else:
            pos, neg = own, [p for p in P if p not in own]
        num = sum(math.exp(-scale * d[i][p]) for p in pos)
        den = sum(math.exp(-scale * d[i][p]) for p in (neg if exclude_positive else pos + neg))
        total += -math.log(num / den)
    return total / len(d)


@pytest.mark.parametrize("exclude_positive", [False, True])
@pytest.mark.parametrize("K,rule", [(1, "static"), (3, "static"), (3, "nearest")])
def test_matches_equation_4(exclude_positive, K, rule):
    x, y = batch(0)
    loss = ProxyNCALoss(5, 6, softmax_scale=3, proxies_per_class=K, assignment=rule,
                        exclude_positive=exclude_positive).double()
    ref = reference(x, y, loss.proxies.detach(), loss.proxy_labels.tolist(), y.tolist(), 3.0, exclude_positive, rule)
    assert loss(x, y).item() == pytest.approx(ref, rel=1e-10)


def test_fractional_assignment_matches_reference_and_is_seeded():
    x, y = batch(1, C=8)
    loss = ProxyNCALoss(8, 6, proxies_per_class=0.25, exclude_positive=True, seed=3).double()
    assert loss.proxies.shape == (2, 6)
    mapping = loss.bank.class_to_proxy
    assert sorted(torch.bincount(mapping).tolist()) == [4, 4]
    again = ProxyNCALoss(8, 6, proxies_per_class=0.25, seed=3)
    assert torch.equal(again.bank.class_to_proxy, mapping)
    ref = reference(x, y, loss.proxies.detach(), [0, 1], mapping[y].tolist(), 1.0, True)
    assert loss(x, y).item() == pytest.approx(ref, rel=1e-10)
    assert ProxyNCALoss(10, 4, proxies_per_class=0.25).proxies.shape[0] == math.ceil(10 * 0.25)


def test_gradient_of_equation_4_with_proxies():
    """Paper form (exclude_positive): dl/ds = -1 for p+, softmax over negatives otherwise (per sample)."""
    from dmlkit.losses.proxy.proxy_nca import proxy_nca_kernel

    x, y = batch(2, B=7, C=4)
    loss = ProxyNCALoss(4, 6, exclude_positive=True).double()
    xn = torch.nn.functional.normalize(x, dim=1)
    pn = torch.nn.functional.normalize(loss.proxies.detach(), dim=1)
    s = -torch.cdist(xn, pn) ** 2  # s(x, p) = -d(x, p)
    value, grad, row_factor = proxy_nca_kernel(s.T.clone(), True, loss.bank.candidate_columns(y), "static", True, 4.0)
    grad = grad.T * row_factor[:, None] * x.shape[0]  # [B, P]; Eq. (1): sum over the batch
    pos = y[:, None] == torch.arange(4)[None, :]
    neg_soft = torch.exp(s).masked_fill(pos, 0)
    expected = torch.where(pos, torch.full_like(grad, -1.0), neg_soft / neg_soft.sum(1, keepdim=True))
    torch.testing.assert_close(grad, expected, rtol=1e-10, atol=1e-12)
    assert value.item() == pytest.approx(loss(x, y).item(), rel=1e-10)


@pytest.mark.parametrize("rule,exclude,scale", [("static", False, 2.0), ("nearest", False, 2.0), ("nearest", True, 2.0),
                                                ("static", True, 2.0), ("static", False, 400.0)])
def test_fused_function_gradcheck(rule, exclude, scale):
    """gradcheck of the fused kernel w.r.t. normalised embeddings and raw proxies (scale 400: max-shift path)."""
    from functools import partial

    from dmlkit.losses.proxy._fused import fused_proxy_loss
    from dmlkit.losses.proxy.proxy_nca import proxy_nca_kernel

    x, y = batch(6, B=5, C=3, D=4)
    loss = ProxyNCALoss(3, 4, proxies_per_class=2).double()
    xn = torch.nn.functional.normalize(x, dim=1).requires_grad_(True)
    proxies = loss.proxies.detach().clone().requires_grad_(True)
    kernel = partial(proxy_nca_kernel, candidates=loss.bank.candidate_columns(y), assignment=rule,
                     exclude_positive=exclude, bound=2 * scale)
    assert torch.autograd.gradcheck(lambda e, p: fused_proxy_loss(e, p, kernel, 2 * scale), (xn, proxies))


@pytest.mark.parametrize("rule,exclude", [("static", False), ("nearest", False), ("nearest", True)])
def test_gradcheck_through_proxies_and_embeddings(rule, exclude):
    """gradcheck of the module w.r.t. embeddings, and its proxy gradient against the distance form."""
    x, y = batch(3, B=5, C=3, D=4)
    loss = ProxyNCALoss(3, 4, softmax_scale=2, proxies_per_class=2, assignment=rule, exclude_positive=exclude).double()
    x.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda e: loss(e, y), (x,))
    p0 = loss.proxies.detach().clone().requires_grad_(True)

    def distance_form(e, p):
        """Eq. (4) on -s * squared Euclidean distances (the paper's logits), float64 loops over rows."""
        d = torch.cdist(torch.nn.functional.normalize(e, dim=1), torch.nn.functional.normalize(p, dim=1)) ** 2
        logits = -2.0 * d
        total = 0
        for i in range(len(y)):
            own = [k for k in range(6) if k // 2 == y[i]]
            if rule == "nearest":
                pos = [max(own, key=lambda k: logits[i, k].item())]
                excl = own if exclude else [k for k in own if k not in pos]
            else:
                pos, excl = own, own if exclude else []
            den = [k for k in range(6) if k not in excl]
            total = total + torch.logsumexp(logits[i, den], 0) - torch.logsumexp(logits[i, pos], 0)
        return total / len(y)

    assert torch.autograd.gradcheck(distance_form, (x, p0))
    ours = torch.autograd.grad(loss(x, y), (x, loss.proxies))
    ref = torch.autograd.grad(distance_form(x, p0), (x, p0))
    torch.testing.assert_close(ours[0], ref[0])
    torch.testing.assert_close(ours[1], ref[1])


@pytest.mark.parametrize("scale", [1.0, 9.0])
def test_matches_pml(scale):
    from pytorch_metric_learning.losses import ProxyNCALoss as PMLProxyNCA

    g = torch.Generator().manual_seed(7)
    x = torch.randn(48, 16, generator=g, requires_grad=True)
    y = torch.randint(0, 20, (48,), generator=g)
    ours = ProxyNCALoss(20, 16, softmax_scale=scale)
    theirs = PMLProxyNCA(20, 16, softmax_scale=scale)
    theirs.proxies.data.copy_(ours.proxies.data)
    a, b = ours(x, y), theirs(x, y)
    assert a.item() == pytest.approx(b.item(), rel=1e-5)
    ga = torch.autograd.grad(a, (x, ours.proxies))
    gb = torch.autograd.grad(b, (x, theirs.proxies))
    torch.testing.assert_close(ga[0], gb[0], rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(ga[1], gb[1], rtol=1e-4, atol=1e-6)


def test_plus_plus_is_temperature_scaled_proxy_nca():
    x, y = batch(4)
    pp = ProxyNCAPlusPlusLoss(5, 6, temperature=0.2).double()
    plain = ProxyNCALoss(5, 6, softmax_scale=5.0, exclude_positive=False).double()
    plain.proxies.data.copy_(pp.proxies.data)
    assert pp(x, y).item() == pytest.approx(plain(x, y).item(), rel=1e-12)
    ref = reference(x, y, pp.proxies.detach(), list(range(5)), y.tolist(), 5.0, False)
    assert pp(x, y).item() == pytest.approx(ref, rel=1e-10)


def test_low_temperature_is_finite():
    x, y = batch(5)
    loss = ProxyNCAPlusPlusLoss(5, 6, temperature=1e-4)
    x = x.float().requires_grad_(True)
    value = loss(x, y)
    value.backward()
    assert torch.isfinite(value) and torch.isfinite(x.grad).all()


def test_paper_form_without_negatives_is_zero_and_keeps_the_graph():
    loss = ProxyNCALoss(1, 3, proxies_per_class=2, exclude_positive=True)
    x = torch.randn(4, 3, requires_grad=True)
    value = loss(x, torch.zeros(4, dtype=torch.int64))
    value.backward()
    assert value.item() == 0.0 and torch.equal(x.grad, torch.zeros_like(x))


def test_many_absent_classes_match_reference():
    x, y = batch(8, B=6, C=40)
    loss = ProxyNCALoss(40, 6, softmax_scale=4, exclude_positive=True).double()
    ref = reference(x, y, loss.proxies.detach(), list(range(40)), y.tolist(), 4.0, True)
    assert loss(x, y).item() == pytest.approx(ref, rel=1e-10)


@pytest.mark.parametrize("K,rule", [(1, "static"), (3, "nearest"), (0.4, "static")])
def test_batch_much_larger_than_the_proxy_set(K, rule):
    """The MNIST presets' shape (64 samples, 5 classes): fewer proxy rows than samples."""
    x, y = batch(5, B=64, C=5)
    x.requires_grad_(True)
    loss = ProxyNCALoss(5, 6, proxies_per_class=K, assignment=rule, seed=1).double()
    group = loss.bank.class_to_proxy[y].tolist() if K < 1 else y.tolist()
    groups_of_proxy = list(range(loss.proxies.shape[0])) if K < 1 else loss.proxy_labels.tolist()
    ref = reference(x.detach(), y, loss.proxies.detach(), groups_of_proxy, group, 1.0, loss.exclude_positive, rule)
    value = loss(x, y)
    assert value.item() == pytest.approx(ref, rel=1e-10)
    gx, gp = torch.autograd.grad(value, (x, loss.proxies))
    assert gx.shape == x.shape and gp.shape == loss.proxies.shape
    assert torch.isfinite(gx).all() and torch.isfinite(gp).all()


# ----------------------------------------------------------------------------- dynamic assignment


def dynamic_reference(x, y, proxies, scale, exclude_positive):
    """Proxy-NCA Sec. 4.1 / Eq. (4)-(5) with dynamic assignment, plain float64 loops.

    Triplets (x, y, Z) of the batch: x an anchor, y another sample of x's label, Z every sample
    of another label. p(v) = argmin_p d(v, p) over all proxies (Eq. (5)); the loss of a triplet is
    L_NCA(x, p(y), p(Z)) (Eq. (4)) with p(Z) the set of the negatives' proxies (plus p(y) in the
    softmax form); mean over triplets.
    """
    d = sq_dists(x, proxies)
    num_proxies = len(d[0])
    proxy_of = [min(range(num_proxies), key=lambda p: d[v][p]) for v in range(len(d))]
    total, count = 0.0, 0
    for a in range(len(d)):
        negatives = [z for z in range(len(d)) if y[z] != y[a]]
        if not negatives:
            continue
        pz = {proxy_of[z] for z in negatives}
        for pos in range(len(d)):
            if pos == a or y[pos] != y[a]:
                continue
            py = proxy_of[pos]
            denominator = pz if exclude_positive else pz | {py}
            num = math.exp(-scale * d[a][py])
            den = sum(math.exp(-scale * d[a][p]) for p in denominator)
            total += -math.log(num / den)
            count += 1
    return total / count


@pytest.mark.parametrize("exclude_positive", [False, True])
@pytest.mark.parametrize("K", [2, 0.5])
def test_dynamic_matches_the_triplet_reference(exclude_positive, K):
    x, y = batch(11, B=12, C=4)
    loss = ProxyNCALoss(4, 6, softmax_scale=3, proxies_per_class=K, assignment="dynamic",
                        exclude_positive=exclude_positive, seed=2).double()
    ref = dynamic_reference(x, y, loss.proxies.detach(), 3.0, exclude_positive)
    assert loss(x, y).item() == pytest.approx(ref, rel=1e-10)


def test_dynamic_depends_on_the_labels():
    """Sec. 7: dynamic assignment is supervised by the similar/dissimilar triplets, so labels matter."""
    x, _ = batch(12, B=12)
    loss = ProxyNCALoss(4, 6, proxies_per_class=2, assignment="dynamic").double()
    y1 = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3])
    y2 = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3])
    a, b = loss(x, y1).item(), loss(x, y2).item()
    assert a != pytest.approx(b, rel=1e-6)
    assert a == pytest.approx(dynamic_reference(x, y1, loss.proxies.detach(), 1.0, False), rel=1e-10)
    assert b == pytest.approx(dynamic_reference(x, y2, loss.proxies.detach(), 1.0, False), rel=1e-10)


def test_dynamic_gradients_and_batches_without_triplets():
    x, y = batch(13, B=6, C=3, D=4)
    loss = ProxyNCALoss(3, 4, softmax_scale=2, proxies_per_class=2, assignment="dynamic").double()
    x.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda e: loss(e, y), (x,))
    value = loss(x, y)
    gx, gp = torch.autograd.grad(value, (x, loss.proxies))
    assert torch.isfinite(gx).all() and torch.isfinite(gp).all() and gp.abs().sum() > 0
    value = loss(x[:3], torch.tensor([0, 1, 2]))  # every label once: no positive pair
    value.backward()
    assert value.item() == 0.0
    value = loss(x, torch.zeros(6, dtype=torch.int64))  # no negatives: no triplet
    assert value.item() == 0.0
