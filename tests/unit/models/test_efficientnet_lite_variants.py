"""Offline EfficientNet-Lite0/1/2 ImageNet weights: every tensor lands, and the ImageNet classifier
recognises cats and dogs in real Oxford-IIIT Pets photos (a wrong key mapping or input scaling fails)."""

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from dmlkit.models import create_model, lite_imagenet_state_dict, read_state_dict
from dmlkit.models.efficientnet_lite import LITE_VARIANTS, lite_weights_path

PETS = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "pets" / "images"
# ImageNet-1k: dog breeds 151..268, domestic cats 281..285
DOGS, CATS = range(151, 269), range(281, 286)


def _pet_photos(count: int = 8) -> torch.Tensor:
    """The first photo of every fifth breed (cats and dogs), centre-cropped to a 256-px uint8 square."""
    breeds = sorted(p for p in PETS.iterdir() if p.is_dir())[::5][:count]
    images = []
    for breed in breeds:
        image = Image.open(sorted(breed.iterdir())[0]).convert("RGB")
        w, h = image.size
        side = min(w, h)
        left, top = (w - side) // 2, (h - side) // 2
        image = image.crop((left, top, left + side, top + side)).resize((256, 256), Image.BICUBIC)
        images.append(torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1))
    return torch.stack(images)


@pytest.fixture(scope="module")
def photos():
    return _pet_photos()


@pytest.mark.parametrize("index", [0, 1, 2])
def test_every_tensor_loads_and_pets_are_cats_and_dogs(index, photos):
    model = create_model(f"efficientnet_lite{index}", pretrained=True, embedding_size=8).eval()
    report = model.weights_report
    assert report.complete and not report.missing_keys
    assert sorted(report.unexpected_keys) == ["classifier.bias", "classifier.weight"]
    source = read_state_dict(lite_weights_path(index))
    renamed = lite_imagenet_state_dict(index)
    assert len(renamed) == len(source) == len(model.trunk.model.state_dict()) + 2  # + the classifier
    size = LITE_VARIANTS[index].input_size
    cfg = model.pretrained_cfg
    assert cfg["input_size"] == (3, size, size) and cfg["scale"] == 255.0 and cfg["interpolation"] == "bicubic"
    assert cfg["mean"] == (127.0,) * 3 and cfg["std"] == (128.0,) * 3
    with torch.no_grad():
        logits = F.linear(model.features(model.preprocess(photos, resize=True)),
                          renamed["classifier.weight"], renamed["classifier.bias"])
    predicted = logits.argmax(dim=1).tolist()
    pets = [c in DOGS or c in CATS for c in predicted]
    assert sum(pets) >= 6, predicted


def test_lite1_and_lite2_map_the_deeper_block_layout():
    """21 flat blocks: block 20 is the last stage's only block, block 14 the last of stage 4."""
    source = read_state_dict(lite_weights_path(2))
    renamed = lite_imagenet_state_dict(2)
    assert torch.equal(renamed["blocks.6.0.conv_pwl.weight"], source["_blocks.20._project_conv.weight"])
    assert torch.equal(renamed["blocks.4.3.bn2.running_mean"], source["_blocks.14._bn1.running_mean"])
    assert torch.equal(renamed["blocks.0.0.conv_pw.weight"], source["_blocks.0._project_conv.weight"])
