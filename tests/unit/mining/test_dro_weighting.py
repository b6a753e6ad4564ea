"""DRO pair weights against float64 transcriptions of the DRO paper's closed forms."""

from __future__ import annotations

import math

import pytest
import torch

from dmlkit.mining import DROKLGroupedMiner, DROKLMiner, DROPairLoss, DROTopKMiner, DROTopKPNMiner


def batch(seed: int, n: int = 16, dim: int = 5, classes: int = 4):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, dim, generator=g, dtype=torch.float64), torch.arange(n) % classes


def loop_pairs(x, labels, base="margin", m=0.2, lam=0.5, alpha=2.0, beta=50.0):
    """``{(i, j): (is_positive, l_ij)}`` for every ordered pair i != j, by the paper's formulas."""
    out = {}
    n = len(labels)
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            s = float(x[i] @ x[j] / (x[i].norm() * x[j].norm()))
            pos = bool(labels[i] == labels[j])
            if base == "margin":
                y = 1.0 if pos else -1.0
                loss = max(0.0, m + y * (lam - s))
            elif pos:
                loss = math.log1p(math.exp(-alpha * (s - lam))) / alpha
            else:
                loss = math.log1p(math.exp(beta * (s - lam))) / beta
            out[(i, j)] = (pos, loss)
    return out


def weighted_sum(sel, pairs):
    total = 0.0
    for (i, j), (_, loss) in pairs.items():
        total += float(sel.positive_weight[i, j] + sel.negative_weight[i, j]) * loss
    return total


@pytest.mark.parametrize("base", ["margin", "binomial"])
def test_pair_loss_matches_formula(base):
    x, labels = batch(0)
    pairs = loop_pairs(x, labels, base)
    sim = torch.nn.functional.normalize(x) @ torch.nn.functional.normalize(x).T
    same = labels[:, None] == labels[None, :]
    losses = DROPairLoss(base)(sim, same)
    for (i, j), (_, loss) in pairs.items():
        assert math.isclose(float(losses[i, j]), loss, rel_tol=1e-12, abs_tol=1e-12)


@pytest.mark.parametrize("k", [1, 7, 40, 10_000])
@pytest.mark.parametrize("base", ["margin", "binomial"])
def test_top_k_objective_is_mean_of_top_k_losses(k, base):
    x, labels = batch(1)
    pairs = loop_pairs(x, labels, base)
    sel = DROTopKMiner(k=k, base=base)(x, labels)
    ranked = sorted((loss for _, loss in pairs.values()), reverse=True)
    k_eff = min(k, len(ranked))
    assert math.isclose(weighted_sum(sel, pairs), sum(ranked[:k_eff]) / k_eff, rel_tol=1e-10)
    assert sel.num_pairs == k_eff
    total = sel.positive_weight.sum() + sel.negative_weight.sum()
    assert math.isclose(float(total), 1.0, rel_tol=1e-12)  # one simplex per mini-batch
    chosen = sel.positive | sel.negative
    assert torch.allclose((sel.positive_weight + sel.negative_weight)[chosen], torch.full((k_eff,), 1 / k_eff, dtype=torch.float64))


@pytest.mark.parametrize("k_pos, k_neg", [(5, 5), (3, 30), (100, 1000)])
def test_top_k_pn_selects_hardest_of_each_sign(k_pos, k_neg):
    x, labels = batch(2)
    pairs = loop_pairs(x, labels)
    sel = DROTopKPNMiner(k_pos=k_pos, k_neg=k_neg)(x, labels)
    pos = sorted((loss for p, loss in pairs.values() if p), reverse=True)
    neg = sorted((loss for p, loss in pairs.values() if not p), reverse=True)
    kp, kn = min(k_pos, len(pos)), min(k_neg, len(neg))
    assert int(sel.positive.sum()) == kp and int(sel.negative.sum()) == kn
    expected = (sum(pos[:kp]) + sum(neg[:kn])) / (kp + kn)
    assert math.isclose(weighted_sum(sel, pairs), expected, rel_tol=1e-10)
    chosen_pos = sorted((pairs[tuple(ij)][1] for ij in sel.positive.nonzero().tolist()), reverse=True)
    assert chosen_pos == pytest.approx(pos[:kp])


@pytest.mark.parametrize("gamma", [0.05, 0.5, 3.0])
@pytest.mark.parametrize("base", ["margin", "binomial"])
def test_kl_weights_are_softmax_of_losses_over_gamma(gamma, base):
    x, labels = batch(3)
    pairs = loop_pairs(x, labels, base)
    sel = DROKLMiner(gamma=gamma, base=base)(x, labels)
    top = max(loss for _, loss in pairs.values())
    z = sum(math.exp((loss - top) / gamma) for _, loss in pairs.values())
    for (i, j), (pos, loss) in pairs.items():
        expected = math.exp((loss - top) / gamma) / z
        got = sel.positive_weight[i, j] if pos else sel.negative_weight[i, j]
        assert math.isclose(float(got), expected, rel_tol=1e-9, abs_tol=1e-300)
    assert not sel.positive_weight.diagonal().any()


