"""ContrastiveLoss against a float64 loop transcription, PML, and gradcheck."""

import pytest
import torch
from pytorch_metric_learning import losses as pml_losses
from pytorch_metric_learning.distances import CosineSimilarity as PmlCosine

from dmlkit.distances import CosineSimilarity, LpDistance
from dmlkit.losses.base import LOSSES
from dmlkit.losses.pair import ContrastiveLoss
from dmlkit.mining.selection import PairSelection, TripletSelection


def batch(n=16, d=8, classes=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = torch.randint(0, classes, (n,), generator=g)
    return x, y


def loop_reference(x, y, pos_margin, neg_margin, reduction, ref=None, ref_y=None):
    """Hadsell/Wu contrastive terms pair by pair on normalised embeddings (PML's default distance)."""
    same = ref is None
    ref, ref_y = (x, y) if same else (ref, ref_y)
    xn = x / x.norm(dim=1, keepdim=True)
    rn = ref / ref.norm(dim=1, keepdim=True)
    pos, neg = [], []
    for i in range(len(x)):
        for j in range(len(ref)):
            if same and i == j:
                continue
            d = (xn[i] - rn[j]).norm()
            if y[i] == ref_y[j]:
                pos.append(torch.relu(d - pos_margin))
            else:
                neg.append(torch.relu(neg_margin - d))

    def red(terms):
        if not terms:
            return torch.zeros((), dtype=x.dtype)
        t = torch.stack(terms)
        if reduction == "sum":
            return t.sum()
        if reduction == "mean":
            return t.mean()
        nz = t[t > 0]
        return nz.mean() if len(nz) else t.sum() * 0

    return red(pos) + red(neg)


@pytest.mark.parametrize("reduction", ["mean_nonzero", "mean", "sum"])
@pytest.mark.parametrize("margins", [(0.0, 1.0), (0.3, 0.9)])
def test_value_and_gradient_match_loop_reference(reduction, margins):
    x, y = batch()
    x1 = x.clone().requires_grad_(True)
    x2 = x.clone().requires_grad_(True)
    ours = ContrastiveLoss(*margins, reduction=reduction)(x1, y)
    ref = loop_reference(x2, y, *margins, reduction)
    ours.backward()
    ref.backward()
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-8, atol=1e-10)


def test_reference_set_matches_loop_reference():
    x, y = batch(12)
    r, ry = batch(20, seed=1)
    ours = ContrastiveLoss(0.2, 0.8)(x, y, ref_emb=r, ref_labels=ry)
    torch.testing.assert_close(ours, loop_reference(x, y, 0.2, 0.8, "mean_nonzero", r, ry))


@pytest.mark.parametrize("margins", [(0.0, 1.0), (0.25, 0.55)])
def test_matches_pml(margins):
    x, y = batch(32, 16, 6, seed=3)
    x = x.float()
    torch.testing.assert_close(
        ContrastiveLoss(*margins)(x, y), pml_losses.ContrastiveLoss(*margins)(x, y), rtol=1e-5, atol=1e-5
    )


def test_matches_pml_with_cosine_similarity_and_reference_set():
    x, y = batch(16, 16, 4, seed=4)
    r, ry = batch(40, 16, 4, seed=5)
    ours = ContrastiveLoss(0.8, 0.3, distance=CosineSimilarity())(x.float(), y, ref_emb=r.float(), ref_labels=ry)
    pml = pml_losses.ContrastiveLoss(0.8, 0.3, distance=PmlCosine())(x.float(), y, ref_emb=r.float(), ref_labels=ry)
    torch.testing.assert_close(ours, pml, rtol=1e-5, atol=1e-5)


def test_gradcheck_float64():
    x, y = batch(10, 4, 3, seed=6)
    loss = ContrastiveLoss(0.1, 1.2, distance=LpDistance(power=1, normalize_embeddings=False))
    assert torch.autograd.gradcheck(lambda e: loss(e, y), (x.requires_grad_(True),))


def test_weighted_pairs_are_summed_without_normalisation():
    x, y = batch(10, 4, 3, seed=7)
    loss = ContrastiveLoss(0.1, 1.0)
    pos = y[:, None] == y[None, :]
    pos.fill_diagonal_(False)
    neg = y[:, None] != y[None, :]
    g = torch.Generator().manual_seed(0)
    pw, nw = torch.rand(10, 10, generator=g, dtype=torch.float64), torch.rand(10, 10, generator=g, dtype=torch.float64)
    got = loss(x, y, pairs=PairSelection(pos, neg, pw, nw))
    d = torch.cdist(x / x.norm(dim=1, keepdim=True), x / x.norm(dim=1, keepdim=True))
    expected = (pw * torch.relu(d - 0.1) * pos).sum() + (nw * torch.relu(1.0 - d) * neg).sum()
    torch.testing.assert_close(got, expected)
    # weights= [B, R] gives the same rule over the label pairs.
    w = torch.where(pos, pw, nw)
    torch.testing.assert_close(loss(x, y, weights=w), expected)


def test_triplet_selection_is_turned_into_its_pairs():
    x, y = torch.randn(4, 3, dtype=torch.float64), torch.tensor([0, 0, 1, 1])
    sel = TripletSelection(torch.tensor([0, 0]), torch.tensor([1, 1]), torch.tensor([2, 3]))
    loss = ContrastiveLoss(0.0, 10.0, reduction="sum")
    d = torch.cdist(x / x.norm(dim=1, keepdim=True), x / x.norm(dim=1, keepdim=True))
    expected = d[0, 1] + (10 - d[0, 2]) + (10 - d[0, 3])
    torch.testing.assert_close(loss(x, y, pairs=sel), expected)


