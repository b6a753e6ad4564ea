"""Classification-style losses (ArcFace, sub-centre ArcFace, CosFace, SphereFace, L-Softmax, normalised
softmax, P2SGrad): float64 loops transcribed from each paper's equation, gradcheck, PML on the same weights."""

import math

import pytest
import torch

from dmlkit.exceptions import DataError, InvalidParameterError
from dmlkit.losses import (
    ArcFaceLoss,
    CosFaceLoss,
    LargeMarginSoftmaxLoss,
    NormalizedSoftmaxLoss,
    P2SGradLoss,
    SphereFaceLoss,
    SubCenterArcFaceLoss,
)

C, D, B = 5, 4, 7


def batch(seed, dtype=torch.float64, classes=C, rows=B, dim=D):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, dim, generator=g, dtype=dtype)
    return x, torch.randint(0, classes, (rows,), generator=g)


def unit(v):
    return v / torch.sqrt((v * v).sum())


def cross_entropy(logits, target):
    """``log sum_j exp(f_j) - f_y`` of a python list of logits (a scalar tensor)."""
    top = max(float(f.detach()) for f in logits)
    return top + torch.log(sum(torch.exp(f - top) for f in logits)) - logits[target]


# ----------------------------------------------------------------------------- paper transcriptions
def arcface_reference(x, W, y, margin_deg, scale, K=1, monotonic=True):
    """ArcFace Eq. (3) (Sub-center ArcFace Eq. (1)-(2) with K > 1), one sample and one class at a time."""
    m = math.radians(margin_deg)
    total = 0.0
    for i in range(len(x)):
        xi = unit(x[i])
        logits = []
        for j in range(W.shape[1] // K):
            cos = max((xi * unit(W[:, j * K + k])).sum() for k in range(K))
            if j == y[i]:
                theta = torch.acos(cos.clamp(-1, 1))
                if not monotonic or theta <= math.pi - m:
                    cos = torch.cos(theta + m)
                else:
                    cos = cos - m * math.sin(m)
            logits.append(scale * cos)
        total = total + cross_entropy(logits, int(y[i]))
    return total / len(x)


def cosface_reference(x, W, y, margin, scale):
    """CosFace Eq. (4)."""
    total = 0.0
    for i in range(len(x)):
        logits = [scale * ((unit(x[i]) * unit(W[:, j])).sum() - (margin if j == y[i] else 0.0))
                  for j in range(W.shape[1])]
        total = total + cross_entropy(logits, int(y[i]))
    return total / len(x)


def normalized_softmax_reference(x, W, y, temperature, normalize_embeddings=True):
    """Zhai & Wu Eq. (1)-(2): softmax over <x, w_j / |w_j|> / T (x normalised by default)."""
    total = 0.0
    for i in range(len(x)):
        xi = unit(x[i]) if normalize_embeddings else x[i]
        logits = [(xi * unit(W[:, j])).sum() / temperature for j in range(W.shape[1])]
        total = total + cross_entropy(logits, int(y[i]))
    return total / len(x)


def large_margin_reference(x, W, y, margin, scale, weight_norms=True):
    """L-Softmax Eq. (4)-(6) (SphereFace Eq. (7)-(8): weight_norms=False): psi(theta) = (-1)^k cos(m theta) - 2k."""
    total = 0.0
    for i in range(len(x)):
        norm_x = torch.sqrt((x[i] * x[i]).sum())
        logits = []
        for j in range(W.shape[1]):
            norm_w = torch.sqrt((W[:, j] * W[:, j]).sum()) if weight_norms else 1.0
            cos = (unit(x[i]) * unit(W[:, j])).sum()
            if j == y[i]:
                theta = torch.acos(cos.clamp(-1, 1))
                k = math.floor(float(theta.detach()) / (math.pi / margin))
                cos = (-1) ** k * torch.cos(margin * theta) - 2 * k
            logits.append(scale * norm_w * norm_x * cos)
        total = total + cross_entropy(logits, int(y[i]))
    return total / len(x)


def p2sgrad_reference(x, W, y, paper=False):
    """P2SGrad: sum_j (cos_ij - [j = y_i])^2, averaged over B*C (PML) or halved and averaged over B (Eq. (11))."""
    total = 0.0
    for i in range(len(x)):
        for j in range(W.shape[1]):
            w = unit(W[:, j]) if paper else W[:, j]
            cos = (unit(x[i]) * w).sum()
            total = total + (cos - (1.0 if j == y[i] else 0.0)) ** 2
    return total / (2 * len(x)) if paper else total / (len(x) * W.shape[1])


CASES = {
    "arcface": (lambda: ArcFaceLoss(C, D, margin=28.6, scale=4),
                lambda x, W, y: arcface_reference(x, W, y, 28.6, 4)),
    "arcface-paper": (lambda: ArcFaceLoss(C, D, margin=60, scale=4, monotonic=False),
                      lambda x, W, y: arcface_reference(x, W, y, 60, 4, monotonic=False)),
    "arcface-monotonic-tail": (lambda: ArcFaceLoss(C, D, margin=60, scale=4),
                               lambda x, W, y: arcface_reference(x, W, y, 60, 4)),
    "subcenter": (lambda: SubCenterArcFaceLoss(C, D, margin=20, scale=3, sub_centers=3),
                  lambda x, W, y: arcface_reference(x, W, y, 20, 3, K=3)),
    "cosface": (lambda: CosFaceLoss(C, D, margin=0.35, scale=5), lambda x, W, y: cosface_reference(x, W, y, 0.35, 5)),
    "normalized_softmax": (lambda: NormalizedSoftmaxLoss(C, D, temperature=0.2),
                           lambda x, W, y: normalized_softmax_reference(x, W, y, 0.2)),
    "large_margin": (lambda: LargeMarginSoftmaxLoss(C, D, margin=4, scale=0.5),
                     lambda x, W, y: large_margin_reference(x, W, y, 4, 0.5)),
    "sphereface": (lambda: SphereFaceLoss(C, D, margin=3, scale=1.5),
                   lambda x, W, y: large_margin_reference(x, W, y, 3, 1.5, weight_norms=False)),
    "p2sgrad": (lambda: P2SGradLoss(D, C), lambda x, W, y: p2sgrad_reference(x, W, y)),
    "p2sgrad-paper": (lambda: P2SGradLoss(D, C, paper_gradient=True),
                      lambda x, W, y: p2sgrad_reference(x, W, y, paper=True)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_value_and_gradients_match_the_paper_loop(name):
    make, reference = CASES[name]
    loss = make().double()
    x, y = batch(1)
    x.requires_grad_(True)
    value = loss(x, y)
    grads = torch.autograd.grad(value, (x, loss.W))
    W = loss.W.detach().clone().requires_grad_(True)
    x_ref = x.detach().clone().requires_grad_(True)
    expected = reference(x_ref, W, y)
    expected_grads = torch.autograd.grad(expected, (x_ref, W))
    assert value.item() == pytest.approx(expected.item(), rel=1e-10)
    if name == "p2sgrad":  # PML's W gradient skips the unit-norm projection; x's is the loop's
        torch.testing.assert_close(grads[0], expected_grads[0], rtol=1e-9, atol=1e-12)
        return
    torch.testing.assert_close(grads[0], expected_grads[0], rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(grads[1], expected_grads[1], rtol=1e-9, atol=1e-12)


def test_arcface_cases_reach_both_branches():
    """The monotonic-tail case has targets past pi - m, the others none, so each branch is exercised."""
    x, y = batch(1)
    loss = ArcFaceLoss(C, D, margin=60).double()
    theta = torch.acos(loss.cosine_logits(x).gather(1, y[:, None]))
    assert (theta > math.pi - math.radians(60)).any() and (theta <= math.pi - math.radians(60)).any()


@pytest.mark.parametrize("name", list(CASES))
def test_gradcheck(name):
    make, _ = CASES[name]
    loss = make().double()
    x, y = batch(2)
    x.requires_grad_(True)
    if name == "p2sgrad":  # W is projected in place at every call: a fresh copy each time, x only
        W = loss.W.detach()
        assert torch.autograd.gradcheck(lambda e: torch.func.functional_call(loss, {"bank.weight": W.clone()}, (e, y)),
                                        (x,))
        return
    W = loss.W.detach().clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda e, w: torch.func.functional_call(loss, {"bank.weight": w}, (e, y)), (x, W))


# ----------------------------------------------------------------------------- PML on the same weights
def pml_pair(name):
    from pytorch_metric_learning import losses as pml

    return {
        "arcface": (ArcFaceLoss(10, 16), pml.ArcFaceLoss(10, 16)),
        "subcenter": (SubCenterArcFaceLoss(10, 16, sub_centers=4),
                      pml.SubCenterArcFaceLoss(num_classes=10, embedding_size=16, sub_centers=4)),
        "cosface": (CosFaceLoss(10, 16, margin=0.2, scale=30), pml.CosFaceLoss(10, 16, margin=0.2, scale=30)),
        "normalized_softmax": (NormalizedSoftmaxLoss(10, 16), pml.NormalizedSoftmaxLoss(10, 16)),
        "large_margin": (LargeMarginSoftmaxLoss(10, 16, margin=3), pml.LargeMarginSoftmaxLoss(10, 16, margin=3)),
        "sphereface": (SphereFaceLoss(10, 16, scale=2), pml.SphereFaceLoss(10, 16, scale=2)),
        "p2sgrad": (P2SGradLoss(16, 10), pml.P2SGradLoss(16, 10)),
    }[name]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", ["arcface", "subcenter", "cosface", "normalized_softmax", "large_margin",
                                  "sphereface", "p2sgrad"])
def test_matches_pml(name, dtype):
    ours, theirs = pml_pair(name)
    pml_weight = theirs.weight if name == "p2sgrad" else theirs.W
    with torch.no_grad():
        ours.W.copy_(pml_weight)
    x, y = batch(3, dtype, classes=10, rows=32, dim=16)
    x = (x * 3).requires_grad_(True)
    a, b = ours(x, y), theirs(x, y)
    ga = torch.autograd.grad(a, (x, ours.W))
    gb = torch.autograd.grad(b, (x, pml_weight))
    # (PML projects P2SGrad's float32 weights before casting them to float64; dmlkit after)
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 or name == "p2sgrad" else dict(rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(a, b.to(a.dtype), **tol)
    torch.testing.assert_close(ga[0], gb[0], **tol)
    torch.testing.assert_close(ga[1], gb[1].to(ga[1].dtype), **tol)
    if name != "p2sgrad":
        torch.testing.assert_close(ours.get_logits(x), theirs.get_logits(x), **tol)


@pytest.mark.parametrize("name", ["large_margin", "sphereface"])
def test_multiplicative_margin_with_a_zero_embedding_matches_pml(name):
    """The logits are the plain product x . W and the target's cosine is recovered from the norms:
    a zero row (no direction) has zero logits and a finite gradient, as in PML."""
    ours, theirs = pml_pair(name)
    with torch.no_grad():
        ours.W.copy_(theirs.W)
    x, y = batch(4, torch.float64, classes=10, rows=12, dim=16)
    x[0] = 0.0
    x.requires_grad_(True)
    a, b = ours(x, y), theirs(x, y)
    ga, gb = torch.autograd.grad(a, x)[0], torch.autograd.grad(b, x)[0]
    assert torch.isfinite(a) and torch.isfinite(ga).all()
    torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(ga[1:], gb[1:], rtol=1e-9, atol=1e-11)


def test_miner_output_weights_samples_as_pml():
    from pytorch_metric_learning.losses import CosFaceLoss as PMLCosFace

    from dmlkit.mining import TripletSelection

    x, y = batch(4, torch.float32, classes=4, rows=24, dim=8)
    ours, theirs = CosFaceLoss(4, 8), PMLCosFace(4, 8)
    with torch.no_grad():
        ours.W.copy_(theirs.W)
    mined = (torch.tensor([0, 0, 3, 5]), torch.tensor([1, 2, 4, 6]), torch.tensor([7, 7, 7, 0]))  # unequal counts
    torch.testing.assert_close(ours(x, y, mined), theirs(x, y, mined), rtol=1e-5, atol=1e-6)
    assert ours(x, y, mined).item() != pytest.approx(ours(x, y).item(), rel=1e-3)
    selection = TripletSelection(*mined)  # dmlkit's miners' output is read the same way
    assert ours(x, y, selection).item() == ours(x, y, mined).item()


def test_subcenter_outliers_match_a_loop():
    g = torch.Generator().manual_seed(5)
    loss = SubCenterArcFaceLoss(num_classes=4, embedding_size=6, sub_centers=3)
    x, y = torch.randn(40, 6, generator=g), torch.randint(0, 3, (40,), generator=g)  # class 3 absent
    outliers, centers = loss.get_outliers(x, y, threshold=70)
    W = loss.W.detach()
    expected, expected_centers = [], torch.zeros(6, 4)
    for c in range(4):
        members = [i for i in range(40) if y[i] == c]
        if not members:
            continue
        votes = [0, 0, 0]
        for i in members:
            votes[max(range(3), key=lambda k: float(unit(x[i]) @ unit(W[:, c * 3 + k])))] += 1
        best = votes.index(max(votes))
        expected_centers[:, c] = W[:, c * 3 + best]
        expected += [i for i in members if float(unit(x[i]) @ unit(W[:, c * 3 + best])) < math.cos(math.radians(70))]
    assert outliers.tolist() == expected and 0 < len(expected) < 40
    torch.testing.assert_close(centers, expected_centers)
    assert loss.get_outliers(x, y, threshold=180, return_dominant_centers=False).numel() == 0


# ----------------------------------------------------------------------------- PML's layout and call
def test_W_is_the_leaf_parameter_in_pml_layout():
    loss = SubCenterArcFaceLoss(num_classes=6, embedding_size=5, sub_centers=2)
    assert isinstance(loss.W, torch.nn.Parameter) and loss.W.shape == (5, 12)
    assert [n for n, _ in loss.named_parameters()] == ["bank.weight"]
    torch.testing.assert_close(loss.proxies, loss.W.T)  # the bank's class-major view
    x, y = batch(6, torch.float32, classes=6, rows=8, dim=5)
    loss(x, y).backward()
    assert loss.W.grad.shape == (5, 12) and loss.W.grad.is_contiguous() and loss.W.grad.abs().sum() > 0
    other = ArcFaceLoss(6, 5)
    shared = torch.nn.Parameter(torch.randn(5, 6))
    other.W = shared
    assert other.W is shared  # assignment shares, as in PML
    with pytest.raises(DataError, match=r"W must be a float tensor of shape \[5, 6\]"):
        other.W = torch.randn(6, 5)


def test_pml_checkpoint_loads():
    from pytorch_metric_learning.losses import ArcFaceLoss as PMLArcFace

    theirs = PMLArcFace(7, 3)
    ours = ArcFaceLoss(7, 3)
    ours.load_state_dict(theirs.state_dict())
    torch.testing.assert_close(ours.W.detach(), theirs.W.detach())


def test_calls_pml_refuses():
    loss = ArcFaceLoss(4, 3)
    x, y = batch(7, torch.float32, classes=4, rows=6, dim=3)
    with pytest.raises(ValueError, match="needs labels"):
        loss(x)
    with pytest.raises(ValueError, match="takes no ref_emb"):
        loss(x, y, ref_emb=x.clone())
    assert loss(x, y, ref_emb=x, ref_labels=y).item() == loss(x, y).item()
    with pytest.raises(ValueError, match="takes no indices_tuple"):
        P2SGradLoss(3, 4)(x, y, (torch.tensor([0]), torch.tensor([1]), torch.tensor([2])))
    with pytest.raises(DataError, match=r"labels must lie in \[0, 4\)"):
        loss(x, y + 4)


@pytest.mark.parametrize("make,message", [
    (lambda: ArcFaceLoss(3, 4, scale=0), r"The 'scale' parameter of ArcFaceLoss must be a float > 0\. Got 0"),
    (lambda: SubCenterArcFaceLoss(3, 4, sub_centers=0), r"'sub_centers' parameter of SubCenterArcFaceLoss must be an int >= 1"),
    (lambda: CosFaceLoss(3, 4, chunk_size=0), r"'chunk_size' parameter of CosFaceLoss must be an int >= 1"),
    (lambda: CosFaceLoss(3, 4, sample_rate=0), r"'sample_rate' parameter of CosFaceLoss must be a float in the range \(0, 1\]"),
    (lambda: NormalizedSoftmaxLoss(3, 4, temperature=-1), r"'temperature' parameter of NormalizedSoftmaxLoss must be a float > 0"),
    (lambda: LargeMarginSoftmaxLoss(3, 4, margin=0), r"'margin' parameter of LargeMarginSoftmaxLoss must be a float >= 1"),
    (lambda: P2SGradLoss(num_classes=3), r"P2SGradLoss needs num_classes and one of descriptors_dim"),
    (lambda: ArcFaceLoss(3, 4, weight_init_func=3), r"'weight_init_func' parameter of ArcFaceLoss must be a callable"),
])
def test_parameter_validation(make, message):
    with pytest.raises(InvalidParameterError, match=message):
        make()


def test_weight_init_func_sees_pml_layout():
    seen = []
    loss = CosFaceLoss(6, 3, weight_init_func=lambda w: (seen.append(tuple(w.shape)), torch.nn.init.ones_(w)))
    assert seen == [(3, 6)] and bool((loss.W == 1).all())


# ----------------------------------------------------------------------------- configs and the trainer
@pytest.mark.parametrize("name", ["arcface", "subcenter_arcface", "cosface", "sphereface", "large_margin_softmax",
                                  "normalized_softmax", "p2sgrad"])
def test_config_builds_the_loss_and_its_weights_get_the_loss_group(name):
    from dmlkit.config import load_config
    from dmlkit.engine.objective import build_objective
    from dmlkit.engine.optim import parameter_groups

    cfg = load_config(overrides=[f"loss.name={name}", "model.embedding_size=8", "optimizer.lr=0.001",
                                 "optimizer.loss_lr_multiplier=100"])
    cfg.loss.args = {}
    objective = build_objective(cfg, num_classes=6)
    loss = objective.loss
    assert loss.W.shape[0] == 8 and loss.num_classes == 6
    groups = parameter_groups(torch.nn.Linear(4, 8), loss, cfg.optimizer)
    (group,) = [g for g in groups if g["name"] == "loss"]
    assert group["params"] == [loss.W]
    assert group["lr"] == pytest.approx(cfg.optimizer.lr * cfg.optimizer.loss_lr_multiplier)


def test_bank_rules_work_through_the_feature_major_view():
    """Initialising from samples and overwriting per class write into ``W`` through the class-major view."""
    loss = SubCenterArcFaceLoss(num_classes=3, embedding_size=4, sub_centers=2)
    x = torch.randn(12, 4, generator=torch.Generator().manual_seed(8))
    y = torch.arange(12) % 3
    assert loss.init_proxies_from(x, y).all()
    for c in range(3):
        for k in range(2):
            column = loss.W[:, c * 2 + k].detach()
            assert any(torch.equal(column, x[i]) for i in range(12) if y[i] == c)
    centers = torch.randn(3, 2, 4)
    loss.bank.set_proxies(centers)
    torch.testing.assert_close(loss.W.detach(), centers.reshape(6, 4).T)
    assert loss.bank.parameter is loss.W
    loss.double()
    assert loss.W.dtype == torch.float64 and loss.proxies.dtype == torch.float64


@pytest.mark.parametrize("factor", [1e30, 1e-30])
def test_cosine_losses_ignore_the_embeddings_scale_even_at_float32_extremes(factor):
    x, y = batch(9, torch.float32)
    for loss in (ArcFaceLoss(C, D), CosFaceLoss(C, D), P2SGradLoss(D, C)):
        assert loss(x * factor, y).item() == pytest.approx(loss(x, y).item(), rel=1e-5)
