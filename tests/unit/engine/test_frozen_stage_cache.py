"""train.feature_cache: the frozen stages' output for V augmented views of every training image, computed once.

Training from it gives the full forward pass's loss and gradients for the same crops (fp32); the cache is
deterministic for a seed, V views of bf16 ``[N, V, h, w, C]``; ``auto`` turns itself off with a reason
where it cannot apply, ``on`` there is a ConfigError."""

from __future__ import annotations

import pytest
import torch

from dmlkit.config import config_from_dict
from dmlkit.core.seeds import derive_generator
from dmlkit.data.base import TensorImageDataset
from dmlkit.data.transforms import RandomResizedCropFlip
from dmlkit.engine.frozen_stage_cache import BUILD_BATCH, FrozenFeatureCache
from dmlkit.exceptions import ConfigError
from dmlkit.losses import ProxyAnchorLoss
from dmlkit.models import EmbedderEnsemble, create_model
from dmlkit.recipe.feature_cache_plan import cache_choices, plan_feature_cache

CROP = 48


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return create_model("efficientnet_lite0", pretrained=True, frozen_stages=2, freeze_bn=True, pooling="gem",
                        embedding_size=None, head_init="identity").train()


def photos(n: int = 12, side: int = 64, classes: int = 3) -> TensorImageDataset:
    g = torch.Generator().manual_seed(5)
    images = torch.randint(0, 256, (n, 3, side, side), dtype=torch.uint8, generator=g)
    return TensorImageDataset(images, torch.arange(n) % classes, [f"c{i}" for i in range(classes)])


def config(**train):
    return config_from_dict({"model": {"name": "efficientnet_lite0", "frozen_stages": 2, "freeze_bn": True},
                             "data": {"augment": "crop", "crop_size": CROP}, "sampler": {"batch_size": 4, "m": 2},
                             "train": {"max_steps": 9, **train}})


def test_training_from_the_cache_gives_the_full_forward_passes_loss_and_gradients_for_the_same_crops(model):
    data, augment = photos(), RandomResizedCropFlip(CROP)
    cache = FrozenFeatureCache.build(model, data, augment, views=1, seed=3, dtype=torch.float32, echo=lambda _: None)
    assert len(data) <= BUILD_BATCH  # one batch: view 0 is the crop stream's first draw for all images
    crops = augment(data.get_batch(torch.arange(len(data)))[0], derive_generator(3, "feature cache view", 0))
    rows = torch.tensor([7, 1, 4, 10, 2, 5])
    labels = data.labels[rows]
    loss_fn = ProxyAnchorLoss(num_classes=3, embedding_size=model.embedding_size)
    results = []
    for forward in (lambda: model(crops[rows]),
                    lambda: model.forward_from_prefix(cache.features(rows, torch.Generator().manual_seed(0)))):
        model.zero_grad(set_to_none=True)
        loss_fn.zero_grad(set_to_none=True)
        loss = loss_fn(forward(), labels)
        loss.backward()
        named = [*model.named_parameters(), *loss_fn.named_parameters()]
        results.append((loss.detach(), {n: p.grad.clone() for n, p in named if p.requires_grad}))
    (full_loss, full), (cached_loss, cached) = results
    torch.testing.assert_close(cached_loss, full_loss)
    assert full.keys() == cached.keys()
    for name in full:
        torch.testing.assert_close(cached[name], full[name], msg=name)