def test_kl_weights_maximise_the_regularised_objective():
    """p* solves max_p sum p l - gamma KL(p || uniform) on the simplex (DRO-KL)."""
    x, labels = batch(4)
    gamma = 0.3
    miner = DROKLMiner(gamma=gamma)
    sel = miner(x, labels)
    sim = torch.nn.functional.normalize(x) @ torch.nn.functional.normalize(x).T
    same = labels[:, None] == labels[None, :]
    valid = ~torch.eye(16, dtype=torch.bool)
    losses = miner.pair_loss(sim, same)[valid]
    p_star = (sel.positive_weight + sel.negative_weight)[valid]
    n = losses.numel()

    def objective(p):
        return float((p * losses).sum() - gamma * (p * (p * n).log()).sum())

    best = objective(p_star)
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        q = (p_star.log() + 0.3 * torch.randn(n, generator=g, dtype=torch.float64)).softmax(0)
        assert objective(q) <= best + 1e-12


def test_kl_ignore_zero_losses_renormalises_over_active_pairs():
    x, labels = batch(5)
    pairs = loop_pairs(x, labels)
    sel = DROKLMiner(gamma=0.5, ignore_zero_losses=True)(x, labels)
    active = {ij: loss for ij, (_, loss) in pairs.items() if loss > 0}
    assert len(active) < len(pairs)
    z = sum(math.exp(v / 0.5) for v in active.values())
    for ij, (pos, loss) in pairs.items():
        got = float((sel.positive_weight if pos else sel.negative_weight)[ij])
        assert math.isclose(got, math.exp(loss / 0.5) / z if loss > 0 else 0.0, rel_tol=1e-9)


def test_kl_sampling_draws_pairs_according_to_p_star():
    x, labels = batch(6)
    exact = DROKLMiner(gamma=1.0)(x, labels)
    sampled = DROKLMiner(gamma=1.0, sample=True, num_samples=200_000, seed=1)(x, labels)
    p = exact.positive_weight + exact.negative_weight
    q = sampled.positive_weight + sampled.negative_weight
    assert math.isclose(float(q.sum()), 1.0, rel_tol=1e-12)
    assert torch.allclose(q * 200_000, (q * 200_000).round(), atol=1e-6)  # counts / num_samples
    assert (q - p).abs().max() < 5e-3
    small = DROKLMiner(gamma=1.0, sample=True, seed=1)(x, labels)
    assert float((small.positive_weight + small.negative_weight).sum()) == pytest.approx(1.0)
    assert small.num_pairs <= 2 * 16  # default num_samples = 2 B


@pytest.mark.parametrize("pseudo", [False, True])
def test_kl_grouped_weights_are_per_anchor_softmaxes(pseudo):
    x, labels = batch(7, n=12, classes=3)
    gp, gn, m, lam = 0.4, 0.2, 0.2, 0.5
    pairs = loop_pairs(x, labels, m=m, lam=lam)
    sel = DROKLGroupedMiner(gamma_pos=gp, gamma_neg=gn, pseudo_pairs=pseudo, margin=m, threshold=lam)(x, labels)
    n = len(labels)
    for i in range(n):
        for sign, gamma, w in ((True, gp, sel.positive_weight), (False, gn, sel.negative_weight)):
            group = {j: loss for (a, j), (pos, loss) in pairs.items() if a == i and pos == sign}
            # default offsets c+ = lambda + m, c- = lambda - m give pseudo pairs of zero margin loss
            z = sum(math.exp(v / gamma) for v in group.values()) + (1.0 if pseudo else 0.0)
            for j, loss in group.items():
                assert math.isclose(float(w[i, j]), math.exp(loss / gamma) / z / n, rel_tol=1e-9)
            row_total = float(w[i].sum()) * n
            assert (row_total < 1.0) if pseudo else math.isclose(row_total, 1.0, rel_tol=1e-12)


def test_kl_grouped_offsets_set_the_pseudo_pair_loss():
    miner = DROKLGroupedMiner(pseudo_pairs=True, margin=2.0, threshold=0.5, pos_offset=0.3, neg_offset=0.7)
    l_pos, l_neg = miner.pseudo_losses()
    assert l_pos == pytest.approx(2.0 + 0.5 - 0.3)  # a positive pair of similarity c+
    assert l_neg == pytest.approx(2.0 + 0.7 - 0.5)  # a negative pair of similarity c-
    assert DROKLGroupedMiner(pseudo_pairs=True).pseudo_losses() == pytest.approx((0.0, 0.0), abs=1e-15)
