"""Angular, tuplet margin, intra-pair variance, TCM, SNR contrastive, NCA, instance and dynamic
soft margin losses: float64 loops transcribed from each paper's equation, gradchecks, PML agreement."""

import math

import pytest
import pytorch_metric_learning.losses as pml
import torch

import dmlkit.losses as dl
from dmlkit.exceptions import InvalidParameterError

G = torch.Generator().manual_seed(7)
X = torch.randn(10, 5, generator=G, dtype=torch.float64)
Y = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 3, 4])
REF = torch.randn(7, 5, generator=G, dtype=torch.float64)
REF_Y = torch.tensor([0, 1, 1, 2, 5, 3, 0])


def unit(v):
    return v / v.norm()


def pairs(y, ref_y=None):
    """(a, p) positive and (a, n) negative index pairs, self-pairs left out when references are the batch."""
    same = ref_y is None
    ref_y = y if same else ref_y
    pos = [(a, p) for a in range(len(y)) for p in range(len(ref_y)) if y[a] == ref_y[p] and not (same and a == p)]
    neg = [(a, n) for a in range(len(y)) for n in range(len(ref_y)) if y[a] != ref_y[n]]
    return pos, neg


# ---- paper equations as plain loops ---------------------------------------------------------------
def angular_ref(x, y, alpha=40.0, refs=None, ref_y=None, normalize_negatives=True):
    """Wang et al. (2017) Eq. (8) per positive pair, mean (PML's form: negatives not normalised)."""
    refs = x if refs is None else refs
    t = math.tan(math.radians(alpha)) ** 2
    pos, neg = pairs(y, ref_y)
    total = 0.0
    for a, p in pos:
        xa, xp = unit(x[a]), unit(refs[p])
        s = sum(torch.exp(4 * t * (xa + xp) @ (unit(refs[n]) if normalize_negatives else refs[n]) - 2 * (1 + t) * xa @ xp) for aa, n in neg if aa == a)
        total = total + torch.log(1 + s)
    return total / len(pos)


def tuplet_ref(x, y, margin=5.73, scale=64.0):
    """Yu & Tao (2019) Eq. (4): cos(theta_ap - beta) against cos(theta_an), mean over positive pairs."""
    pos, neg = pairs(y)
    total = 0.0
    for a, p in pos:
        theta = torch.acos(unit(x[a]) @ unit(x[p]))
        s = sum(torch.exp(scale * (unit(x[a]) @ unit(x[n]) - torch.cos(theta - math.radians(margin))))
                for aa, n in neg if aa == a)
        total = total + torch.log(1 + s)
    return total / len(pos)


def ipv_ref(x, y, pos_eps=0.01, neg_eps=0.02):
    """Yu & Tao (2019) Eq. (5)."""
    pos, neg = pairs(y)
    cos = {(a, b): unit(x[a]) @ unit(x[b]) for a in range(len(y)) for b in range(len(y))}
    mu_p = sum(cos[q] for q in pos) / len(pos)
    mu_n = sum(cos[q] for q in neg) / len(neg)
    lp = sum(torch.relu((1 - pos_eps) * mu_p - cos[q]) ** 2 for q in pos) / len(pos)
    ln = sum(torch.relu(cos[q] - (1 + neg_eps) * mu_n) ** 2 for q in neg) / len(neg)
    return lp + ln


def tcm_ref(x, y, lp=1.0, lm=0.7, mp=0.9, mm=0.1, refs=None, ref_y=None):
    """Zhang et al. (2024) Eq. (5)."""
    refs = x if refs is None else refs
    pos, neg = pairs(y, ref_y)
    sp = [unit(x[a]) @ unit(refs[b]) for a, b in pos]
    sn = [unit(x[a]) @ unit(refs[b]) for a, b in neg]
    act_p = [mp - s for s in sp if s <= mp]
    act_n = [s - mm for s in sn if s >= mm]
    return lp * (sum(act_p) / max(len(act_p), 1)) + lm * (sum(act_n) / max(len(act_n), 1))


def snr_ref(x, y, pos_margin=0.0, neg_margin=1.0):
    """Yuan et al. (2019) Eq. (5) distance in the contrastive loss (PML's non-zero averaging)."""
    pos, neg = pairs(y)

    def d(a, b):
        return torch.var(unit(x[b]) - unit(x[a])) / torch.var(unit(x[a]))

    tp = [torch.relu(d(a, b) - pos_margin) for a, b in pos]
    tn = [torch.relu(neg_margin - d(a, b)) for a, b in neg]
    return sum(tp) / max(sum(1 for t in tp if t > 0), 1) + sum(tn) / max(sum(1 for t in tn if t > 0), 1)


