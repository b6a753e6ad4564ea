"""Offline EfficientNet-Lite0 ImageNet weights: key mapping and a real classification."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.datasets import load_sample_image

from dmlkit.models import create_model, lite0_imagenet_state_dict, read_state_dict
from dmlkit.models.efficientnet_lite import lite0_weights_path

# ImageNet-1k class indices
PALACE, DAISY = 698, 985


@pytest.fixture(scope="module")
def lite0():
    return create_model("efficientnet_lite0", pretrained=True, embedding_size=8).eval()


@pytest.fixture(scope="module")
def renamed():
    return lite0_imagenet_state_dict()


def test_every_package_tensor_lands_in_timm_efficientnet_lite0(lite0, renamed):
    source = read_state_dict(lite0_weights_path())
    assert len(renamed) == len(source) == 296
    report = lite0.weights_report
    assert report.complete
    assert sorted(report.unexpected_keys) == ["classifier.bias", "classifier.weight"]
    timm_state = lite0.trunk.model.state_dict()
    # spot checks of the renaming: first (separable) block, an expanded block, the head
    assert torch.equal(timm_state["blocks.0.0.conv_pw.weight"], source["_blocks.0._project_conv.weight"])
    assert torch.equal(timm_state["blocks.5.3.conv_dw.weight"], source["_blocks.14._depthwise_conv.weight"])
    assert torch.equal(timm_state["blocks.2.1.bn3.running_var"], source["_blocks.4._bn2.running_var"])
    assert torch.equal(timm_state["bn2.weight"], source["_bn1.weight"])


def test_pretrained_cfg_is_the_tensorflow_one(lite0):
    cfg = lite0.pretrained_cfg
    assert cfg["scale"] == 255.0 and cfg["mean"] == (127.0,) * 3 and cfg["std"] == (128.0,) * 3
    assert cfg["color"] == "RGB" and cfg["input_size"] == (3, 224, 224)


def _center_crop(name: str) -> torch.Tensor:
    image = torch.from_numpy(np.array(load_sample_image(name), copy=True)).permute(2, 0, 1)
    _, h, w = image.shape
    side = min(h, w)
    top, left = (h - side) // 2, (w - side) // 2
    return image[:, top : top + side, left : left + side].unsqueeze(0)


def test_classifies_sklearn_sample_images(lite0, renamed):
    images = torch.cat([_center_crop("china.jpg"), _center_crop("flower.jpg")])
    x = lite0.preprocess(images, resize=True)  # uint8 RGB -> the model's own input convention
    with torch.no_grad():
        logits = F.linear(lite0.features(x), renamed["classifier.weight"], renamed["classifier.bias"])
    top5 = logits.topk(5).indices.tolist()
    assert PALACE in top5[0], top5[0]
    assert DAISY in top5[1], top5[1]


def test_imagenet_normalisation_would_be_the_silent_bug(lite0, renamed):
    """pretrained=True switches to the package's TF scaling; without it timm's ImageNet default stays."""
    default_cfg = create_model("efficientnet_lite0").pretrained_cfg
    assert default_cfg["scale"] == 1.0 and lite0.pretrained_cfg["scale"] == 255.0
    assert default_cfg["mean"] != lite0.pretrained_cfg["mean"]
