"""NPairsLoss: one pair per class, PML agreement, Sohn's equation."""

import pytest
import torch
from pytorch_metric_learning import losses as pml_losses

from dmlkit.distances import DotProductSimilarity
from dmlkit.losses.pair import NPairsLoss


def test_matches_pml_on_shuffled_labels():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 16, generator=g)
    y = torch.randint(0, 9, (40,), generator=g)
    torch.testing.assert_close(NPairsLoss()(x, y), pml_losses.NPairsLoss()(x, y), rtol=1e-5, atol=1e-5)


def test_equation_with_raw_inner_products():
    x = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    y = torch.tensor([3, 1, 3, 1, 7, 7])
    loss = NPairsLoss(distance=DotProductSimilarity(normalize_embeddings=False))(x, y)
    anchors, positives = x[[1, 0, 4]], x[[3, 2, 5]]  # classes 1, 3, 7: first sample and its first positive
    logits = anchors @ positives.T
    expected = sum(torch.log(torch.exp(logits[i] - logits[i, i]).sum()) for i in range(3)) / 3
    torch.testing.assert_close(loss, expected)
    assert torch.autograd.gradcheck(lambda e: NPairsLoss(distance=DotProductSimilarity(normalize_embeddings=False))(e, y), (x,))


def test_reference_set_is_rejected_and_no_pair_gives_zero():
    x = torch.randn(4, 3, requires_grad=True)
    with pytest.raises(ValueError, match="does not support ref_emb"):
        NPairsLoss()(x, torch.arange(4), ref_emb=x, ref_labels=torch.arange(4))
    loss = NPairsLoss()(x, torch.arange(4))
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(x.grad, torch.zeros_like(x))


def test_scale_multiplies_the_logits_of_the_cross_entropy_and_its_gradient():
    import torch

    from dmlkit.losses import NPairsLoss

    torch.manual_seed(0)
    emb = torch.randn(8, 5, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    loss = NPairsLoss(scale=7.0)(emb, labels)
    x = torch.nn.functional.normalize(emb, dim=1)
    logits = 7.0 * x[0::2] @ x[1::2].T  # anchors: each class's first sample; positives: its second
    reference = torch.nn.functional.cross_entropy(logits, torch.arange(4))
    assert torch.allclose(loss, reference)
    (g,) = torch.autograd.grad(loss, emb)
    (g_ref,) = torch.autograd.grad(reference, emb)
    assert torch.allclose(g, g_ref)
    assert torch.allclose(NPairsLoss()(emb, labels), NPairsLoss(scale=1.0)(emb, labels))
    with pytest.raises(ValueError, match="scale"):
        NPairsLoss(scale=0.0)
