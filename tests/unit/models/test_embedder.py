"""Embedder: pooling, freeze-BN, parameter groups."""

import pytest
import torch
from torch import nn

from dmlkit.exceptions import InvalidParameterError
from dmlkit.models import Embedder, GlobalPool, create_model, make_cfg


@pytest.mark.parametrize("pooling", ["avg", "max", "avg+max"])
def test_global_pool_matches_explicit_loops(pooling):
    x = torch.randn(2, 3, 4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    out = GlobalPool(pooling)(x)
    expected = torch.empty(2, 3, dtype=torch.float64)
    for b in range(2):
        for c in range(3):
            values = [x[b, c, i, j].item() for i in range(4) for j in range(5)]
            avg, mx = sum(values) / len(values), max(values)
            expected[b, c] = {"avg": avg, "max": mx, "avg+max": avg + mx}[pooling]
    torch.testing.assert_close(out, expected)


def test_global_pool_passes_vectors_through_and_rejects_bad_names():
    v = torch.randn(3, 8)
    assert GlobalPool("max")(v) is v
    with pytest.raises(InvalidParameterError, match="'pooling' parameter of GlobalPool"):
        GlobalPool("sum")


def _bn_state(model):
    return {k: v.clone() for k, v in model.trunk.state_dict().items() if "running" in k}


def test_freeze_bn_keeps_trunk_statistics_in_train_mode():
    model = create_model("small_cnn", embedding_size=8, freeze_bn=True)
    model.train()
    assert model.training and model.head.training
    bns = [m for m in model.trunk.modules() if isinstance(m, nn.BatchNorm2d)]
    assert bns and all(not m.training for m in bns)
    before = _bn_state(model)
    model(torch.randn(8, 1, 28, 28) * 3 + 1).sum().backward()
    after = _bn_state(model)
    assert all(torch.equal(before[k], after[k]) for k in before)
    # the BN affine parameters still learn
    assert bns[0].weight.grad is not None and bns[0].weight.grad.abs().sum() > 0
    model.eval()
    model.train()
    assert all(not m.training for m in bns)


def test_without_freeze_bn_statistics_move():
    model = create_model("small_cnn", embedding_size=8, freeze_bn=False).train()
    before = _bn_state(model)
    model(torch.randn(8, 1, 28, 28) * 3 + 1)
    after = _bn_state(model)
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_parameter_groups_partition_all_parameters():
    model = create_model("resnetv2_20", embedding_size=5, pooling="avg+max")
    trunk = {id(p) for p in model.trunk_parameters()}
    head = {id(p) for p in model.head_parameters()}
    everything = {id(p) for p in model.parameters()}
    assert trunk and head and not (trunk & head)
    assert trunk | head == everything
    assert head == {id(model.head.weight), id(model.head.bias)}


def test_embedder_can_be_assembled_by_hand_and_validates():
    trunk = nn.Conv2d(3, 4, 1)
    cfg = make_cfg(mean=(0.5,) * 3, std=(0.5,) * 3, input_size=(3, 8, 8), color="RGB")
    model = Embedder(trunk, GlobalPool("max"), nn.Linear(4, 2), "none", pretrained_cfg=cfg)
    assert model(torch.randn(3, 3, 8, 8)).shape == (3, 2)
    with pytest.raises(InvalidParameterError, match="'normalization' parameter of Embedder"):
        Embedder(trunk, GlobalPool(), nn.Linear(4, 2), "unit", pretrained_cfg=cfg)
    with pytest.raises(ValueError, match="pretrained_cfg"):
        Embedder(trunk, GlobalPool(), nn.Linear(4, 2))


def test_freeze_bn_reaches_timm_batchnorm_layers():
    model = create_model("resnet18", embedding_size=4, freeze_bn=True).train()
    bns = [m for m in model.trunk.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    assert len(bns) == 20 and all(not m.training for m in bns)
    assert model.trunk.model.layer1.training  # other layers follow the embedder's mode