def nca_ref(x, y, scale=3.0, refs=None, ref_y=None):
    """Goldberger et al. (2004) Eqs. (1)-(2) on squared distances between unit vectors; mean over anchors with a positive."""
    same = refs is None
    refs, ref_y = (x, y) if same else (refs, ref_y)
    losses = []
    for i in range(len(y)):
        js = [j for j in range(len(ref_y)) if not (same and i == j)]
        e = {j: torch.exp(-scale * ((unit(x[i]) - unit(refs[j])) ** 2).sum()) for j in js}
        num = sum(e[j] for j in js if ref_y[j] == y[i])
        if not isinstance(num, int):
            losses.append(-torch.log(num / sum(e.values())))
    return sum(losses) / len(losses)


def instance_ref(x, y, gamma=4.0):
    """Batch-classifier instance loss: cross-entropy of gamma * cos with the label's rank as target."""
    ranks = {c: r for r, c in enumerate(sorted(set(y.tolist())))}
    total = 0.0
    for i in range(len(y)):
        logits = [gamma * unit(x[i]) @ unit(x[j]) for j in range(len(y))]
        total = total - (logits[ranks[int(y[i])]] - torch.log(sum(torch.exp(v) for v in logits)))
    return total / len(y)


def dsm_ref(x, y, min_val=-2.0, num_bins=10):
    """Zhang & Rusinkiewicz (2019) Eqs. (6)-(8), first batch: its own interpolated histogram's CDF weights t."""
    pos, neg = pairs(y)
    t = [((unit(x[a]) - unit(x[p])).norm() - (unit(x[a]) - unit(x[n])).norm())
         for a, p in pos for aa, n in neg if aa == a]
    width = 2 * abs(min_val) / num_bins
    hist = [0.0] * num_bins
    for v in t:
        pos_f = (float(v) - min_val) / width
        lo = int(math.floor(pos_f))
        hist[lo] += 1 - (pos_f - lo)
        hist[min(lo + 1, num_bins - 1)] += pos_f - lo
    cdf = [sum(hist[: k + 1]) / sum(hist) for k in range(num_bins)]
    return sum(cdf[int(math.floor((float(v) - min_val) / width))] * v for v in t) / len(t)


CASES = {
    "angular": (lambda: dl.AngularLoss(alpha=40, normalize_negatives=True), angular_ref,
                lambda: pml.AngularLoss(alpha=40)),
    "tuplet_margin": (lambda: dl.TupletMarginLoss(), tuplet_ref, lambda: pml.TupletMarginLoss()),
    "intra_pair_variance": (lambda: dl.IntraPairVarianceLoss(0.01, 0.02), ipv_ref,
                            lambda: pml.IntraPairVarianceLoss(0.01, 0.02)),
    "tcm": (lambda: dl.ThresholdConsistentMarginLoss(1.0, 0.7, 0.9, 0.1), tcm_ref,
            lambda: pml.ThresholdConsistentMarginLoss(1.0, 0.7, 0.9, 0.1)),
    "snr_contrastive": (lambda: dl.SignalToNoiseRatioContrastiveLoss(), snr_ref,
                        lambda: pml.SignalToNoiseRatioContrastiveLoss()),
    "nca": (lambda: dl.NCALoss(softmax_scale=3.0), nca_ref, lambda: pml.NCALoss(softmax_scale=3.0)),
    "instance": (lambda: dl.InstanceLoss(gamma=4.0), instance_ref, lambda: pml.InstanceLoss(gamma=4.0)),
    "dynamic_soft_margin": (lambda: dl.DynamicSoftMarginLoss(), dsm_ref, lambda: pml.DynamicSoftMarginLoss()),
}


@pytest.mark.parametrize("name", list(CASES))
def test_value_matches_the_paper_equation(name):
    make, reference, _ = CASES[name]
    assert torch.allclose(make()(X, Y), reference(X, Y), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", [n for n in CASES if n != "dynamic_soft_margin"])
def test_gradcheck_float64(name):
    make = CASES[name][0]
    loss = make()
    x = X[:8].clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda v: loss(v, Y[:8]), (x,), eps=1e-6, atol=1e-6)


