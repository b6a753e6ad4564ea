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
