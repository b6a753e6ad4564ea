"""float16 batches where PML's float16 tests decide the last bits: Circle, N-pair and ranked list losses
(and L-Softmax, whose float16 test fails on its own reference's overflow).

PML computes these losses in the embeddings' dtype and its own float16 tests compare against their
formulas evaluated that way (``isclose`` at its default ``rtol=1e-5`` for Circle and N-pair, which in
float16 means the same value; ``rtol=1e-2`` for the ranked list loss). Each reference here is a float64
transcription of the paper's equation fed with what PML rounds to float16 (the cosine or Euclidean
matrix, N-pair's per-pair terms, the ranked list weights); none calls dmlkit.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from dmlkit.losses import CircleLoss, NPairsLoss, RankedListLoss

HALF = torch.float16


def half_batch(seed: int, n: int, d: int, classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, d, generator=g, dtype=torch.float64) * 2).to(HALF)
    return x, torch.randint(0, classes, (n,), generator=g)


def half_cosines(x: torch.Tensor) -> torch.Tensor:
    """The cosine matrix as PML's ``CosineSimilarity`` computes it for float16 embeddings, in float64."""
    unit = F.normalize(x, dim=1)  # float16, rounded
    return (unit @ unit.T).double()  # the float16 product, rounded


def circle_reference(s: torch.Tensor, y: torch.Tensor, m: float, gamma: float) -> float:
    """Circle loss, Sun et al. Eq. (4) with Eq. (5)'s weights, mean over anchors having both kinds of pairs."""
    terms = []
    for a in range(len(y)):
        pos = [float(s[a, k]) for k in range(len(y)) if k != a and y[k] == y[a]]
        neg = [float(s[a, k]) for k in range(len(y)) if y[k] != y[a]]
        if not pos or not neg:
            continue
        lp = [-gamma * max(1 + m - v, 0.0) * (v - (1 - m)) for v in pos]
        ln = [gamma * max(v + m, 0.0) * (v - m) for v in neg]
        lse = max(lp) + math.log(sum(math.exp(v - max(lp)) for v in lp))
        lse += max(ln) + math.log(sum(math.exp(v - max(ln)) for v in ln))
        terms.append(max(lse, 0.0) + math.log1p(math.exp(-abs(lse))))
    return sum(terms) / len(terms)


@pytest.mark.parametrize("seed", [0, 1, 4, 5])  # 1, 4, 5: the float32 cosines round the loss to another value
def test_circle_of_a_float16_batch_equals_the_equation_on_the_float16_cosines(seed):
    """gamma = 256 turns the cosines' float16 rounding into several units in the loss's last place."""
    x, y = half_batch(seed, n=10, d=2, classes=3)
    loss = CircleLoss(m=0.25, gamma=256)(x.clone().requires_grad_(True), y)
    expected = torch.tensor(circle_reference(half_cosines(x), y, 0.25, 256.0), dtype=torch.float64).to(HALF)
    assert loss.dtype == HALF
    assert torch.isclose(loss, expected), (loss.item(), expected.item())  # PML's tolerance: the same float16 value


def test_circle_of_a_float16_batch_keeps_a_float32_gradient_path():
    x, y = half_batch(3, n=10, d=4, classes=3)
    x.requires_grad_(True)
    CircleLoss(m=0.25, gamma=32)(x, y).backward()
    assert x.grad.dtype == HALF and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0


def npairs_terms(x: torch.Tensor, y: torch.Tensor) -> list[float]:
    """Sohn's N-pair-mc per class (Eq. (3)) on float16 cosines: ``-log softmax`` of the anchor-positive entry,
    the anchor being the class's first sample with a positive and the positive its first one (PML's pairs)."""
    s = half_cosines(x)
    anchors, positives = [], []
    for i in range(len(y)):
        if int(y[i]) in {int(y[a]) for a in anchors}:
            continue
        later = [j for j in range(len(y)) if j != i and y[j] == y[i]]
        if later:
            anchors.append(i)
            positives.append(later[0])
    logits = s[anchors][:, positives]
    return [float(-(logits[c, c] - torch.logsumexp(logits[c], 0))) for c in range(len(anchors))]


@pytest.mark.parametrize("seed", [0, 7, 9, 12])  # 7, 9, 12: the float32 mean rounds to another value
def test_npairs_of_a_float16_batch_averages_per_pair_terms_rounded_to_float16(seed):
    """PML's per-pair losses are float16 tensors before its mean: the reference rounds each term, then averages."""
    x, y = half_batch(seed, n=12, d=3, classes=4)
    terms = torch.tensor(npairs_terms(x, y), dtype=torch.float64)
    expected = terms.to(HALF).double().mean().to(HALF)
    loss = NPairsLoss()(x.clone().requires_grad_(True), y)
    assert loss.dtype == HALF
    assert torch.isclose(loss, expected), (loss.item(), expected.item())


def to_half(v: float) -> float:
    return float(torch.tensor(v, dtype=torch.float64).to(HALF))