def test_dynamic_soft_margin_gradcheck_with_settled_histogram():
    """The CDF weights are statistics (no gradient): with the histogram held still, the gradient is exact."""
    loss = dl.DynamicSoftMarginLoss()
    loss(X, Y)
    loss.momentum = 1e-300  # the next calls leave the histogram as it is
    x = X.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda v: loss(v, Y), (x,), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_agrees_with_pml(name, dtype):
    make, _, make_pml = CASES[name]
    ours, theirs = (dl.AngularLoss() if name == "angular" else make()), make_pml()
    x1 = X.to(dtype).clone().requires_grad_(True)
    x2 = X.to(dtype).clone().requires_grad_(True)
    for step in range(2 if name == "dynamic_soft_margin" else 1):  # the histogram's history too
        v1, v2 = ours(x1, Y), theirs(x2, Y)
        assert torch.allclose(v1, v2, rtol=1e-5 if dtype == torch.float32 else 1e-10, atol=1e-7), (step, v1, v2)
    if name != "dynamic_soft_margin":  # PML's DSM also differentiates its histogram
        v1.backward()
        v2.backward()
        assert torch.allclose(x1.grad, x2.grad, rtol=1e-4 if dtype == torch.float32 else 1e-8, atol=1e-6)


@pytest.mark.parametrize("name", ["angular", "nca"])
def test_reference_set_matches_the_equation_and_pml(name):
    make, reference, make_pml = CASES[name]
    value = make()(X, Y, ref_emb=REF, ref_labels=REF_Y)
    assert torch.allclose(value, reference(X, Y, refs=REF, ref_y=REF_Y), rtol=1e-9)
    pml_form = dl.AngularLoss() if name == "angular" else make()
    assert torch.allclose(pml_form(X, Y, ref_emb=REF, ref_labels=REF_Y), make_pml()(X, Y, ref_emb=REF, ref_labels=REF_Y))


def test_angular_default_is_pml_negatives_as_given():
    value = dl.AngularLoss()(X, Y)
    assert torch.allclose(value, angular_ref(X, Y, normalize_negatives=False), rtol=1e-9)
    assert not torch.allclose(value, angular_ref(X, Y))


def test_tcm_compares_with_the_reference_set():
    """PML indexes ref_emb pairs into the batch; dmlkit follows Eq. (5) on (batch, reference) pairs."""
    value = dl.ThresholdConsistentMarginLoss(1.0, 0.7, 0.9, 0.1)(X, Y, ref_emb=REF, ref_labels=REF_Y)
    assert torch.allclose(value, tcm_ref(X, Y, refs=REF, ref_y=REF_Y), rtol=1e-9)


@pytest.mark.parametrize("name", ["tuplet_margin", "intra_pair_variance", "tcm", "snr_contrastive", "angular"])
def test_mined_pairs_agree_with_pml(name):
    make, _, make_pml = CASES[name]
    a1, p = torch.tensor([0, 3, 5, 6]), torch.tensor([1, 4, 6, 7])
    a2, n = torch.tensor([0, 0, 3, 5, 9]), torch.tensor([3, 9, 0, 8, 1])
    tup = (a1, p, a2, n)
    ours = dl.AngularLoss() if name == "angular" else make()
    assert torch.allclose(ours(X, Y, tup), make_pml()(X, Y, tup), rtol=1e-9)


def test_nca_miner_weights_follow_pml():
    triplets = (torch.tensor([0, 0, 3]), torch.tensor([1, 2, 4]), torch.tensor([3, 5, 0]))
    assert torch.allclose(dl.NCALoss(softmax_scale=3.0)(X, Y, triplets), pml.NCALoss(softmax_scale=3.0)(X, Y, triplets))


def test_dynamic_soft_margin_descriptor_pairs_match_pml():
    anchors, matches = X[:4], REF[:6]  # unequal counts: PML's zero padding
    ours, theirs = dl.DynamicSoftMarginLoss(min_val=-3.0), pml.DynamicSoftMarginLoss(min_val=-3.0)
    for _ in range(3):
        assert torch.allclose(ours(anchors, ref_emb=matches), theirs(anchors, ref_emb=matches), rtol=1e-10)
    assert torch.allclose(ours.hist_, theirs.hist_, rtol=1e-10)
    assert "hist_" in ours.state_dict()


