"""Transforms: Musgrave / Proxy-Anchor geometry and per-backbone normalisation from a config dict."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from dmlkit.data import build_splits
from dmlkit.data.transforms import BackboneNormalize, Preprocessing, build_transforms, eval_transform, train_transform
from dmlkit.exceptions import InvalidParameterError

BN_INCEPTION = {"mean": [104.0, 117.0, 128.0], "std": [1.0, 1.0, 1.0], "input_size": (3, 224, 224),
                "color": "BGR", "scale": 255}
RESNET_LIKE = {"mean": [0.4, 0.5, 0.6], "std": [0.2, 0.25, 0.3], "input_size": (3, 227, 227), "color": "RGB", "scale": 1}


def _photo(width=300, height=200, seed=0) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels, mode="RGB")


def test_normalize_matches_float64_reference_for_bgr_255():
    image = torch.rand(3, 5, 4, dtype=torch.float64)
    got = BackboneNormalize(BN_INCEPTION)(image.float()).double()
    mean = torch.tensor(BN_INCEPTION["mean"], dtype=torch.float64).view(3, 1, 1)
    expected = image.flip(0) * 255 - mean
    assert torch.allclose(got, expected, atol=1e-3)


def test_normalize_rgb_unit_range_and_batches():
    images = torch.rand(2, 3, 4, 4)
    got = BackboneNormalize(RESNET_LIKE)(images)
    mean = torch.tensor(RESNET_LIKE["mean"]).view(3, 1, 1)
    std = torch.tensor(RESNET_LIKE["std"]).view(3, 1, 1)
    assert torch.allclose(got, (images - mean) / std, atol=1e-6)


def test_grey_images_are_repeated_for_three_channel_backbones():
    grey = torch.rand(1, 6, 6)
    got = BackboneNormalize(RESNET_LIKE)(grey)
    assert got.shape == (3, 6, 6)
    assert torch.allclose(got[1], (grey[0] - 0.5) / 0.25, atol=1e-6)
    assert BackboneNormalize(None)(grey).shape == (1, 6, 6)  # no config: channels untouched
    one_channel = {"mean": [0.5], "std": [0.5], "input_size": (1, 28, 28)}
    assert torch.allclose(BackboneNormalize(one_channel)(grey), grey * 2 - 1, atol=1e-6)


def test_bad_preprocessing_configs():
    with pytest.raises(InvalidParameterError, match="'color' entry .* must be 'RGB' or 'BGR'. Got 'RGBA'"):
        Preprocessing.from_config(RESNET_LIKE | {"color": "RGBA"})
    with pytest.raises(InvalidParameterError, match="'scale' entry .* must be 1 or 255"):
        Preprocessing.from_config(RESNET_LIKE | {"scale": 2})
    with pytest.raises(InvalidParameterError, match="2 mean and 3 std values but 3 input channels"):
        Preprocessing.from_config(RESNET_LIKE | {"mean": [0.1, 0.2]})
    with pytest.raises(InvalidParameterError, match="'preset' parameter"):
        train_transform("timm")


def test_musgrave_train_and_eval_geometry():
    torch.manual_seed(0)
    train, evaluate = build_transforms("musgrave", RESNET_LIKE)
    photo = _photo()
    assert train(photo).shape == (3, 227, 227)
    out = evaluate(photo)
    assert out.shape == (3, 227, 227)
    # Evaluation is deterministic: shorter side 256 (384x256), centre crop 227.
    resized = photo.resize((384, 256), Image.BILINEAR)
    left, top = (384 - 227) // 2, (256 - 227) // 2
    crop = np.asarray(resized.crop((left, top, left + 227, top + 227)), dtype=np.float64) / 255
    expected = (crop.transpose(2, 0, 1) - np.array(RESNET_LIKE["mean"])[:, None, None]) / np.array(RESNET_LIKE["std"])[:, None, None]
    assert np.abs(out.numpy() - expected).mean() < 0.05  # resampling filters differ slightly


def test_proxy_anchor_sizes_and_image_size_override():
    torch.manual_seed(0)
    photo = _photo()
    assert train_transform("proxy_anchor", BN_INCEPTION)(photo).shape == (3, 224, 224)
    assert eval_transform("proxy_anchor", BN_INCEPTION)(photo).shape == (3, 224, 224)
    assert eval_transform("musgrave", None, image_size=64)(photo).shape == (3, 64, 64)


def test_training_augmentation_flips_and_crops():
    photo = _photo(seed=3)
    transform = train_transform("musgrave", None, image_size=32)
    torch.manual_seed(1)
    outs = torch.stack([transform(photo) for _ in range(6)])
    assert outs.std(dim=0).mean() > 0.01  # random crops differ
    torch.manual_seed(1)
    again = torch.stack([transform(photo) for _ in range(6)])
    assert torch.equal(outs, again)  # seeded by torch's generator (DataLoader seeds workers)


def test_mnist_with_backbone_config_gives_three_channels():
    splits = build_splits("digits", image_size=32, train_transform=BackboneNormalize(RESNET_LIKE))
    image, _ = splits.train[0]
    assert image.shape == (3, 32, 32)
    raw = splits.train.float_images(slice(0, 1))[0, 0]
    assert torch.allclose(image[2], (raw - 0.6) / 0.3, atol=1e-6)


def test_training_augmentation_is_seeded_per_item_and_epoch(cub_root):
    from torch.utils.data import DataLoader

    splits = build_splits("cub200", cub_root, image_size=24, seed=5)
    train = splits.train
    before = torch.get_rng_state()
    first = torch.stack([train[i][0] for i in range(len(train))])
    assert torch.equal(torch.get_rng_state(), before)  # the caller's generator is untouched
    in_workers = torch.cat([x for x, _ in DataLoader(train, batch_size=4, num_workers=2)])
    assert torch.equal(first, in_workers)  # same augmentation whatever the worker layout
    train.set_epoch(1)
    assert not torch.equal(first, torch.stack([train[i][0] for i in range(len(train))]))
    other_seed = build_splits("cub200", cub_root, image_size=24, seed=6).train
    assert not torch.equal(first, torch.stack([other_seed[i][0] for i in range(len(train))]))
