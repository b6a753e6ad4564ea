"""Every registered backbone builds, embeds with the right shape and normalisation; names are checked."""

import pytest
import torch

from dmlkit.exceptions import InvalidParameterError
from dmlkit.models import MODELS, Embedder, create_model, list_models, register_model

# BN-Inception on one 32x32 image (the smallest size its stride-2 blocks accept) keeps the suite fast.
SMALL_INPUT = {"bn_inception": (1, 3, 32, 32)}


def small_input(name: str, model: Embedder, batch: int = 2) -> torch.Tensor:
    size = SMALL_INPUT.get(name, (batch, *model.pretrained_cfg["input_size"]))
    return torch.randn(*size, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("name", MODELS.names())
def test_registered_model_embeds_with_l2_norm(name):
    model = create_model(name, embedding_size=12).eval()
    trunk_outputs = []
    model.trunk.register_forward_hook(lambda module, args, output: trunk_outputs.append(output.shape))
    x = small_input(name, model)
    with torch.no_grad():
        out = model(x)
    batch = x.shape[0]
    assert out.shape == (batch, 12)
    assert torch.allclose(out.norm(dim=1), torch.ones(batch), atol=1e-5)
    assert trunk_outputs[0][:2] == (batch, model.trunk.num_features)
    assert model.embedding_size == 12
    assert set(model.pretrained_cfg) >= {"mean", "std", "input_size", "color", "scale", "interpolation"}


@pytest.mark.parametrize(
    "name, normalization", [("small_cnn", "bounded"), ("resnetv2_20", "bounded"), ("eps_mnist_net", "none")]
)
def test_bounded_and_no_normalisation(name, normalization):
    torch.manual_seed(0)  # initial weights only; inputs use their own generator
    model = create_model(name, embedding_size=6, normalization=normalization).eval()
    x = small_input(name, model, batch=4)
    with torch.no_grad():
        # rescale the head so that some embeddings have norm above 1 and some below
        model.head.weight.div_(model.head(model.features(x)).norm(dim=1).median())
        raw = model.head(model.features(x))
        out = model(x)
    if normalization == "none":
        torch.testing.assert_close(out, raw)
    else:
        norms = raw.norm(dim=1, keepdim=True)
        assert (norms > 1).any() and (norms < 1).any(), norms.flatten()
        expected = torch.where(norms > 1, raw / norms, raw)
        torch.testing.assert_close(out, expected)
        assert (out.norm(dim=1) <= 1 + 1e-6).all()


def test_mnist_models_train_step_reduces_nothing_to_nan():
    model = create_model("small_cnn", embedding_size=64, normalization="l2")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(64, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    before = [p.detach().clone() for p in model.parameters()]
    loss = model(x)[:, 0].sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    assert torch.isfinite(loss)
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_small_cnn_defaults_for_the_lead_job():
    model = create_model("small_cnn", embedding_size=64, normalization="l2")
    cfg = model.pretrained_cfg
    assert cfg["input_size"] == (1, 28, 28)
    assert cfg["color"] == "RGB" and cfg["scale"] == 1.0
    assert cfg["mean"] == pytest.approx((0.1307,)) and cfg["std"] == pytest.approx((0.3081,))


def test_timm_names_fall_through_and_are_listed():
    names = list_models("resnet*")
    assert "resnet50" in names and "resnetv2_20" in names
    model = create_model("resnet18", embedding_size=10).eval()
    assert model.trunk.num_features == 512
    with torch.no_grad():
        out = model(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 10)


def test_timm_token_model_uses_its_own_pooling():
    model = create_model("vit_tiny_patch16_224", embedding_size=7, img_size=32, patch_size=8).eval()
    assert model.trunk.num_features == 192
    with torch.no_grad():
        features = model.features(torch.randn(2, 3, 32, 32))
    assert features.shape == (2, 192)
    assert model.pretrained_cfg["input_size"] == (3, 32, 32)


def test_in_chans_adapts_first_layer_and_cfg():
    model = create_model("resnet18", in_chans=1, embedding_size=4).eval()
    cfg = model.pretrained_cfg
    assert cfg["input_size"][0] == 1 and cfg["color"] == "RGB" and len(cfg["mean"]) == 1
    assert cfg["mean"][0] == pytest.approx((0.485 + 0.456 + 0.406) / 3)
    with torch.no_grad():
        assert model(torch.randn(1, 1, 32, 32)).shape == (1, 4)
    rgb = create_model("resnetv2_20", in_chans=3, image_size=32)
    assert rgb.pretrained_cfg["input_size"] == (3, 32, 32) and rgb.pretrained_cfg["color"] == "RGB"


def test_unknown_name_suggests_close_matches():
    with pytest.raises(InvalidParameterError, match=r"Did you mean 'bn_inception'"):
        create_model("bn_incepton")
    with pytest.raises(ValueError, match=r"Did you mean 'resnet50'"):
        create_model("resnet_50")
    with pytest.raises(InvalidParameterError, match="Unknown model 'zzzz_not_a_model'"):
        create_model("zzzz_not_a_model", pretrained=True)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(embedding_size=0), "The 'embedding_size' parameter of create_model must be None or an int >= 1. Got 0 instead."),
        (dict(normalization="l1"), "The 'normalization' parameter of create_model must be one of"),
        (dict(pooling="mean"), "The 'pooling' parameter of create_model must be one of"),
        (dict(freeze_bn="yes"), "The 'freeze_bn' parameter"),
        (dict(in_chans=0), "The 'in_chans' parameter"),
    ],
)
def test_bad_parameters_are_reported(kwargs, message):
    with pytest.raises(InvalidParameterError) as info:
        create_model("small_cnn", **kwargs)
    assert message in str(info.value)


def test_pretrained_weights_not_here_offline_are_a_config_error_naming_the_cache(tmp_path, monkeypatch):
    from dmlkit.exceptions import ConfigError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    with pytest.raises(ConfigError, match="bn_inception-52deb4733.pth") as caught:
        create_model("bn_inception", pretrained=True)
    assert str(tmp_path / "torch") in str(caught.value) and "model.weights=PATH" in str(caught.value)
    with pytest.raises(ConfigError, match="resnet18.a1_in1k") as caught:
        create_model("resnet18", pretrained=True)
    assert str(tmp_path / "hf" / "hub") in str(caught.value) and "model.weights=PATH" in str(caught.value)
    with pytest.raises(ConfigError, match="no published ImageNet weights for model 'small_cnn'"):
        create_model("small_cnn", pretrained=True)


def test_register_model_adds_a_backbone():
    from dmlkit.models import SmallCNN

    name = "test_only_tiny_cnn"
    if name not in MODELS:
        register_model(name)(lambda in_chans=None: SmallCNN(in_chans=in_chans or 1, width=4))
    assert name in list_models("test_only_*")
    model = create_model(name, embedding_size=3)
    assert model.trunk.num_features == 16
    with pytest.raises(ValueError, match="registered twice"):
        register_model(name)(lambda in_chans=None: None)