def test_dynamic_soft_margin_keeps_out_of_range_gaps_in_the_end_bins():
    loss = dl.DynamicSoftMarginLoss(min_val=-0.1, num_bins=4)
    value = loss(X, Y)  # gaps far outside [-0.1, 0.1]: PML indexes past its histogram here
    assert torch.isfinite(value) and torch.isclose(loss.hist_.sum(), torch.tensor(1.0, dtype=loss.hist_.dtype))


def test_dynamic_soft_margin_paper_histogram_option():
    paper = dl.DynamicSoftMarginLoss(normalize_batch_histogram=True)
    pml_form = dl.DynamicSoftMarginLoss()
    paper(X, Y), pml_form(X, Y)
    assert torch.allclose(paper.hist_, pml_form.hist_)  # the first batch is the whole history either way
    paper(X[:6], Y[:6]), pml_form(X[:6], Y[:6])
    assert not torch.allclose(paper.hist_, pml_form.hist_)


def test_no_positive_pairs_give_a_connected_zero():
    x = X[:5].clone().requires_grad_(True)
    for name, (make, _, _) in CASES.items():
        value = make()(x, torch.arange(5))
        value.backward()
        assert float(value.detach()) == 0.0 or name in ("snr_contrastive", "intra_pair_variance", "tcm", "instance"), name


@pytest.mark.parametrize("make,message", [
    (lambda: dl.AngularLoss(alpha=95), r"The 'alpha' parameter of AngularLoss must be"),
    (lambda: dl.TupletMarginLoss(scale=0), r"The 'scale' parameter of TupletMarginLoss must be"),
    (lambda: dl.NCALoss(softmax_scale=-1), r"The 'softmax_scale' parameter of NCALoss must be"),
    (lambda: dl.DynamicSoftMarginLoss(min_val=1.0), r"The 'min_val' parameter of DynamicSoftMarginLoss must be"),
    (lambda: dl.AngularLoss(distance=dl.CosineContrastiveLoss().distance), r"'distance' parameter of AngularLoss"),
])
def test_parameter_errors_use_the_template(make, message):
    with pytest.raises(InvalidParameterError, match=message):
        make()


def test_instance_loss_refuses_mined_pairs():
    with pytest.raises(InvalidParameterError, match="no mined pairs"):
        dl.InstanceLoss()(X, Y, (torch.tensor([0]), torch.tensor([1]), torch.tensor([3])))


@pytest.mark.parametrize("reduction", ["mean", "mean_nonzero", "sum"])
@pytest.mark.parametrize("make", [
    lambda r: dl.IntraPairVarianceLoss(0.01, 0.02, reduction=r),
    lambda r: dl.IntraPairVarianceLoss(0.3, 0.2, reduction=r, distance=dl.ContrastiveLoss().distance),
    lambda r: dl.NCALoss(softmax_scale=3.0, reduction=r),
    lambda r: dl.NCALoss(softmax_scale=3.0, reduction=r, distance=dl.TupletMarginLoss().distance),
])
def test_analytic_gradients_for_every_reduction_and_measure(make, reduction):
    loss = make(reduction)
    x = X[:8].clone().requires_grad_(True)
    refs = REF.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda v: loss(v, Y[:8]), (x,), eps=1e-6, atol=1e-6)
    assert torch.autograd.gradcheck(lambda v, r: loss(v, Y[:8], ref_emb=r, ref_labels=REF_Y), (x, refs), eps=1e-6, atol=1e-6)
    triplets = (torch.tensor([0, 0, 3]), torch.tensor([1, 2, 4]), torch.tensor([3, 5, 0]))
    assert torch.autograd.gradcheck(lambda v: loss(v, Y[:8], triplets), (x,), eps=1e-6, atol=1e-6)


def test_intra_pair_variance_on_a_distance_agrees_with_pml():
    from pytorch_metric_learning.distances import LpDistance

    ours = dl.IntraPairVarianceLoss(0.3, 0.2, distance=LpDistance())
    theirs = pml.IntraPairVarianceLoss(0.3, 0.2, distance=LpDistance())
    x1, x2 = X.clone().requires_grad_(True), X.clone().requires_grad_(True)
    v1, v2 = ours(x1, Y), theirs(x2, Y)
    v1.backward()
    v2.backward()
    assert torch.allclose(v1, v2, rtol=1e-10) and torch.allclose(x1.grad, x2.grad, rtol=1e-8, atol=1e-12)
