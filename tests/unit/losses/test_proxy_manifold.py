"""ManifoldLoss: a float64 loop transcription of Aziere & Todorovic Eqs. (3)-(7), gradcheck, PML agreement."""

import math

import pytest
import pytorch_metric_learning.losses as pml
import torch

from dmlkit.exceptions import DataError, InvalidParameterError
from dmlkit.losses import ManifoldLoss

G = torch.Generator().manual_seed(3)
X = torch.randn(9, 6, generator=G, dtype=torch.float64)
PROXIES = torch.randn(4, 6, generator=G, dtype=torch.float64)
OWN = torch.tensor([0, 1, 2, 3, 0, 1, 1, 2, 3])


def manifold_ref(x, proxies, own, alpha=0.8, lambda_c=1.0, margin=5e-4):
    """Affinities by loops, F = (1 - alpha) (I - alpha S)^-1 by a general inverse, Eqs. (5)-(7) by loops."""
    nodes = torch.cat([x, proxies])
    m, n, k = nodes.shape[0], x.shape[0], proxies.shape[0]
    w = torch.zeros(m, m, dtype=x.dtype)
    for i in range(m):
        for j in range(m):
            if i != j:
                cos = nodes[i] @ nodes[j] / (nodes[i].norm() * nodes[j].norm())
                w[i, j] = math.exp(max(float(cos), 0.0) / 0.5)
    d = w.sum(1)
    s = torch.zeros_like(w)
    for i in range(m):
        for j in range(m):
            s[i, j] = w[i, j] / math.sqrt(d[i] * d[j])
    f = (1 - alpha) * torch.linalg.inv(torch.eye(m, dtype=x.dtype) - alpha * s)

    def hinge_log(value):
        total = 0.0
        for i in range(n):
            acc = 0.0
            for c in range(k):
                v = value(i, c) - value(i, int(own[i])) + margin
                if c != int(own[i]) and v >= 0:
                    acc += math.exp(v)
            total += math.log(1 + acc)
        return total / n

    intrinsic = hinge_log(lambda i, c: float(f[i, n + c]))
    context = hinge_log(lambda i, c: float(f[i] @ f[n + c] / (f[i].norm() * f[n + c].norm())))
    return intrinsic + lambda_c * context


def make(**kw):
    loss = ManifoldLoss(l=6, K=4, **kw).double()
    loss.proxies.data = PROXIES.clone()
    return loss


@pytest.mark.parametrize("kw", [{}, dict(alpha=0.99, lambdaC=0.0, margin=0.0), dict(lambdaC=2.5, margin=0.01)])
def test_value_matches_the_paper_equations(kw):
    ref_kw = dict(alpha=kw.get("alpha", 0.8), lambda_c=kw.get("lambdaC", 1.0), margin=kw.get("margin", 5e-4))
    assert math.isclose(float(make(**kw)(X, OWN).detach()), manifold_ref(X, PROXIES, OWN, **ref_kw), rel_tol=1e-9)


def test_infinite_lambda_keeps_the_context_loss():
    value = float(make(lambdaC=math.inf)(X, OWN).detach())
    both, intrinsic = manifold_ref(X, PROXIES, OWN, lambda_c=1.0), manifold_ref(X, PROXIES, OWN, lambda_c=0.0)
    assert math.isclose(value, both - intrinsic, rel_tol=1e-9)


def test_gradcheck_float64():
    loss = make(margin=0.05)
    x = X.clone().requires_grad_(True)
    p = loss.proxies
    assert torch.autograd.gradcheck(lambda a, b: _with_proxies(loss, a, b), (x, p), eps=1e-6, atol=1e-6)


def _with_proxies(loss, x, proxies):
    loss.bank.proxies = torch.nn.Parameter(proxies) if not isinstance(proxies, torch.nn.Parameter) else proxies
    return loss(x, OWN)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_agrees_with_pml_given_the_same_assignment(dtype):
    ours = ManifoldLoss(l=6, K=4, alpha=0.9).to(dtype)
    theirs = pml.ManifoldLoss(l=6, K=4, alpha=0.9).to(dtype)
    ours.proxies.data = PROXIES.to(dtype)
    theirs.proxies.data = PROXIES.to(dtype)
    x1, x2 = X.to(dtype).clone().requires_grad_(True), X.to(dtype).clone().requires_grad_(True)
    v1, v2 = ours(x1, indices_tuple=OWN), theirs(x2, indices_tuple=OWN)
    v1.backward()
    v2.backward()
    tol = 1e-4  # PML inverts in float32 whatever the input's dtype
    assert torch.allclose(v1, v2.reshape(()), rtol=tol)
    assert torch.allclose(x1.grad, x2.grad, rtol=tol * 10, atol=tol)
    assert torch.allclose(ours.proxies.grad, theirs.proxies.grad, rtol=tol * 10, atol=tol)


def test_labels_name_the_proxies_and_the_random_assignment_is_seeded():
    loss = make()
    assert torch.equal(loss(X, OWN), loss(X, indices_tuple=OWN))
    a, b = make(), make()
    assert torch.equal(a(X), b(X))  # same seed, same draw
    state = a.state_dict()
    first = a(X)
    a.load_state_dict(state)
    assert torch.equal(a(X), first)  # the generator state resumes


def test_errors():
    with pytest.raises(InvalidParameterError, match="The 'lambdaC' parameter of ManifoldLoss must be"):
        ManifoldLoss(l=6, lambdaC=-1)
    with pytest.raises(AssertionError, match="embeddings has 6 columns but ManifoldLoss has l=9"):
        ManifoldLoss(l=9)(X)
    with pytest.raises(DataError, match="K=4 proxies"):
        make()(X, OWN + 1)
    with pytest.raises(InvalidParameterError, match="ref_emb"):
        make()(X, ref_emb=X)
