"""``model.frozen_stages`` (the trunk's first feature stages not trained) and the embedding loop's
inference copy (batch norm folded into the convolution before it), against PyTorch's own layers."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dmlkit.evaluation.embed import embed_dataset
from dmlkit.exceptions import InvalidParameterError
from dmlkit.models import create_model
from dmlkit.models.inference_copy import inference_copy


def _randomise_batch_norm(model: nn.Module, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.3)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            with torch.no_grad():
                m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.num_features, generator=g) * 0.2)


@pytest.mark.parametrize("name, count, last_frozen, first_trained", [
    ("efficientnet_lite0", 2, "blocks.1.", "blocks.2."),  # stem + stages at 1/2 and 1/4 resolution
    ("resnet18", 2, "layer1.", "layer2."),  # stem (act1, 1/2) + layer1 (1/4)
    ("resnet18", 1, "bn1.", "layer1."),
])
def test_frozen_stages_stop_at_the_end_of_the_named_feature_stage(name, count, last_frozen, first_trained):
    model = create_model(name, embedding_size=8, frozen_stages=count)
    names = [(n.removeprefix("trunk.model."), p.requires_grad) for n, p in model.named_parameters()]
    frozen = [n for n, trained in names if not trained]
    assert frozen and frozen[-1].startswith(last_frozen)
    first = next(i for i, (n, _) in enumerate(names) if n.startswith(first_trained))
    assert all(not trained for _, trained in names[:first]) and all(trained for _, trained in names[first:])
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    model.train()
    model(torch.randn(4, 3, 64, 64)).sum().backward()
    opt.step()
    changed = {n for n, p in model.named_parameters() if not torch.equal(before[n], p)}
    assert changed and not changed & {f"trunk.model.{n}" for n in frozen}


def test_frozen_stages_errors_name_the_model_and_the_stage_count():
    with pytest.raises(InvalidParameterError, match="'small_cnn' has no feature stages"):
        create_model("small_cnn", frozen_stages=1)
    with pytest.raises(InvalidParameterError, match="5 feature stages"):
        create_model("resnet18", frozen_stages=6)
    with pytest.raises(InvalidParameterError, match="frozen_stages"):
        create_model("resnet18", frozen_stages=-1)


@pytest.mark.parametrize("name", ["efficientnet_lite0", "resnet18"])
def test_inference_copy_folds_every_batch_norm_and_embeds_as_the_model(name):
    torch.manual_seed(0)
    model = create_model(name, embedding_size=16, flip_average=True).double()
    _randomise_batch_norm(model)
    model.eval()
    x = torch.randn(3, 3, 64, 48, dtype=torch.float64)
    copy = inference_copy(model, x)
    assert copy.model is not model
    assert not any(isinstance(m, nn.BatchNorm2d) for m in copy.modules())
    assert any(isinstance(m, nn.BatchNorm2d) for m in model.modules())  # the model itself is untouched
    with torch.no_grad():
        torch.testing.assert_close(copy(x), model(x), rtol=1e-9, atol=1e-9)


def test_a_batch_norm_after_a_pool_is_left_alone():
    torch.manual_seed(0)
    model = create_model("small_cnn", embedding_size=8, in_chans=1).double().eval()  # conv -> pool -> BN -> ReLU
    _randomise_batch_norm(model)
    x = torch.randn(2, 1, 28, 28, dtype=torch.float64)
    copy = inference_copy(model, x)
    assert sum(isinstance(m, nn.BatchNorm2d) for m in copy.modules()) == sum(
        isinstance(m, nn.BatchNorm2d) for m in model.modules())
    with torch.no_grad():
        torch.testing.assert_close(copy(x), model(x))


class _SharedConv(nn.Module):
    """A convolution whose output feeds a batch norm and, unnormalised, a skip connection."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)
        self.bn = nn.BatchNorm2d(3)

    def forward(self, x):
        y = self.conv(x)
        return self.bn(y) + y


def test_a_convolution_that_also_feeds_another_layer_is_not_folded():
    model = _SharedConv().eval()
    _randomise_batch_norm(model)
    assert inference_copy(model, torch.randn(2, 3, 8, 8)).model is model


def test_the_embedding_loop_runs_the_folded_copy_and_leaves_training_mode_as_it_was():
    torch.manual_seed(0)
    model = create_model("resnet18", embedding_size=8)
    _randomise_batch_norm(model)
    model.train()
    images = torch.randn(5, 3, 32, 32)
    got, labels = embed_dataset(model, torch.utils.data.TensorDataset(images, torch.arange(5)), batch_size=2)
    assert model.training and labels.tolist() == [0, 1, 2, 3, 4]
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(got, model(images), rtol=1e-4, atol=1e-5)
