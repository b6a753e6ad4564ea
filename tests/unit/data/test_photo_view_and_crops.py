"""Photos in memory: decoded once as their evaluation view, trained on batched random resized crops."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from dmlkit.data import build_splits
from dmlkit.data.transforms import RandomResizedCropFlip, photo_transforms, photo_view


def write_photos(root, classes=4, per_class=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    for c in range(classes):
        (root / f"class{c}").mkdir(parents=True)
        for i in range(per_class):
            coarse = torch.rand(1, 3, 5, 5, generator=g)
            h, w = 90 + 7 * i, 120 + 11 * c  # every photo its own size and aspect
            pixels = F.interpolate(coarse, size=(h, w), mode="bicubic", align_corners=False).clamp(0, 1)
            Image.fromarray((pixels[0].permute(1, 2, 0) * 255).byte().numpy()).save(root / f"class{c}" / f"{i}.png")


def test_photos_are_decoded_as_the_resize_and_centre_crop_view(tmp_path):
    write_photos(tmp_path)
    splits = build_splits("folder", tmp_path, image_size=64, cache_in_memory=True, center_crop=True, crop_size=48)
    test = splits.test
    assert tuple(test.images.shape[1:]) == (3, 64, 64)
    for row in range(len(test)):
        with Image.open(test.paths[row]) as img:
            img = img.convert("RGB")
            assert img.size != (64, 64)
            # the view by hand: shorter side to round(64 * 256 / 224) = 73 (the longer side truncated, as
            # torchvision's Resize does), then the central 64 x 64
            short = min(img.size)
            w, h = int(img.size[0] * 73 / short), int(img.size[1] * 73 / short)
            resized = img.resize((w, h), Image.BILINEAR)
            left, top = int(round((w - 64) / 2.0)), int(round((h - 64) / 2.0))
            want = torch.from_numpy(__import__("numpy").asarray(resized.crop((left, top, left + 64, top + 64))))
        assert (test.images[row].permute(1, 2, 0).int() - want.int()).abs().max() <= 1
    # the per-item transform of photos on disk gives the same pixels (before normalisation)
    view = photo_transforms(None, 64, 48)[1]
    with Image.open(test.paths[0]) as img:
        per_item = view(img.convert("RGB"))
    assert torch.allclose(per_item, test.images[0].float() / 255, atol=1 / 255 + 1e-6)


def test_random_resized_crop_with_full_area_is_the_resized_image_or_its_mirror():
    images = torch.rand(16, 3, 20, 20)
    crop = RandomResizedCropFlip(10, scale=(1.0, 1.0), ratio=(1.0, 1.0))
    out = crop(images, torch.Generator().manual_seed(0))
    assert out.shape == (16, 3, 10, 10)
    plain = F.interpolate(images, size=(10, 10), mode="bilinear", align_corners=False)
    same = (out - plain).abs().amax(dim=(1, 2, 3)) < 1e-5
    mirrored = (out - plain.flip(-1)).abs().amax(dim=(1, 2, 3)) < 1e-5
    assert bool((same | mirrored).all()) and 0 < int(mirrored.sum()) < 16


def test_random_crops_stay_inside_the_image_and_follow_the_generator():
    # an image whose pixels hold their own coordinates: every output pixel must come from inside it
    h = w = 32
    ys, xs = torch.meshgrid(torch.arange(h, dtype=torch.float32), torch.arange(w, dtype=torch.float32), indexing="ij")
    images = torch.stack([ys, xs, torch.zeros_like(ys)]).expand(64, 3, h, w).contiguous()
    crop = RandomResizedCropFlip(8)
    out = crop(images, torch.Generator().manual_seed(1))
    assert out[:, 0].min() >= 0 and out[:, 0].max() <= h - 1 and out[:, 1].min() >= 0 and out[:, 1].max() <= w - 1
    spans = (out[:, 0].amax(dim=(1, 2)) - out[:, 0].amin(dim=(1, 2))) / (h - 1)
    assert spans.min() > 0.2 and spans.max() <= 1.0  # crops of 16-100 % of the area, aspect 3/4-4/3
    assert torch.equal(out, crop(images, torch.Generator().manual_seed(1)))
    assert not torch.equal(out, crop(images, torch.Generator().manual_seed(2)))


def test_bad_crop_parameters_are_named():
    with pytest.raises(ValueError, match="'scale' parameter"):
        RandomResizedCropFlip(8, scale=(0.5, 1.5))
    with pytest.raises(ValueError, match="'size' parameter of RandomResizedCropFlip"):
        RandomResizedCropFlip(0)


def test_photo_view_is_a_centre_crop_of_the_short_side():
    img = Image.new("RGB", (300, 200))
    assert photo_view(112)(img).size == (112, 112)
