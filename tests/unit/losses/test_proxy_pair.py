"""ProxyPairLoss: any pair loss between the batch and the labelled proxies (ASAP Eq. (4.11))."""

import math

import pytest
import torch

from dmlkit.exceptions import InvalidParameterError
from dmlkit.losses.proxy import ProxyPairLoss


class LocalContrastive(torch.nn.Module):
    """A small float64 contrastive loss with the ref_emb/ref_labels keyword interface."""

    def __init__(self, margin=0.8):
        super().__init__()
        self.margin = margin
        self.calls = []

    def forward(self, embeddings, labels, ref_emb=None, ref_labels=None):
        self.calls.append((ref_emb.shape, ref_labels.clone()))
        d = torch.cdist(torch.nn.functional.normalize(embeddings, dim=1), torch.nn.functional.normalize(ref_emb, dim=1))
        pos = labels[:, None] == ref_labels[None, :]
        return torch.where(pos, d, (self.margin - d).clamp_min(0)).mean()


def test_calls_pair_loss_with_all_proxies_and_their_labels():
    pair = LocalContrastive()
    loss = ProxyPairLoss(pair, num_classes=4, embedding_size=3, proxies_per_class=2).double()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 3, generator=g, dtype=torch.float64)
    y = torch.randint(0, 4, (6,), generator=g)
    value = loss(x, y)
    shape, labels = pair.calls[-1]
    assert shape == (8, 3) and labels.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    # float64 loop reference
    xn = torch.nn.functional.normalize(x, dim=1)
    pn = torch.nn.functional.normalize(loss.proxies.detach(), dim=1)
    terms = []
    for i in range(6):
        for p in range(8):
            d = math.sqrt(float(((xn[i] - pn[p]) ** 2).sum()))
            terms.append(d if y[i] == p // 2 else max(0.0, 0.8 - d))
    assert value.item() == pytest.approx(sum(terms) / len(terms), rel=1e-10)
    value.backward()
    assert loss.proxies.grad is not None and loss.proxies.grad.abs().sum() > 0


def test_with_dmlkit_multi_similarity():
    from dmlkit.losses.pair import MultiSimilarityLoss

    alpha, beta, base = 2.0, 50.0, 0.5
    loss = ProxyPairLoss(MultiSimilarityLoss(alpha, beta, base), 5, 6, proxies_per_class=3).double()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(7, 6, generator=g, dtype=torch.float64)
    y = torch.randint(0, 5, (7,), generator=g)
    s = torch.nn.functional.normalize(x, dim=1) @ torch.nn.functional.normalize(loss.proxies.detach(), dim=1).T
    total = 0.0
    for i in range(7):
        pos = [s[i, p].item() for p in range(15) if p // 3 == y[i]]
        neg = [s[i, p].item() for p in range(15) if p // 3 != y[i]]
        total += math.log(1 + sum(math.exp(-alpha * (v - base)) for v in pos)) / alpha
        total += math.log(1 + sum(math.exp(beta * (v - base)) for v in neg)) / beta
    assert loss(x, y).item() == pytest.approx(total / 7, rel=1e-9)


def test_rejects_non_callable_and_fractions():
    with pytest.raises(InvalidParameterError, match="pair_loss"):
        ProxyPairLoss("contrastive", 3, 4)
    with pytest.raises(InvalidParameterError, match="proxies_per_class"):
        ProxyPairLoss(LocalContrastive(), 3, 4, proxies_per_class=0.5)


def _preset_loss(preset, num_classes):
    from dmlkit.config import load_config
    from dmlkit.engine.objective import build_objective

    cfg = load_config(preset=preset, overrides=["model.embedding_size=5"])
    return build_objective(cfg, num_classes).loss.double()


def _bounded_batch(seed, n, d=5, classes=3):
    """Vectors inside the unit ball around a shared direction, so that many dot products exceed 0.5."""
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(n, d, generator=g, dtype=torch.float64) * 0.4 + torch.ones(d, dtype=torch.float64) * 0.35
    v = v / v.norm(dim=1, keepdim=True).clamp_min(1.0)  # ASAP Sec. 4.4's bounded normalisation
    return v, torch.randint(0, classes, (n,), generator=g)


@pytest.mark.parametrize("preset", ["asap-c1-cub", "asap-proxy-c1-cars"])
def test_asap_c1_preset_loss_is_the_eq_4_11_average_of_xbm_pair_terms(preset):
    """ASAP Alg. 1: 1/(m |rho|) sum over rho x [m] of l(rho_i, z_j); C1 = XBM's term (App. A.2):
    1 - s for a positive pair, s for a negative pair with s > 0.5, s = <rho_i, z_j>."""
    loss = _preset_loss(preset, num_classes=3)
    x, y = _bounded_batch(0, 7)
    proxies, _ = _bounded_batch(1, loss.proxies.shape[0])
    loss.proxies.data.copy_(proxies)
    rho, rho_labels = proxies.tolist(), loss.proxy_labels.tolist()
    total, active_negatives = 0.0, 0
    for i in range(len(rho)):
        for j in range(len(x)):
            s = sum(a * b for a, b in zip(rho[i], x[j].tolist()))
            if rho_labels[i] == y[j]:
                total += 1 - s
            elif s > 0.5:
                total += s
                active_negatives += 1
    assert active_negatives > 0
    assert loss(x, y).item() == pytest.approx(total / (len(x) * len(rho)), rel=1e-10)


@pytest.mark.parametrize("preset", ["asap-c2-cub", "cpu-asap-mnist-2d-c2"])
def test_asap_c2_preset_loss_is_the_eq_4_11_average_of_wu_pair_terms(preset):
    """ASAP Eq. (4.11) with C2 (Lemma 4.1: (iota (d - beta) + alpha)_+), d = Euclidean on the bounded
    output: d - m+ (hinged) for a positive pair, m- - d (hinged) for a negative, averaged over m |rho|."""
    loss = _preset_loss(preset, num_classes=3)
    pair = loss.pair_loss
    x, y = _bounded_batch(2, 6)
    proxies, _ = _bounded_batch(3, loss.proxies.shape[0])
    proxies = proxies * 0.6  # inside the ball: a re-normalising distance would give other values
    loss.proxies.data.copy_(proxies)
    rho, rho_labels = proxies.tolist(), loss.proxy_labels.tolist()
    total = 0.0
    for i in range(len(rho)):
        for j in range(len(x)):
            d = sum((a - b) ** 2 for a, b in zip(rho[i], x[j].tolist())) ** 0.5
            total += max(0.0, d - pair.pos_margin) if rho_labels[i] == y[j] else max(0.0, pair.neg_margin - d)
    assert loss(x, y).item() == pytest.approx(total / (len(x) * len(rho)), rel=1e-10)


def test_mean_reduction_needs_a_summing_pair_loss():
    from dmlkit.losses.pair import ContrastiveLoss

    with pytest.raises(InvalidParameterError, match="reduction='sum'"):
        ProxyPairLoss(ContrastiveLoss(), 3, 4, reduction="mean")
    summed = ProxyPairLoss(ContrastiveLoss(reduction="sum"), 3, 4, proxies_per_class=2, reduction="mean").double()
    own = ProxyPairLoss(ContrastiveLoss(reduction="sum"), 3, 4, proxies_per_class=2).double()
    own.proxies.data.copy_(summed.proxies.data)
    x, y = _bounded_batch(4, 5, d=4)
    assert summed(x, y).item() == pytest.approx(own(x, y).item() / (5 * 6), rel=1e-12)
