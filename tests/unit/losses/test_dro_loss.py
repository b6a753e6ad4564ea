"""DROLoss / DROKLGroupedLoss: values, gradients, and the DRO paper's recovery claims (float64)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dmlkit.exceptions import InvalidParameterError
from dmlkit.losses.base import LOSSES
from dmlkit.losses.dro import DROKLGroupedLoss, DROLoss
from dmlkit.mining import DROKLMiner, DROTopKMiner


def batch(seed: int, n: int = 12, dim: int = 5, classes: int = 3):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g, dtype=torch.float64, requires_grad=True)
    return x, torch.arange(n) % classes


def cosine(x: torch.Tensor) -> torch.Tensor:
    u = x / x.norm(dim=1, keepdim=True)
    return u @ u.T


def grad_of(fn, x: torch.Tensor) -> torch.Tensor:
    (g,) = torch.autograd.grad(fn(x), x)
    return g


def lifted_structure_reference(x, labels, lam):
    """DRO Eq. (8): sum_i [log sum_{P_i} e^{lam - S_ik} + log sum_{N_i} e^{S_ik - lam}]_+ (explicit loop)."""
    s = cosine(x)
    total = x.new_zeros(())
    for i in range(len(labels)):
        pos = [k for k in range(len(labels)) if k != i and labels[k] == labels[i]]
        neg = [k for k in range(len(labels)) if labels[k] != labels[i]]
        inner = torch.logsumexp(torch.stack([lam - s[i, k] for k in pos]), 0) + \
            torch.logsumexp(torch.stack([s[i, k] - lam for k in neg]), 0)
        assert inner > 0  # the hinge is active, as the recovery claim assumes
        total = total + inner.clamp_min(0)
    return total


def multi_similarity_reference(x, labels, alpha, beta, lam):
    """DRO Eq. (9) / MS Eq. (2): mean_i 1/alpha log(1 + sum_P e^{-alpha(S-lam)}) + 1/beta log(1 + sum_N e^{beta(S-lam)})."""
    s = cosine(x)
    total = x.new_zeros(())
    n = len(labels)
    for i in range(n):
        pos = sum(torch.exp(-alpha * (s[i, k] - lam)) for k in range(n) if k != i and labels[k] == labels[i])
        neg = sum(torch.exp(beta * (s[i, k] - lam)) for k in range(n) if labels[k] != labels[i])
        total = total + torch.log1p(pos) / alpha + torch.log1p(neg) / beta
    return total / n


def test_losses_are_registered():
    assert LOSSES.get("dro") is DROLoss and LOSSES.get("dro_kl_g") is DROKLGroupedLoss
    assert isinstance(LOSSES.create("dro", weighting="kl", gamma=0.5).weighting, DROKLMiner)


@pytest.mark.parametrize("seed", [0, 1])
def test_kl_g_with_gamma_one_recovers_lifted_structure_gradient(seed):
    """DRO Sec. 3.3 / Eq. (19)-(22): margin base, gamma = 1, all hinges active -> LS gradient."""
    x, labels = batch(seed)
    lam, m = 0.5, 2.0  # m large enough that l_ij > 0 for every pair
    loss = DROKLGroupedLoss(gamma_pos=1.0, gamma_neg=1.0, margin=m, threshold=lam)
    ours = grad_of(lambda e: loss(e, labels), x)
    ref = grad_of(lambda e: lifted_structure_reference(e, labels, lam), x)
    # Eq. (7) sums over anchors; DROKLGroupedLoss averages over the B anchors.
    assert torch.allclose(ours * len(labels), ref, rtol=1e-9, atol=1e-12)
    assert ref.abs().max() > 1e-3


@pytest.mark.parametrize("alpha, beta, lam", [(2.0, 50.0, 0.5), (1.0, 10.0, 0.2)])
def test_kl_g_with_pseudo_pairs_recovers_multi_similarity_gradient(alpha, beta, lam):
    """DRO Sec. 6.1.2 / Eq. (25)-(27): pseudo pairs with c+ = c- = lambda, gamma+ = 1/alpha, gamma- = 1/beta."""
    x, labels = batch(2, n=14, classes=4)
    loss = DROKLGroupedLoss(gamma_pos=1 / alpha, gamma_neg=1 / beta, pseudo_pairs=True,
                            pos_offset=lam, neg_offset=lam, margin=3.0, threshold=lam)
    ours = grad_of(lambda e: loss(e, labels), x)
    ref = grad_of(lambda e: multi_similarity_reference(e, labels, alpha, beta, lam), x)
    assert torch.allclose(ours, ref, rtol=1e-9, atol=1e-12)
    assert ref.abs().max() > 1e-4


def grouped_robust_objective(x, labels, gp, gn, l0p, l0n, m, lam, pseudo):
    """Eq. (7)/(23) at the optimum: (1/B) sum_i gamma log(sum e^{l/gamma} (+ e^{l0/gamma})) per sign (+const)."""
    s = cosine(x)
    n = len(labels)
    total = x.new_zeros(())
    for i in range(n):
        for sign, gamma, l0 in ((True, gp, l0p), (False, gn, l0n)):
            terms = []
            for k in range(n):
                if k == i or bool(labels[k] == labels[i]) != sign:
                    continue
                loss = (m + (lam - s[i, k] if sign else s[i, k] - lam)).clamp_min(0)
                terms.append(loss / gamma)
            if pseudo:
                terms.append(x.new_tensor(l0 / gamma))
            if terms:
                total = total + gamma * torch.logsumexp(torch.stack(terms), 0)
    return total / n


@pytest.mark.parametrize("pseudo", [False, True])
def test_kl_g_gradient_is_the_envelope_gradient_of_the_robust_objective(pseudo):
    """Lemma 1: grad F = sum p* grad l, where F is the optimal value of the KL-regularised problem."""
    x, labels = batch(3)
    gp, gn, m, lam = 0.3, 0.1, 0.2, 0.5
    loss = DROKLGroupedLoss(gamma_pos=gp, gamma_neg=gn, pseudo_pairs=pseudo, margin=m, threshold=lam,
                            pos_offset=0.6, neg_offset=0.4)
    l0p, l0n = loss.weighting.pseudo_losses()
    ours = grad_of(lambda e: loss(e, labels), x)
    ref = grad_of(lambda e: grouped_robust_objective(e, labels, gp, gn, l0p, l0n, m, lam, pseudo), x)
    assert torch.allclose(ours, ref, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("base", ["margin", "binomial"])
def test_kl_gradient_is_the_envelope_gradient_of_log_sum_exp(base):
    """DRO-KL: F = gamma log mean exp(l/gamma) has gradient sum softmax(l/gamma) grad l."""
    x, labels = batch(4)
    gamma = 0.25
    loss = DROLoss("kl", base=base, gamma=gamma)

    def robust(e):
        same = labels[:, None] == labels[None, :]
        losses = loss.weighting.pair_loss(cosine(e), same)
        valid = ~torch.eye(len(labels), dtype=torch.bool)
        return gamma * torch.logsumexp(losses[valid] / gamma, 0)

    assert torch.allclose(grad_of(lambda e: loss(e, labels), x), grad_of(robust, x), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("weighting, params", [("top_k", {"k": 9}), ("top_k_pn", {"k_pos": 4, "k_neg": 6})])
@pytest.mark.parametrize("base", ["margin", "binomial"])
def test_top_k_losses_pass_gradcheck(weighting, params, base):
    x, labels = batch(5, n=9)
    loss = DROLoss(weighting, base=base, **params)
    assert torch.autograd.gradcheck(lambda e: loss(e, labels), (x,), eps=1e-6, atol=1e-6)


def test_top_k_value_is_mean_of_top_k_pair_losses():
    x, labels = batch(6)
    loss = DROLoss("top_k", k=10)
    same = labels[:, None] == labels[None, :]
    losses = loss.weighting.pair_loss(cosine(x), same)[~torch.eye(12, dtype=torch.bool)]
    assert torch.isclose(loss(x, labels), losses.topk(10).values.mean(), rtol=1e-12)


def test_sampled_kl_value_matches_its_weights():
    x, labels = batch(7)
    miner = DROKLMiner(gamma=1.0, sample=True, num_samples=50, seed=2)
    loss = DROLoss(DROKLMiner(gamma=1.0, sample=True, num_samples=50, seed=2))
    sel = miner(x, labels)
    terms = miner.pair_loss(cosine(x), labels[:, None] == labels[None, :])
    expected = ((sel.positive_weight + sel.negative_weight) * terms).sum()
    assert torch.isclose(loss(x, labels), expected, rtol=1e-12)


def test_reference_set_gradients_reach_only_the_batch():
    x, labels = batch(8, n=6)
    mem = torch.randn(10, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    mem_labels = torch.arange(10) % 3
    loss = DROLoss("kl", gamma=0.5)
    value = loss(x, labels, ref_emb=mem, ref_labels=mem_labels)
    value.backward()
    assert value > 0 and x.grad.abs().sum() > 0


@pytest.mark.parametrize("labels", [torch.zeros(5, dtype=torch.long), torch.arange(5), torch.tensor([1])])
@pytest.mark.parametrize("make", [lambda: DROLoss(), lambda: DROLoss("kl"), lambda: DROKLGroupedLoss(pseudo_pairs=True)])
def test_degenerate_batches_give_a_connected_zero(labels, make):
    x = torch.randn(len(labels), 4, requires_grad=True)
    value = make()(x, labels)
    value.backward()
    assert value.item() == 0.0 and torch.equal(x.grad, torch.zeros_like(x))


def test_half_precision_inputs_are_accumulated_in_fp32():
    x = torch.randn(12, 6).half()
    value = DROLoss("kl", gamma=0.5)(x, torch.arange(12) % 3)
    assert value.dtype == torch.float16 and torch.isfinite(value)  # the fp32 loss, rounded once
    assert value == DROLoss("kl", gamma=0.5)(x.float(), torch.arange(12) % 3).half()


def test_constructor_errors():
    with pytest.raises(InvalidParameterError, match="'weighting' parameter of DROLoss must be one of"):
        DROLoss("topk")
    with pytest.raises(InvalidParameterError, match="disagrees with the weighting's base"):
        DROLoss(DROTopKMiner(base="margin"), base="binomial")
    with pytest.raises(InvalidParameterError, match=r"extra parameters \['k'\]"):
        DROLoss(DROTopKMiner(), k=3)
    with pytest.raises(InvalidParameterError, match="The 'gamma_pos' parameter of DROKLGroupedMiner must be a float > 0"):
        DROKLGroupedLoss(gamma_pos=-1.0)


@settings(deadline=None, max_examples=10)
@given(seed=st.integers(0, 1000), weighting=st.sampled_from(["top_k", "top_k_pn", "kl", "kl_grouped"]),
       base=st.sampled_from(["margin", "binomial"]))
def test_loss_is_finite_nonnegative_and_invariant_to_order_and_relabelling(seed, weighting, base):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(10, 4, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 3, (10,), generator=g)
    loss = DROLoss(weighting, base=base)
    value = loss(x, labels)
    assert torch.isfinite(value) and value >= 0
    perm = torch.randperm(10, generator=g)
    assert torch.isclose(loss(x[perm], labels[perm]), value, rtol=1e-9, atol=1e-12)
    assert torch.isclose(loss(x, (labels * 7 + 100)), value, rtol=1e-12, atol=1e-12)