def ranked_list_reference(x: torch.Tensor, y: torch.Tensor, margin, alpha, tp, tn, imbalance) -> float:
    """Wang et al. Eqs. (5)-(9) with PML's weighting and guard, on float16 Euclidean distances of the
    normalised embeddings; the hinge ``t``, the exponent ``T t``, the weight ``exp(T t)`` and each
    ``w + 1e-5`` rounded to float16 as PML holds them."""
    unit = F.normalize(x, dim=1)
    d = ((unit[:, None, :] - unit[None, :, :]) ** 2).sum(-1).sqrt().double()
    n = len(y)
    per_anchor = []
    for i in range(n):
        parts = []
        for sign, temperature, same in ((1.0, tp, True), (-1.0, tn, False)):
            numerator = denominator = 0.0
            for j in range(n):
                w = 0.0
                if j != i and float(d[i, j]) > 0:
                    t = float(d[i, j]) - (alpha - margin) if same else alpha - float(d[i, j])
                    if (y[j] == y[i]) == same and t > 0:
                        t = to_half(t)
                        w = to_half(math.exp(to_half(temperature * t)))
                        numerator += w * t
                denominator += to_half(w + 1e-5)
            parts.append(numerator / denominator)
        per_anchor.append((1 - imbalance) * parts[0] + imbalance * parts[1])
    return sum(per_anchor) / n


@pytest.mark.parametrize(
    "margin, alpha, tp, tn, imbalance",
    [(0.4, 0.8, 0.5, 0.8, 0.5), (0.8, 1.0, 3.0, 2.0, 0.7), (1.2, 0.4, -10.0, -10.0, 0.9), (1.2, 3.0, -10.0, -10.0, 0.9)],
)
def test_ranked_list_of_a_float16_batch_follows_the_float16_weights(margin, alpha, tp, tn, imbalance):
    """Weights below float16's smallest subnormal are 0 there (Tp = -10: the loss is 0 where float32 gives ~1e-6)."""
    x, y = half_batch(4, n=24, d=16, classes=4)
    expected = ranked_list_reference(x, y, margin, alpha, tp, tn, imbalance)
    loss = RankedListLoss(margin=margin, Tn=tn, imbalance=imbalance, alpha=alpha, Tp=tp)(x.clone().requires_grad_(True), y)
    assert loss.dtype == HALF
    assert torch.isclose(loss, torch.tensor(expected).to(HALF), rtol=1e-2), (loss.item(), expected)  # PML's rtol


@pytest.mark.parametrize("make", [lambda: CircleLoss(m=0.25, gamma=256), NPairsLoss,
                                  lambda: RankedListLoss(margin=0.4, Tn=0.8, alpha=0.8, Tp=0.5)],
                         ids=["circle", "npairs", "ranked_list"])
def test_a_zero_row_of_a_float16_batch_keeps_the_loss_finite(make):
    """A zero row's float16 norm clamps to 0 (PML's value is NaN); its float32 entries stand in, as for float32."""
    x, y = half_batch(5, n=12, d=4, classes=3)
    x[[0, 7]] = 0.0
    loss = make()(x, y)
    assert torch.isfinite(loss)
    assert torch.isclose(loss.float(), make()(x.detach().float(), y), rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("make", [lambda: CircleLoss(m=0.25, gamma=256), NPairsLoss,
                                  lambda: RankedListLoss(margin=1.2, Tn=-10.0, imbalance=0.9, alpha=0.4, Tp=-10.0)],
                         ids=["circle", "npairs", "ranked_list"])
def test_a_bfloat16_batch_keeps_the_float32_accumulation(make):
    """PML's float16 roundings are float16's: a bfloat16 batch gets the float32 loss rounded once, as every loss."""
    x, y = half_batch(1, n=12, d=4, classes=3)
    x = x.to(torch.bfloat16)
    loss = make()(x, y)
    assert loss.dtype == torch.bfloat16
    assert loss == make()(x.float(), y).to(torch.bfloat16)


def large_margin_reference(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, margin: int, scale: float) -> torch.Tensor:
    """Per-sample L-Softmax losses (Liu et al. 2016 Eq. (4)-(6)): the target logit ``|x||W_y| psi(theta)`` with
    ``psi = (-1)^k cos(m theta) - 2k``, ``k = floor(m theta / pi)``; the others ``|x||W_j| cos``; float64."""
    x, w = x.double(), w.double()
    magnitudes = x.norm(dim=1)[:, None] * w.norm(dim=0)[None, :]
    cos = (x @ w) / magnitudes
    theta = torch.acos(cos.gather(1, y[:, None]).clamp(-1, 1))
    k = torch.floor(theta * margin / math.pi)
    psi = torch.where(k % 2 == 0, 1.0, -1.0) * torch.cos(margin * theta) - 2 * k
    logits = cos.scatter(1, y[:, None], psi) * magnitudes * scale
    return F.cross_entropy(logits, y, reduction="none")


def test_large_margin_softmax_of_a_float16_batch_where_a_float16_sum_overflows():
    """PML's float16 test of L-Softmax (angles 0..179 degrees, scaled ellipse, margin 10, scale 2) fails for both
    PML and dmlkit when its float16 reference's mean over 180 samples sums past float16's largest value (65504):
    the reference is then ``inf``. dmlkit's loss is the float32 mean rounded once, finite and equal to the equation."""
    from dmlkit.losses import LargeMarginSoftmaxLoss

    angles = torch.arange(180, dtype=torch.float64).deg2rad()
    x = (torch.stack([angles.cos() * 2, angles.sin() * 0.5], dim=1) * 10).to(HALF)
    y = torch.randint(0, 10, (180,), generator=torch.Generator().manual_seed(1))
    loss_fn = LargeMarginSoftmaxLoss(num_classes=10, embedding_size=2, margin=10, scale=2)
    value = loss_fn(x, y)
    per_sample = large_margin_reference(x, loss_fn.W.detach(), y, 10, 2.0)
    assert per_sample.sum() > torch.finfo(HALF).max  # a float16 accumulation of this mean overflows
    assert value.dtype == HALF and torch.isfinite(value)
    assert value.double().item() == pytest.approx(per_sample.mean().item(), rel=2e-3)