def test_the_cache_is_deterministic_for_a_seed_with_distinct_bf16_views_of_the_training_crops(model):
    data, augment = photos(n=10), RandomResizedCropFlip(CROP)
    build = lambda seed: FrozenFeatureCache.build(model, data, augment, views=3, seed=seed,  # noqa: E731
                                                  echo=lambda _: None)
    cache = build(7)
    assert cache.storage.dtype == torch.bfloat16 and cache.storage.is_contiguous()
    assert cache.storage.shape == (10, 3, CROP // 4, CROP // 4, 24)  # [N, V, h, w, C]: blocks.1 of Lite0 at 1/4
    assert cache.views == 3 and cache.nbytes == cache.storage.numel() * 2
    assert torch.equal(build(7).storage, cache.storage)  # a resumed run rebuilds the same cache
    assert not torch.equal(build(8).storage, cache.storage)
    for v in range(3):
        for w in range(v + 1, 3):
            assert not torch.equal(cache.storage[:, v], cache.storage[:, w])
        crops = augment(data.get_batch(torch.arange(10))[0], derive_generator(7, "feature cache view", v))
        expected = model.prefix(crops).permute(0, 2, 3, 1).to(torch.bfloat16)
        torch.testing.assert_close(cache.storage[:, v], expected, rtol=0, atol=0)


def test_on_a_cpu_the_frozen_stages_run_in_chunks_and_store_what_whole_batches_give(model, monkeypatch):
    import dmlkit.engine.frozen_stage_cache as feature_cache

    data, augment = photos(n=11), RandomResizedCropFlip(CROP)
    calls = []
    monkeypatch.setattr(feature_cache, "chunk_for", lambda *args: calls.append(args[2].shape) or 4)
    sizes, prefix = [], model.prefix
    monkeypatch.setattr(model, "prefix", lambda images: sizes.append(len(images)) or prefix(images))
    chunked = FrozenFeatureCache.build(model, data, augment, views=2, seed=3, dtype=torch.float32, echo=lambda _: None)
    monkeypatch.setattr(model, "prefix", prefix)
    assert calls == [(1, 3, CROP, CROP)]  # asked once, with one image of the first batch
    assert sizes == [4, 4, 3] * 2  # 11 images in chunks of 4, for each of the 2 views
    monkeypatch.setattr(feature_cache, "chunk_for", lambda *args: BUILD_BATCH)
    whole = FrozenFeatureCache.build(model, data, augment, views=2, seed=3, dtype=torch.float32, echo=lambda _: None)
    torch.testing.assert_close(chunked.storage, whole.storage, rtol=1e-5, atol=1e-5)


def test_chunks_keep_the_largest_activation_within_the_chunk_bytes():
    from dmlkit.models.inference_copy import CHUNK_BYTES, chunk_for

    widen = torch.nn.Sequential(torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.MaxPool2d(2))
    image = torch.zeros(1, 3, 100, 100)
    largest = 64 * 100 * 100  # the convolution's output per image, larger than the pooled one
    assert chunk_for(widen, widen, image) == CHUNK_BYTES // (largest * 4)
    assert chunk_for(widen, widen, image, torch.bfloat16) == CHUNK_BYTES // (largest * 2)
    assert chunk_for(widen, widen, torch.zeros(1, 3, 2000, 2000)) == 1  # never fewer than one image
    assert not widen._forward_hooks and not widen[0]._forward_hooks  # the hooks are removed


def test_a_batch_takes_one_stored_view_per_image_by_the_generator(model):
    data = photos(n=10)
    cache = FrozenFeatureCache.build(model, data, RandomResizedCropFlip(CROP), views=4, seed=0, echo=lambda _: None)
    rows = torch.tensor([3, 3, 9, 0, 5] * 8)
    batch = cache.features(rows, torch.Generator().manual_seed(1))
    assert batch.shape == (40, 24, CROP // 4, CROP // 4) and batch.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(batch, cache.features(rows, torch.Generator().manual_seed(1)))
    chosen = []
    for row, features in zip(rows.tolist(), batch):
        matches = [v for v in range(4) if torch.equal(features.permute(1, 2, 0), cache.storage[row, v])]
        assert len(matches) == 1
        chosen.append(matches[0])
    assert set(chosen) == {0, 1, 2, 3}
    rows_only, labels = cache.batch_source().get_batch([4, 2])  # the batch stream reads labels, no image
    assert rows_only.tolist() == [4, 2] and torch.equal(labels, data.labels[[4, 2]])


def test_auto_caches_about_one_view_per_planned_epoch_and_fewer_under_the_memory_cap(model):
    data, lines = photos(), []
    per_image = 24 * (CROP // 4) ** 2 * 2 * len(data)  # one bf16 view of every image
    cfg = config()  # 9 steps x 4 images / 12 images: 3 epochs
    plan = plan_feature_cache(cfg, model, data, RandomResizedCropFlip(CROP), echo=lines.append)
    chosen = {field: value for field, (value, _) in cache_choices(cfg, plan).items()}
    assert plan.enabled and plan.views == 3 and chosen == {"train.feature_cache": "on", "train.cache_views": 3}
    assert (cfg.train.feature_cache, cfg.train.cache_views) == ("auto", None)  # read, never written
    assert lines[0].startswith("recipe:   train.feature_cache = on  (the stem and 2 frozen stages run once, on 3")
    plan = plan_feature_cache(config(max_steps=900), model, data, RandomResizedCropFlip(CROP), cap=per_image * 5,
                              echo=lines.append)
    assert plan.enabled and plan.views == 5  # 8 wanted, 5 fit
    assert plan_feature_cache(config(cache_views=6), model, data, None, echo=lines.append).views == 6


@pytest.mark.parametrize("change, reason", [
    (dict(frozen_stages=0), "model.frozen_stages=0"),
    (dict(ensemble=3), "model.ensemble=3"),
    (dict(augment="translate"), "data.augment=translate"),
    (dict(cap=1000), "more than the cap of"),
    (dict(on_disk=True), "not held in memory"),
    (dict(freeze_bn=False), "model.freeze_bn=False"),
])
def test_auto_turns_off_with_the_reason_and_on_raises_a_config_error_naming_it(model, change, reason):
    data = photos()
    members = [create_model("efficientnet_lite0", embedding_size=8, frozen_stages=change.get("frozen_stages", 2),
                            freeze_bn=change.get("freeze_bn", True)) for _ in range(change.get("ensemble", 1))]
    net = EmbedderEnsemble(members) if len(members) > 1 else members[0]
    if change.get("on_disk"):
        data.images = None
    for mode in ("auto", "on"):
        cfg = config(feature_cache=mode)
        cfg.model.ensemble = change.get("ensemble")
        cfg.data.augment = change.get("augment", "crop")
        lines = []
        run = lambda: plan_feature_cache(cfg, net, data, None, cap=change.get("cap"), echo=lines.append)  # noqa: E731
        if mode == "on":
            with pytest.raises(ConfigError, match=f"train.feature_cache=on, but .*{reason}"):
                run()
            continue
        plan = run()
        assert not plan.enabled and reason in plan.reason and cfg.train.feature_cache == "auto"  # never written
        assert cache_choices(cfg, plan) == {"train.feature_cache": ("off", plan.reason)}
        assert lines == [f"recipe:   train.feature_cache = off  ({plan.reason})"]


def test_explicit_views_over_the_cap_name_train_cache_views_and_off_is_quiet(model):
    with pytest.raises(ConfigError, match="8 views of 12 training images need .*set fewer train.cache_views"):
        plan_feature_cache(config(feature_cache="on", cache_views=8), model, photos(), None, cap=10_000)
    lines = []
    assert not plan_feature_cache(config(feature_cache="off"), model, photos(), None, echo=lines.append).enabled
    assert lines == []


@pytest.mark.parametrize("train, message", [
    ({"feature_cache": "always"}, "train.feature_cache must be one of {'auto', 'on', 'off'}. Got 'always'"),
    ({"cache_views": 0}, "train.cache_views must be None or an int >= 1. Got 0"),
])
def test_the_config_fields_are_validated(train, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict({"train": train})


def test_a_build_out_of_time_keeps_the_views_built_so_far_and_says_so(model):
    """Views are built one after the other; once the time budget's share is spent the views so far are kept, the
    same as a cache of that many views (each view's crops come from the seed alone)."""
    data, augment = photos(n=70), RandomResizedCropFlip(CROP)  # two chunks a view: the draws run on across them
    said: list[str] = []
    asked: list[int] = []
    cut = FrozenFeatureCache.build(model, data, augment, views=3, seed=3, dtype=torch.float32, echo=said.append,
                                   out_of_time=lambda seconds: asked.append(seconds) or True)
    whole = FrozenFeatureCache.build(model, data, augment, views=1, seed=3, dtype=torch.float32, echo=lambda _: None)
    assert cut.views == 1 and len(asked) == 1 and asked[0] > 0 and torch.equal(cut.storage, whole.storage)
    three = FrozenFeatureCache.build(model, data, augment, views=3, seed=3, dtype=torch.float32, echo=lambda _: None)
    assert three.views == 3 and torch.equal(three.storage[:, :1], whole.storage)
    assert "feature cache: 1 of 3 views" in said[1] and said[2].startswith("feature cache: stopped after 1 of 3 views")
