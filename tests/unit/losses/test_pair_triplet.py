"""TripletMarginLoss: float64 loop reference over explicit triplets, PML, gradcheck, scale."""

import pytest
import torch
from pytorch_metric_learning import losses as pml_losses
from pytorch_metric_learning.distances import CosineSimilarity as PmlCosine

import dmlkit.losses.pair._triplets as triplets_module
from dmlkit.distances import CosineSimilarity, LpDistance
from dmlkit.losses.pair import TripletMarginLoss
from dmlkit.mining.selection import TripletSelection


def batch(n=16, d=8, classes=4, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=dtype), torch.randint(0, classes, (n,), generator=g)


def loop_reference(x, y, margin, reduction, swap=False, smooth=False, ref=None, ref_y=None):
    """Every (a, p, n) one by one, Euclidean distance between normalised embeddings."""
    same = ref is None
    ref, ref_y = (x, y) if same else (ref, ref_y)
    xn = x / x.norm(dim=1, keepdim=True)
    rn = ref / ref.norm(dim=1, keepdim=True)
    terms = []
    for a in range(len(x)):
        for p in range(len(ref)):
            if (same and p == a) or y[a] != ref_y[p]:
                continue
            for n in range(len(ref)):
                if y[a] == ref_y[n]:
                    continue
                d_ap, d_an = (xn[a] - rn[p]).norm(), (xn[a] - rn[n]).norm()
                if swap:
                    d_an = torch.minimum(d_an, (rn[p] - rn[n]).norm())
                v = d_ap - d_an + margin
                terms.append(torch.nn.functional.softplus(v) if smooth else torch.relu(v))
    t = torch.stack(terms)
    if reduction == "sum":
        return t.sum()
    if reduction == "mean":
        return t.mean()
    return t[t > 0].mean()


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(reduction="mean_nonzero"),
        dict(reduction="mean"),
        dict(reduction="sum"),
        dict(swap=True, reduction="mean_nonzero"),
        dict(smooth=True, reduction="mean_nonzero"),
    ],
)
def test_all_triplets_value_and_gradient_match_loop(kwargs):
    x, y = batch(12)
    x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    loss = TripletMarginLoss(
        0.3, swap=kwargs.get("swap", False), smooth_loss=kwargs.get("smooth", False), reduction=kwargs["reduction"]
    )
    ours = loss(x1, y)
    ref = loop_reference(x2, y, 0.3, **kwargs)
    ours.backward()
    ref.backward()
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(x1.grad, x2.grad)


def test_reference_set_with_swap_uses_true_positive_negative_distance():
    x, y = batch(6, seed=1)
    r, ry = batch(10, seed=2)
    x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    r1, r2 = r.clone().requires_grad_(True), r.clone().requires_grad_(True)
    ours = TripletMarginLoss(0.5, swap=True)(x1, y, ref_emb=r1, ref_labels=ry)
    ref = loop_reference(x2, y, 0.5, "mean_nonzero", swap=True, ref=r2, ref_y=ry)
    (ours + 0).backward()
    ref.backward()
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(r1.grad, r2.grad)
    torch.testing.assert_close(x1.grad, x2.grad)


def test_chunked_computation_equals_single_chunk(monkeypatch):
    x, y = batch(40, classes=5, seed=3)
    x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    loss = TripletMarginLoss(0.2, swap=True)
    whole = loss(x1, y)
    whole.backward()
    monkeypatch.setattr(triplets_module, "CHUNK_ELEMENTS", 40 * 3)  # three positive pairs per chunk
    chunked = loss(x2, y)
    chunked.backward()
    torch.testing.assert_close(whole, chunked)
    torch.testing.assert_close(x1.grad, x2.grad)


@pytest.mark.parametrize("kwargs", [dict(), dict(margin=0.2, swap=True), dict(margin=0.1, smooth_loss=True)])
def test_matches_pml(kwargs):
    x, y = batch(48, 16, 8, seed=4, dtype=torch.float32)
    torch.testing.assert_close(
        TripletMarginLoss(**kwargs)(x, y), pml_losses.TripletMarginLoss(**kwargs)(x, y), rtol=1e-5, atol=1e-5
    )


def test_matches_pml_with_cosine_and_reference_set():
    x, y = batch(16, 16, 4, seed=5, dtype=torch.float32)
    r, ry = batch(30, 16, 4, seed=6, dtype=torch.float32)
    ours = TripletMarginLoss(0.1, distance=CosineSimilarity())(x, y, ref_emb=r, ref_labels=ry)
    pml = pml_losses.TripletMarginLoss(0.1, distance=PmlCosine())(x, y, ref_emb=r, ref_labels=ry)
    torch.testing.assert_close(ours, pml, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("swap", [False, True])
def test_gradcheck_float64(swap):
    x, y = batch(9, 4, 3, seed=7)
    loss = TripletMarginLoss(0.4, swap=swap, distance=LpDistance(power=2, normalize_embeddings=False))
    assert torch.autograd.gradcheck(lambda e: loss(e, y), (x.requires_grad_(True),))


def test_explicit_triplets_match_loop():
    x, y = torch.randn(5, 3, dtype=torch.float64), torch.tensor([0, 0, 1, 1, 2])
    sel = TripletSelection(torch.tensor([0, 1, 2]), torch.tensor([1, 0, 3]), torch.tensor([2, 4, 4]))
    xn = x / x.norm(dim=1, keepdim=True)
    d = torch.cdist(xn, xn)
    expected = torch.relu(d[sel.anchor, sel.positive] - d[sel.anchor, sel.negative] + 1.0).sum()
    torch.testing.assert_close(TripletMarginLoss(1.0, reduction="sum")(x, y, pairs=sel), expected)


def test_random_triplets_are_valid_reproducible_and_resumable():
    x, y = batch(32, classes=6, seed=8)
    a = TripletMarginLoss(0.2, triplets_per_anchor=3, seed=5)
    b = TripletMarginLoss(0.2, triplets_per_anchor=3, seed=5)
    first = [a(x, y), a(x, y)]
    assert torch.equal(first[0], b(x, y))
    b.load_state_dict(a.state_dict())
    assert torch.equal(a(x, y), b(x, y))
    assert not torch.equal(first[0], first[1])
    pos = y[:, None] == y[None, :]
    pos.fill_diagonal_(False)
    neg = y[:, None] != y[None, :]
    ta, tp, tn = triplets_module.sample_triplets(pos, neg, 4, torch.Generator().manual_seed(0))
    assert len(ta) == 4 * int((pos.any(1) & neg.any(1)).sum())
    assert bool(pos[ta, tp].all()) and bool(neg[ta, tn].all())


def test_batch_of_1024_runs_without_cubic_memory():
    x, y = batch(1024, 32, 256, seed=9, dtype=torch.float32)
    x.requires_grad_(True)
    loss = TripletMarginLoss(0.2)(x, y)
    loss.backward()
    assert torch.isfinite(loss) and loss > 0
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
