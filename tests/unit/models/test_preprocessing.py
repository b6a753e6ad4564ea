"""Each backbone carries its preprocessing; preprocess() applies exactly that config."""

import pytest
import torch

from dmlkit.exceptions import DataError, InvalidParameterError
from dmlkit.models import BN_INCEPTION_CFG, IMAGENET_MEAN, IMAGENET_STD, create_model, make_cfg, preprocess


@pytest.fixture(scope="module")
def bn_inception():
    return create_model("bn_inception")


@pytest.fixture(scope="module")
def resnet18_cfg():
    return create_model("resnet18").pretrained_cfg


def test_bn_inception_wants_bgr_0_255_mean_subtracted(bn_inception):
    cfg = bn_inception.pretrained_cfg
    assert cfg == BN_INCEPTION_CFG
    assert cfg["color"] == "BGR" and cfg["scale"] == 255.0
    assert cfg["mean"] == (104.0, 117.0, 128.0) and cfg["std"] == (1.0, 1.0, 1.0)
    assert cfg["input_size"] == (3, 224, 224)


@pytest.mark.parametrize("name", ["resnet18", "efficientnet_lite0"])
def test_timm_models_want_rgb_imagenet_normalisation(name):
    cfg = create_model(name).pretrained_cfg
    assert cfg["color"] == "RGB" and cfg["scale"] == 1.0
    assert cfg["mean"] == pytest.approx(IMAGENET_MEAN) and cfg["std"] == pytest.approx(IMAGENET_STD)


def test_bn_inception_preprocess_by_hand(bn_inception):
    rgb = torch.tensor([10, 20, 30], dtype=torch.uint8).view(1, 3, 1, 1).expand(1, 3, 2, 2).contiguous()
    out = bn_inception.preprocess(rgb)
    # channel order B, G, R minus the BGR means, in 0..255 units
    expected = torch.tensor([30 - 104.0, 20 - 117.0, 10 - 128.0]).view(1, 3, 1, 1).expand(1, 3, 2, 2)
    torch.testing.assert_close(out, expected)


def test_imagenet_preprocess_by_hand_and_float_input(resnet18_cfg):
    cfg = resnet18_cfg
    pixel = torch.tensor([51, 102, 204], dtype=torch.uint8).view(3, 1, 1)
    out = preprocess(pixel, cfg)
    expected = [(v / 255.0 - m) / s for v, m, s in zip((51, 102, 204), IMAGENET_MEAN, IMAGENET_STD)]
    torch.testing.assert_close(out.flatten(), torch.tensor(expected), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(preprocess(pixel.float() / 255.0, cfg), out)


def test_same_image_differs_between_backbones(resnet18_cfg):
    image = torch.randint(0, 256, (2, 3, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    bgr = preprocess(image, BN_INCEPTION_CFG)
    rgb = preprocess(image, resnet18_cfg)
    assert bgr.abs().max() > 20 and rgb.abs().max() < 3
    # undoing BN-Inception's steps gives back the flipped image exactly
    mean = torch.tensor(BN_INCEPTION_CFG["mean"]).view(1, 3, 1, 1)
    torch.testing.assert_close((bgr + mean).flip(1), image.float(), rtol=0, atol=1e-4)


def test_grey_and_resize():
    model = create_model("small_cnn")
    image = torch.full((1, 1, 56, 56), 255, dtype=torch.uint8)
    out = model.preprocess(image, resize=True)
    assert out.shape == (1, 1, 28, 28)
    torch.testing.assert_close(out, torch.full_like(out, (1 - 0.1307) / 0.3081))


def test_preprocess_errors_quote_operands():
    cfg = create_model("small_cnn").pretrained_cfg
    with pytest.raises(DataError, match=r"images have 3 channels but the model's input_size is \(1, 28, 28\)"):
        preprocess(torch.zeros(1, 3, 28, 28), cfg)
    with pytest.raises(DataError, match="uint8"):
        preprocess(torch.zeros(1, 1, 28, 28, dtype=torch.int32), cfg)
    with pytest.raises(DataError, match=r"\[B, C, H, W\]"):
        preprocess(torch.zeros(28, 28), cfg)


def test_make_cfg_checks_consistency():
    with pytest.raises(InvalidParameterError, match="mean has 1"):
        make_cfg(mean=(0.5,), std=(0.5, 0.5, 0.5), input_size=(3, 8, 8), color="RGB")
    with pytest.raises(InvalidParameterError, match="color"):
        make_cfg(mean=(0.5,) * 3, std=(0.5,) * 3, input_size=(3, 8, 8), color="HSV")
    with pytest.raises(InvalidParameterError, match="'BGR' needs 3 input channels"):
        make_cfg(mean=(0.5,), std=(0.5,), input_size=(1, 8, 8), color="BGR")


def test_preprocess_transform_is_picklable_and_equivalent(bn_inception):
    import pickle

    from dmlkit.models import Preprocess

    transform = pickle.loads(pickle.dumps(Preprocess(bn_inception.pretrained_cfg)))
    image = torch.randint(0, 256, (3, 4, 4), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(transform(image), bn_inception.preprocess(image))
    assert transform(image).shape == (3, 4, 4)
    assert "BGR" in repr(transform)


@pytest.mark.parametrize("name", ["small_cnn", "bn_inception", "efficientnet_lite0"])
def test_cfg_is_accepted_by_the_data_pipeline(name):
    from dmlkit.data.transforms import BackboneNormalize

    kwargs = dict(pretrained=True) if name == "efficientnet_lite0" else {}
    model = create_model(name, **kwargs)
    cfg = model.pretrained_cfg
    image = torch.rand(cfg["input_size"][0], 6, 6, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(BackboneNormalize(cfg)(image), model.preprocess(image))
