"""Paper presets train and evaluate on each paper's own photo pipeline, in memory and on disk.

Built as the trainer builds them (the real :class:`Trainer` from the packaged preset on a fixture tree in
the benchmark's layout; only the backbone is swapped for the small CNN): what reaches the model is checked
against the papers' sizes, and against the paper's evaluation crop done independently with PIL.
"""

from __future__ import annotations

from dataclasses import astuple

import pytest
import torch
from PIL import Image
from torchvision import transforms as T

from dmlkit.config import load_config
from dmlkit.data.transforms import RandomCropFlip, photo_pipeline, tensor_transform
from dmlkit.engine.batches import fetch_batch
from dmlkit.recipe import Trainer

SMALL_MODEL = ["model.name=small_cnn", "model.pretrained=false", "model.weights=null", "model.args={width: 4}", "train.device=cpu",
               "sampler.batch_size=4", "sampler.m=2", "train.progress=false", "train.mixed_precision=none"]


def build(preset: str, root, tmp_path, *extra: str) -> Trainer:
    cfg = load_config(preset=preset, overrides=[f"data.root={root}", *SMALL_MODEL, *extra])
    return Trainer(cfg, tmp_path / "run", echo=lambda _: None)


def paper_eval_view(path: str, resize, crop: int) -> torch.Tensor:
    """The paper's evaluation input as a float image in [0, 1]: resize, then centre crop (torchvision on PIL)."""
    img = T.CenterCrop(crop)(T.Resize(resize)(Image.open(path).convert("RGB")))
    return T.ConvertImageDtype(torch.float32)(T.PILToTensor()(img))


def check_in_memory(trainer: Trainer, crop: int, eval_size: int, stored: int, resize) -> None:
    train, test = trainer.splits.train, trainer.splits.test
    assert train.images is not None and tuple(train.images.shape[-2:]) == (stored, stored)  # the stored view
    images, _ = fetch_batch(train, [0, 0, 0, 0])
    augmented = trainer.augment(images, torch.Generator().manual_seed(0))
    assert tuple(augmented.shape[-2:]) == (crop, crop)
    assert not torch.equal(augmented[0], augmented[1])  # two draws of one training item differ
    first, _ = fetch_batch(test, [0])
    again, _ = fetch_batch(test, [0])
    assert tuple(first.shape[-2:]) == (eval_size, eval_size) and torch.equal(first, again)  # deterministic
    normalise = tensor_transform(getattr(trainer.model, "pretrained_cfg", None)) or (lambda x: x)
    expected = normalise(paper_eval_view(test.paths[0], resize, eval_size)[None])
    torch.testing.assert_close(first, expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize(("preset", "crop", "eval_size"), [("proxy-anchor-cub-paper", 224, 224), ("eps-triplet-cub", 224, 224)])
def test_proxy_anchor_pipeline_presets_crop_224_from_the_256_view(preset, crop, eval_size, cub_factory, tmp_path):
    trainer = build(preset, cub_factory(tmp_path / "cub"), tmp_path)
    assert trainer.cfg.data.pipeline == "proxy_anchor" and trainer.cfg.data.augment == "crop"
    check_in_memory(trainer, crop, eval_size, 256, 256)


def test_asap_presets_train_on_musgrave_crops_and_test_on_the_centre_227(cub_factory, tmp_path):
    root = cub_factory(tmp_path / "cub", classes=(1, 2, 3, 4, 5, 6, 7, 8, 101, 102), per_class=2)
    trainer = build("asap-c2-cub", root, tmp_path)
    assert trainer.cfg.data.pipeline == "musgrave" and trainer.augment.scale == (0.16, 1.0)
    check_in_memory(trainer, 227, 227, 256, 256)
    val, _ = fetch_batch(trainer.splits.val, [0])  # the validation fold is evaluated as the test split
    assert tuple(val.shape[-2:]) == (227, 227)


def test_proxy_nca_presets_resize_to_256_square_and_crop_227(cars_root, tmp_path):
    trainer = build("proxy-nca-cars", cars_root, tmp_path)
    assert isinstance(trainer.augment, RandomCropFlip) and trainer.augment.size == 227
    check_in_memory(trainer, 227, 227, 256, (256, 256))


def test_a_plain_random_crop_copies_pixels_from_inside_the_view():
    view = torch.arange(2 * 3 * 6 * 7, dtype=torch.float32).view(2, 3, 6, 7)
    out = RandomCropFlip(4)(view, torch.Generator().manual_seed(3))
    for b in range(2):
        windows = [view[b, :, i:i + 4, j:j + 4] for i in range(3) for j in range(4)]
        assert any(torch.equal(out[b], w) or torch.equal(out[b], w.flip(-1)) for w in windows)


def test_photos_on_disk_get_the_same_pipeline_per_item(inshop_root, tmp_path):
    trainer = build("dro-topk-inshop", inshop_root, tmp_path)
    train = trainer.splits.train
    assert getattr(train, "images", None) is None and trainer.augment is None  # read per item, augmented per item
    train.set_epoch(0)
    first = train[0][0]
    train.set_epoch(1)
    second = train[0][0]
    assert first.shape[-2:] == (227, 227) and not torch.equal(first, second)  # another draw in another epoch
    query = trainer.splits.query
    a, b = query[0][0], query[0][0]
    assert a.shape[-2:] == (227, 227) and torch.equal(a, b)
    normalise = tensor_transform(getattr(trainer.model, "pretrained_cfg", None)) or (lambda x: x)
    expected = normalise(paper_eval_view(query.paths[0], 256, 227)[None])[0]
    torch.testing.assert_close(a, expected, atol=1e-6, rtol=0)


def test_each_paper_pipeline_states_its_published_sizes():
    assert astuple(photo_pipeline("musgrave", None))[1:7] == (256, False, 256, 227, 227, (0.16, 1.0))
    assert astuple(photo_pipeline("proxy_anchor", None))[1:7] == (256, False, 256, 224, 224, (0.08, 1.0))
    assert astuple(photo_pipeline("proxy_nca", None))[1:7] == (256, True, 256, 227, 227, None)