def test_c1_and_c2_are_registry_settings():
    c1 = LOSSES.create("contrastive", neg_margin=0.5)
    c2 = LOSSES.create("contrastive", pos_margin=0.2652, neg_margin=0.5409)
    assert isinstance(c1, ContrastiveLoss) and c1.pos_margin == 0.0 and c1.neg_margin == 0.5
    assert c2.pos_margin == 0.2652
    x, y = batch()
    assert not torch.equal(c1(x, y), c2(x, y))


# ----------------------------------------------------------------------------- XBM's cosine form (ASAP's C1)


def xbm_reference(x, y, margin, ref=None, ref_y=None, reduction="mean", epsilon=1e-5):
    """XBM's contrastive loss (ASAP App. A.2 C1), float64 loops over anchors and references.

    s = cosine similarity; anchor i adds 1 - s for each positive with s < 1 - epsilon and s for each
    negative with s > margin; the sum is divided by the number of anchors (reduction "mean") or not ("sum").
    """
    same = ref is None
    ref, ref_y = (x, y) if same else (ref, ref_y)
    xs, rs = x.tolist(), ref.tolist()

    def cos(u, v):
        dot = sum(a * b for a, b in zip(u, v))
        return dot / (sum(a * a for a in u) ** 0.5 * sum(b * b for b in v) ** 0.5)

    total = 0.0
    for i in range(len(xs)):
        for j in range(len(rs)):
            if same and i == j:
                continue
            s = cos(xs[i], rs[j])
            if y[i] == ref_y[j] and s < 1 - epsilon:
                total += 1 - s
            elif y[i] != ref_y[j] and s > margin:
                total += s
    return total / len(xs) if reduction == "mean" else total


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_cosine_contrastive_matches_the_xbm_loop(reduction):
    from dmlkit.losses.pair import CosineContrastiveLoss

    x, y = batch(n=12, d=3, classes=3, seed=4)  # d=3: many negatives above the margin
    loss = CosineContrastiveLoss(0.5, reduction=reduction)
    assert loss(x, y).item() == pytest.approx(xbm_reference(x, y, 0.5, reduction=reduction), rel=1e-10)
    g = torch.Generator().manual_seed(5)
    ref, ref_y = torch.randn(9, 3, generator=g, dtype=torch.float64), torch.randint(0, 3, (9,), generator=g)
    ref[0] = x[0]  # a copy of an anchor among the references (XBM's memory holds the batch): cut by epsilon
    ref_y[0] = y[0]
    value = loss(x, y, ref_emb=ref, ref_labels=ref_y)
    assert value.item() == pytest.approx(xbm_reference(x, y, 0.5, ref, ref_y, reduction), rel=1e-10)
    x.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda e: loss(e, y), (x,))


def test_cosine_contrastive_against_pml_contrastive_with_cosine():
    """PML's ContrastiveLoss(pos_margin=1, neg_margin=0.5, CosineSimilarity) is not XBM's loss: summed, it
    counts s - 0.5 per active negative where XBM counts s (same gradient); its default averages differ."""
    from pytorch_metric_learning.reducers import SumReducer

    from dmlkit.losses.pair import CosineContrastiveLoss

    x, y = batch(n=12, d=3, classes=3, seed=6)
    x = x.float().requires_grad_(True)
    ours = CosineContrastiveLoss(0.5, reduction="sum")(x, y)
    pml = pml_losses.ContrastiveLoss(pos_margin=1, neg_margin=0.5, distance=PmlCosine(), reducer=SumReducer())(x, y)
    xn = torch.nn.functional.normalize(x.detach(), dim=1)
    sim = xn @ xn.T
    active_negatives = ((y[:, None] != y[None, :]) & (sim > 0.5)).sum().item()
    assert active_negatives > 0
    assert ours.item() == pytest.approx(pml.item() + 0.5 * active_negatives, rel=1e-5)
    torch.testing.assert_close(torch.autograd.grad(ours, x)[0], torch.autograd.grad(pml, x)[0], rtol=1e-4, atol=1e-6)
    pml_default = pml_losses.ContrastiveLoss(pos_margin=1, neg_margin=0.5, distance=PmlCosine())(x, y)
    assert pml_default.item() != pytest.approx(CosineContrastiveLoss(0.5)(x, y).item(), rel=1e-3)


def test_cosine_contrastive_needs_a_similarity():
    from dmlkit.exceptions import InvalidParameterError
    from dmlkit.losses.pair import CosineContrastiveLoss

    with pytest.raises(InvalidParameterError, match="similarity"):
        CosineContrastiveLoss(distance=LpDistance())
    from dmlkit.distances import DotProductSimilarity

    x, y = batch(n=8, d=3, seed=7)
    x = 0.5 * x / x.norm(dim=1, keepdim=True)  # inside the unit ball (ASAP's bounded normalisation leaves it)
    dot = LOSSES.create("cosine_contrastive", margin=0.1, distance=DotProductSimilarity(normalize_embeddings=False))
    s = x @ x.T
    same = y[:, None] == y[None, :]
    off = ~torch.eye(8, dtype=torch.bool)
    expected = ((1 - s)[same & off].sum() + s[~same & (s > 0.1)].sum()) / 8
    assert dot(x, y).item() == pytest.approx(expected.item(), rel=1e-10)
