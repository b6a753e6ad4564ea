"""FeatureStore: pooled features of a frozen backbone computed once per key, read back, trained on with dmlkit.fit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from dmlkit.engine.pooled_feature_store import (
    FeatureDataset,
    FeatureStore,
    centre_view,
    images_fingerprint,
    pooled_features,
    weights_fingerprint,
)
from dmlkit.exceptions import DataError, InvalidParameterError
from dmlkit.models import Embedder, FeatureHead, GlobalPool, make_cfg


class _Trunk(nn.Module):
    """A fixed 3x3 convolution with an asymmetric kernel (its features differ between an image and its mirror)."""

    def __init__(self, channels: int = 4):
        super().__init__()
        self.conv = nn.Conv2d(3, channels, 3, bias=False)
        with torch.no_grad():
            self.conv.weight.copy_(torch.linspace(-1, 1, self.conv.weight.numel()).view_as(self.conv.weight))
        self.num_features = channels
        self.pretrained_cfg = make_cfg(mean=(0.5, 0.4, 0.3), std=(0.2, 0.25, 0.3), input_size=(3, 16, 16), color="RGB")
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.conv(x)


def _stub() -> Embedder:
    trunk = _Trunk()
    return Embedder(trunk, GlobalPool("avg"), nn.Identity(), "none")


def _images(n: int = 5, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (n, 3, 20, 30), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)


def test_centre_view_resizes_the_shorter_side_and_crops_the_centre():
    """A horizontal ramp 20 x 40: the 16-px view keeps the middle columns (ramp values around 0.5), square, in [0, 1]."""
    ramp = torch.linspace(0, 1, 40).expand(3, 20, 40)
    view = centre_view(ramp, 16)
    assert view.shape == (3, 16, 16)
    # shorter side 20 -> round(16 / 0.875) = 18, width 36: columns 10..25 of 36 kept, i.e. ramp values ~0.28..0.72
    middle = view[0, 8]
    assert 0.2 < float(middle[0]) < 0.35 and 0.65 < float(middle[-1]) < 0.8
    assert abs(float(view.mean()) - 0.5) < 0.01
    grey = centre_view(torch.full((1, 30, 30), 255, dtype=torch.uint8), 16)
    assert grey.shape == (3, 16, 16) and torch.allclose(grey, torch.ones_like(grey))


def test_pooled_features_match_a_float64_reference_with_the_mirror_view():
    """views=2: the average of the pooled conv features of the image and its mirror, against float64 conv2d."""
    model = _stub()
    images = _images()
    got = pooled_features(model, images, image_size=16, views=2, echo=lambda s: None)
    mean = torch.tensor((0.5, 0.4, 0.3), dtype=torch.float64).view(1, 3, 1, 1)
    std = torch.tensor((0.2, 0.25, 0.3), dtype=torch.float64).view(1, 3, 1, 1)
    x = (torch.stack([centre_view(im, 16) for im in images]).double() - mean) / std
    w = model.trunk.conv.weight.double()
    want = (torch.nn.functional.conv2d(x, w).mean((2, 3)) + torch.nn.functional.conv2d(x.flip(-1), w).mean((2, 3))) / 2
    assert got.dtype == torch.float32 and got.shape == (5, 4)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    one = pooled_features(model, images, image_size=16, views=1, echo=lambda s: None)
    assert not torch.allclose(one, got)  # the mirror changes this trunk's features
    with pytest.raises(InvalidParameterError, match="'views' parameter of pooled_features"):
        pooled_features(model, images, image_size=16, views=3)


def test_store_computes_once_then_reads_back(tmp_path):
    """The second call with the same key runs no forward pass and returns the same features; a new key recomputes."""
    model = _stub()
    store = FeatureStore(tmp_path / "store")
    names = ["b", "a", "b", "c", "a"]
    first = store.features(model, "stub", _images(), names, image_size=16, echo=lambda s: None)
    calls = model.trunk.calls
    again = store.features(model, "stub", _images(), names, image_size=16, echo=lambda s: None)
    assert model.trunk.calls == calls
    torch.testing.assert_close(again.features, first.features, rtol=0, atol=0)
    assert [p.name for p in (tmp_path / "store").iterdir()] == [p.name for p in (tmp_path / "store").glob("stub-16px-v1-avg-*.pt")]
    store.features(model, "stub", _images(), names, image_size=12, echo=lambda s: None)
    assert model.trunk.calls > calls and len(list((tmp_path / "store").iterdir())) == 2
    calls = model.trunk.calls
    with torch.no_grad():
        model.trunk.conv.weight.mul_(2)  # other weights: another key
    store.features(model, "stub", _images(), names, image_size=16, echo=lambda s: None)
    assert model.trunk.calls > calls


def test_fingerprints_follow_weights_images_and_labels(tmp_path):
    a, b = _stub(), _stub()
    assert weights_fingerprint(a) == weights_fingerprint(b)
    with torch.no_grad():
        b.trunk.conv.weight[0, 0, 0, 0] += 1e-3
    assert weights_fingerprint(a) != weights_fingerprint(b)
    images = _images()
    assert images_fingerprint(images, list("abcde")) != images_fingerprint(images, list("abcdd"))
    assert images_fingerprint(images, list("abcde")) != images_fingerprint(_images(seed=1), list("abcde"))
    path = tmp_path / "x.png"
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(path)
    before = images_fingerprint([str(path)], ["a"])
    Image.fromarray(np.zeros((9, 8, 3), np.uint8)).save(path)
    assert images_fingerprint([str(path)], ["a"]) != before
    with pytest.raises(DataError, match="images has 5 entries but names has 4"):
        images_fingerprint(images, list("abcd"))


def test_feature_dataset_items_labels_and_subsets():
    features = torch.arange(12.0).view(4, 3)
    data = FeatureDataset(features, ["dog", "cat", "dog", "eel"])
    assert data.class_names == ["cat", "dog", "eel"]
    assert data.labels.tolist() == [1, 0, 1, 2] and data.labels.dtype == torch.int64
    item, label = data[2]
    assert item.shape == (3, 1, 1) and label == 1 and torch.equal(item.flatten(), features[2])
    part = data.subset([2, 3])
    assert part.class_names == ["dog", "eel"] and part.labels.tolist() == [0, 1]
    assert data.sample_images(2).shape == (2, 3, 1, 1)
    from dmlkit.data.user import UserDataset

    # the recipe's first look through dmlkit.fit's wrapper: the stored features as they are, not resized to 64 px
    assert torch.equal(UserDataset(data).sample_images(4), features[:, :, None, None])
    with pytest.raises(DataError, match="features has 4 rows but names has 3"):
        FeatureDataset(features, ["a", "b", "c"])


def test_feature_head_normalises_and_validates():
    head = FeatureHead(6, 3)
    out = head(torch.randn(5, 6, 1, 1))
    assert out.shape == (5, 3)
    torch.testing.assert_close(out.norm(dim=1), torch.ones(5))
    bounded = FeatureHead(6, 3, "bounded")(torch.randn(5, 6) * 100)
    assert float(bounded.detach().norm(dim=1).max()) <= 1 + 1e-6
    with pytest.raises(InvalidParameterError, match="'normalization' parameter of FeatureHead"):
        FeatureHead(6, 3, "l1")


def test_fit_trains_a_head_on_stored_features(tmp_path):
    """dmlkit.fit on FeatureDatasets: the head learns well-separated synthetic features of unseen classes."""
    import dmlkit

    g = torch.Generator().manual_seed(0)
    centres = torch.randn(12, 16, generator=g) * 3
    names = [f"c{c:02d}" for c in range(12) for _ in range(10)]
    x = centres.repeat_interleave(10, 0) + torch.randn(120, 16, generator=g)
    data = FeatureDataset(x, names)
    train, val, test = data.subset(range(0, 60)), data.subset(range(60, 80)), data.subset(range(80, 120))
    torch.manual_seed(0)
    result = dmlkit.fit(FeatureHead(16, 8), None, train, val_data=val, test_data=test, out=tmp_path / "run",
                        report=False, echo=lambda s: None, config={"loss": {"name": "proxy_anchor"}},
                        train={"max_steps": 30, "eval_every": 15, "progress": False},
                        sampler={"batch_size": 24, "m": 4}, seed=0)
    assert result.selected_on == "val"
    assert result.test_metrics["precision_at_1"] > 0.9
