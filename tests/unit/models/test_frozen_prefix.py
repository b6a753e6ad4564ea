"""An Embedder run in two parts, ``forward_from_prefix(prefix(x))``, is the training forward ``model(x)``:
same embeddings, same loss, same gradient of every trained parameter (fp32), and under bf16 autocast too."""

from __future__ import annotations

import pytest
import torch

from dmlkit.exceptions import InvalidParameterError
from dmlkit.losses import ProxyAnchorLoss
from dmlkit.models import create_model


def frozen_model(name: str, stages: int, **kwargs):
    torch.manual_seed(0)
    pretrained = name == "efficientnet_lite0"
    return create_model(name, pretrained=pretrained, frozen_stages=stages, freeze_bn=True, pooling="gem",
                        embedding_size=None if pretrained else 16, head_init="identity" if pretrained else "kaiming",
                        **kwargs).train()


def trained_gradients(model, loss_fn, forward, labels):
    model.zero_grad(set_to_none=True)
    loss_fn.zero_grad(set_to_none=True)
    loss = loss_fn(forward(), labels)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in [*model.named_parameters(), *loss_fn.named_parameters()] if p.requires_grad}
    return loss.detach(), grads


@pytest.mark.parametrize("name, stages", [("efficientnet_lite0", 2), ("resnet18", 1), ("resnet18", 2)])
def test_training_from_the_prefix_gives_the_full_forward_passes_loss_and_gradients(name, stages):
    model = frozen_model(name, stages)
    assert model.prefix_problem() is None
    x = torch.randn(6, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    loss_fn = ProxyAnchorLoss(num_classes=3, embedding_size=model.embedding_size)
    features = model.prefix(x)
    assert not features.requires_grad  # no graph through the frozen stages
    assert features.is_contiguous(memory_format=torch.channels_last)
    full_loss, full = trained_gradients(model, loss_fn, lambda: model(x), labels)
    cached_loss, cached = trained_gradients(model, loss_fn, lambda: model.forward_from_prefix(features), labels)
    torch.testing.assert_close(cached_loss, full_loss)
    assert full.keys() == cached.keys() and any(n.startswith("trunk.") for n in full)  # trained trunk stages too
    for name_ in full:
        torch.testing.assert_close(cached[name_], full[name_], msg=name_)
    frozen = [p for p in model.parameters() if not p.requires_grad]
    assert frozen and all(p.grad is None for p in frozen)


def test_the_split_matches_the_full_forward_under_bf16_autocast_and_casts_stored_bf16_outside_it():
    model = frozen_model("efficientnet_lite0", 2)
    x = torch.randn(4, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        full = model(x)
        features = model.prefix(x)
        split = model.forward_from_prefix(features)
    assert features.dtype == torch.bfloat16
    torch.testing.assert_close(split, full, rtol=0, atol=0)
    stored = model.prefix(x).to(torch.bfloat16)  # the cache's precision, read by an fp32 run
    fp32 = model.forward_from_prefix(stored)
    assert fp32.dtype == torch.float32
    torch.testing.assert_close(fp32, model(x), rtol=0.05, atol=0.02)


def test_the_prefix_ends_at_the_last_frozen_stage():
    model = frozen_model("efficientnet_lite0", 2)
    prefix, rest = model.trunk.split_modules()
    chain = [name for name, _ in model.trunk.feature_chain()]
    assert chain[: len(prefix)] == ["conv_stem", "bn1", "blocks.0", "blocks.1"]
    assert chain[len(prefix)] == "blocks.2" and chain[-2:] == ["conv_head", "bn2"]
    assert all(not p.requires_grad for m in prefix for p in m.parameters())
    assert all(p.requires_grad for m in rest for p in m.parameters())
    assert model.prefix(torch.zeros(1, 3, 64, 64)).shape == (1, 24, 16, 16)  # blocks.1 at 1/4 resolution


def test_a_prefix_that_is_not_fixed_during_training_is_refused_with_the_reason():
    assert "frozen_stages=0" in create_model("efficientnet_lite0", embedding_size=8).prefix_problem()
    assert "freeze_bn=False" in create_model("efficientnet_lite0", embedding_size=8, frozen_stages=2).prefix_problem()
    random_layer = create_model("efficientnet_lite0", embedding_size=8, frozen_stages=2, freeze_bn=True,
                                drop_path_rate=0.2)
    assert "random layer (DropPath" in random_layer.prefix_problem()
    assert "no frozen stages" in create_model("small_cnn", embedding_size=8).prefix_problem()
    with pytest.raises(InvalidParameterError, match="frozen_stages=0"):
        create_model("resnet18", embedding_size=8).prefix(torch.zeros(1, 3, 32, 32))
